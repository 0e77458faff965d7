// dppo plugin: the library's one exported symbol over rl::losses::Dppo.
#include "dppo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Dppo>(
    "org.rl.loss.dppo", "dppo", "1.0.0",
    "prime-rl's default loss: DPPO-Binary-TV trust-region mask plus a squared-log-ratio KL, "
    "with optional ce and ref_kl components",
    rl::sdk::loss::kStopGradientFeatures))
