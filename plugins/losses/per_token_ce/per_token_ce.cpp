// per_token_ce plugin: the library's one exported symbol over rl::losses::PerTokenCe.
#include "per_token_ce.hpp"

RL_PLUGIN_DEFINE(rl::sdk::plugin<rl::losses::PerTokenCe>(
    "org.rl.loss.per_token_ce", "per_token_ce", "1.0.0",
    "cross-entropy that also returns per-token logprobs and elementwise_loss"))
