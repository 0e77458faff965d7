// per_token_ce: causallm_loss that also emits the per-token tensors `logprobs`
// and `elementwise_loss` (0 on ignored tokens), e.g. to compute reference or
// proximal logprobs with a forward-only call.
#pragma once

#include <rl/sdk/loss.hpp>

namespace rl::losses {

class PerTokenCe : public rl::sdk::loss::CrossEntropyLoss {
public:
    explicit PerTokenCe(rl::sdk::Params &p) : CrossEntropyLoss(p, true) {}
};

} // namespace rl::losses
