// causallm_loss: mean next-token cross-entropy over label tokens (SFT).
#pragma once

#include <rl/sdk/loss.hpp>

namespace rl::losses {

class CausalLmLoss : public rl::sdk::loss::CrossEntropyLoss {
public:
    explicit CausalLmLoss(rl::sdk::Params &p) : CrossEntropyLoss(p, false) {}
};

} // namespace rl::losses
