// gspo plugin: the library's one exported symbol over rl::losses::Gspo.
#include "gspo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Gspo>(
    "org.rl.loss.gspo", "gspo", "1.0.0",
    "GSPO: clipped sequence-level (geometric mean) importance ratio"))
