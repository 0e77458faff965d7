// causallm_loss: mean next-token cross-entropy over label tokens (SFT).
#pragma once

#include "../common/cross_entropy.hpp"

namespace rl::losses {

class CausalLmLoss : public CrossEntropy {
public:
    explicit CausalLmLoss(Params &p) : CrossEntropy(p, false) {}
};

} // namespace rl::losses
