// sapo plugin: the library's one exported symbol over rl::losses::Sapo.
#include "sapo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::Sapo>(
    "org.rl.loss.sapo", "sapo", "1.0.0",
    "SAPO: sigmoid-gated soft clipping with temperatures for positive and negative advantages"))
