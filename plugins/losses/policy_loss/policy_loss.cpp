// policy_loss plugin: the library's one exported symbol over rl::losses::PolicyLoss.
#include "policy_loss.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::PolicyLoss>(
    "org.rl.loss.policy_loss", "policy_loss", "1.0.0",
    "PPO clipped surrogate with asymmetric / dual clip, IcePop, TIS, KL and entropy terms"))
