// clip_cov plugin: the library's one exported symbol over rl::losses::ClipCov.
#include "clip_cov.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::ClipCov>(
    "org.rl.loss.clip_cov", "clip_cov", "1.0.0",
    "Clip-Cov: PPO that drops a few high-covariance tokens from the gradient"))
