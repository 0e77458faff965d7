// tests/losses/loss_run_once.hpp: one run of a loss plugin class through the
// SDK test host (the C++ path of production), shared by the loss tests and the
// peer vectors (tests/peers), which both map inputs onto our plugin classes.
#pragma once

#include <rl/sdk/testing.hpp>

#include <string>

namespace rl::losses::test {

// Loss L created with `params` run once on `in`; when it refuses the params,
// a run with the create status and error.
template <class L>
rl::sdk::testing::LossRun run_once(const std::string &params,
                                   const rl::sdk::testing::LossInputs &in, bool want_grads = true) {
    rl::sdk::testing::Host host;
    rl::sdk::testing::Instance<L> inst(host, params);
    if (!inst.ok()) {
        rl::sdk::testing::LossRun r;
        r.status = inst.status();
        r.error = inst.error();
        return r;
    }
    return rl::sdk::testing::run_loss(inst, in, want_grads);
}

} // namespace rl::losses::test
