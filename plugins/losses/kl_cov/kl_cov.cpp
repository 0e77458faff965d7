// kl_cov plugin: the library's one exported symbol over rl::losses::KlCov.
#include "kl_cov.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::KlCov>(
    "org.rl.loss.kl_cov", "kl_cov", "1.0.0",
    "KL-Cov: importance-sampling policy gradient with a |log ratio| penalty on the "
    "highest-covariance tokens"))
