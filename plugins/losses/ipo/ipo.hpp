// ipo: prime-rl's `ipo` loss type, the symmetric variant of dppo: tokens whose
// probability moved by more than ipo_threshold (in absolute terms) since the
// inference policy are masked. See ../dppo/dppo.hpp.
#pragma once

#include "../dppo/dppo.hpp"

namespace rl::losses {

class Ipo : public PrimeRlLoss {
public:
    explicit Ipo(Params &p) : PrimeRlLoss(p, Region::Ipo) {}
};

} // namespace rl::losses
