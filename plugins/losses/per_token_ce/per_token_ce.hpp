// per_token_ce: causallm_loss that also emits the per-token tensors `logprobs`
// and `elementwise_loss` (0 on ignored tokens), e.g. to compute reference or
// proximal logprobs with a forward-only call.
#pragma once

#include "../common/cross_entropy.hpp"

namespace rl::losses {

class PerTokenCe : public CrossEntropy {
public:
    explicit PerTokenCe(Params &p) : CrossEntropy(p, true) {}
};

} // namespace rl::losses
