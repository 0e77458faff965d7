// gmpo plugin: the library's one exported symbol over rl::losses::Gmpo.
#include "gmpo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Gmpo>(
    "org.rl.loss.gmpo", "gmpo", "1.0.0",
    "GMPO: geometric mean of token ratios clipped in log space, times the sequence advantage"))
