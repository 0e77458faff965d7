// ipo plugin: the library's one exported symbol over rl::losses::Ipo.
#include "ipo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Ipo>(
    "org.rl.loss.ipo", "ipo", "1.0.0",
    "prime-rl's ipo loss: symmetric probability-difference trust region plus a "
    "squared-log-ratio KL, with optional ce and ref_kl components",
    rl::sdk::loss::kStopGradientFeatures))
