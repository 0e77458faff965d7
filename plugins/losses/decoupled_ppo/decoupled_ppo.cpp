// decoupled_ppo plugin: the library's one exported symbol over rl::losses::DecoupledPpo.
#include "decoupled_ppo.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::DecoupledPpo>(
    "org.rl.loss.decoupled_ppo", "decoupled_ppo", "1.0.0",
    "AReaL decoupled PPO: clip around the proximal policy, behaviour importance weight"))
