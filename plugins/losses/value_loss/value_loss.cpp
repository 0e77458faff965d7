// value_loss plugin: the library's one exported symbol over rl::losses::ValueLoss.
#include "value_loss.hpp"

RL_PLUGIN_DEFINE(
    rl::sdk::plugin<rl::losses::ValueLoss>("org.rl.loss.value_loss", "value_loss", "1.0.0",
                                           "clipped squared-error value loss for PPO critics"))
