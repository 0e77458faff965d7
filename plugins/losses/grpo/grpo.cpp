// grpo plugin: the library's one exported symbol over rl::losses::GrpoLoss.
#include "grpo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::GrpoLoss>(
    "org.rl.loss.grpo", "grpo", "1.0.0",
    "Surogate / AIPO-style masked importance-sampling loss with teacher and KL terms",
    rl::sdk::loss::kStopGradientFeatures))
