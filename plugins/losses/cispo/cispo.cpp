// cispo plugin: the library's one exported symbol over rl::losses::Cispo.
#include "cispo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Cispo>(
    "org.rl.loss.cispo", "cispo", "1.0.0",
    "CISPO: detached clipped importance weight times logprobs times A",
    rl::sdk::loss::kStopGradientFeatures))
