// The fixed cases of loss_fixtures.h (also run through the C ABI by
// loss_c_abi_test.c): the C++ path still produces the recorded numbers, and the
// recorded loss and metrics agree with the direct formulas.
#include "loss_fixtures.h"
#include "loss_reference.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace rl::losses::test {
namespace {

Batch batch_of(const lf_case &c) {
    Batch b;
    b.cu.assign(c.cu_seqlens, c.cu_seqlens + c.n_cu);
    b.global_tokens = c.global_tokens;
    b.global_seqs = c.global_seqs;
    for (int i = 0; i < c.n_inputs; ++i) {
        const lf_tensor &x = c.inputs[i];
        if (x.is_int) {
            b.labels.assign(x.i, x.i + c.n_tokens);
            b.has_labels = true;
        } else {
            b.f[x.name].assign(x.f, x.f + c.n_tokens);
        }
    }
    return b;
}

bool close(double got, double want) {
    return std::fabs(got - want) <= 1e-12 * (1 + std::fabs(want));
}

// `got` holds exactly the `n` recorded tensors `want`, each of its `n_tokens`
// values close to the recorded one.
template <class Map>
void expect_recorded(const Map &got, const lf_tensor *want, int n, int64_t n_tokens) {
    EXPECT_EQ(int(got.size()), n);
    for (int i = 0; i < n; ++i) {
        const auto it = got.find(want[i].name);
        ASSERT_TRUE(it != got.end()) << want[i].name;
        for (int64_t t = 0; t < n_tokens; ++t)
            EXPECT_TRUE(close(it->second[t], want[i].f[t])) << want[i].name << " " << t;
    }
}

TEST(LossFixtures, CppPathReproducesTheRecordedNumbers) {
    ASSERT_GT(LF_N_CASES, 0);
    for (int k = 0; k < LF_N_CASES; ++k) {
        const lf_case &c = lf_cases[k];
        SCOPED_TRACE(std::string(c.name) + " " + c.params);
        with_loss(c.name, [&](auto tag) {
            using L = typename decltype(tag)::type;
            T::Host host;
            T::Instance<L> inst(host, c.params);
            ASSERT_TRUE(inst.ok()) << inst.error();
            const T::LossRun run = T::run_loss(inst, batch_of(c).inputs());
            ASSERT_EQ(run.status, RL_OK) << run.error;
            EXPECT_TRUE(close(run.loss, c.loss)) << run.loss << " vs " << c.loss;
            expect_recorded(run.grads, c.grads, c.n_grads, c.n_tokens);
            expect_recorded(run.tensors, c.outputs, c.n_outputs, c.n_tokens);
            EXPECT_EQ(int(run.metrics.size()), c.n_metrics);
            for (int i = 0; i < c.n_metrics; ++i)
                EXPECT_TRUE(close(run.metric(c.metrics[i].name), c.metrics[i].value))
                    << c.metrics[i].name;
        });
    }
}

TEST(LossFixtures, RecordedNumbersAgreeWithTheFormulas) {
    for (int k = 0; k < LF_N_CASES; ++k) {
        const lf_case &c = lf_cases[k];
        SCOPED_TRACE(std::string(c.name) + " " + c.params);
        const Batch b = batch_of(c);
        const RefResult want = reference(c.name, b, c.params).value();
        EXPECT_TRUE(close(c.loss, want.loss)) << c.loss << " vs formula " << want.loss;
        EXPECT_EQ(size_t(c.n_metrics), want.metrics.size());
        for (int i = 0; i < c.n_metrics; ++i) {
            ASSERT_TRUE(want.metrics.count(c.metrics[i].name)) << c.metrics[i].name;
            EXPECT_TRUE(close(c.metrics[i].value, want.metrics.at(c.metrics[i].name)))
                << c.metrics[i].name;
        }
        // per_token_ce's outputs: logprobs and -logprobs on label tokens, 0 elsewhere.
        for (int i = 0; i < c.n_outputs; ++i) {
            const auto m = ref::loss_tokens(b, true);
            const bool is_loss = std::string(c.outputs[i].name) == "elementwise_loss";
            for (int64_t t = 0; t < c.n_tokens; ++t) {
                const double w = m[t] ? (is_loss ? -1.0 : 1.0) * b["logprobs"][t] : 0.0;
                EXPECT_EQ(c.outputs[i].f[t], w) << c.outputs[i].name << " " << t;
            }
        }
    }
}

// Every fixture names a loss plugin of the build. (Losses without a fixture
// still cross the C ABI in loss_abi_parity_test, which runs every plugin.)
TEST(LossFixtures, NameBuiltLosses) {
    for (int k = 0; k < LF_N_CASES; ++k) {
        bool found = false;
        for (const auto &name : loss_names()) found = found || name == lf_cases[k].name;
        EXPECT_TRUE(found) << lf_cases[k].name;
    }
}

} // namespace
} // namespace rl::losses::test
