// importance_sampling plugin: the library's one exported symbol over
// rl::losses::ImportanceSampling.
#include "importance_sampling.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::ImportanceSampling>(
    "org.rl.loss.importance_sampling", "importance_sampling", "1.0.0",
    "unclipped importance-sampling policy gradient -(ratio * A)"))
