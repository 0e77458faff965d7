// causallm_loss plugin: the library's one exported symbol over rl::losses::CausalLmLoss.
#include "causallm_loss.hpp"

RL_PLUGIN_DEFINE(
    rl::sdk::plugin<rl::losses::CausalLmLoss>("org.rl.loss.causallm_loss", "causallm_loss", "1.0.0",
                                              "next-token cross-entropy over label tokens (SFT)"))
