// tests/filters: the filter plugins through librl, where the host owns
// `enforce` (strips it before create, reports it next to the verdict).
#include "dl_plugin_host.hpp"
#include "runtime_fixture.hpp"

#include <cmath>

namespace {

using rltest::Owned;
using rltest::Result;

struct Rollout {
    Owned<int64_t> ids;
    Owned<double> lps;
    rl_rollout_view_t view{};
    Rollout(std::vector<int64_t> i, std::vector<double> l, int64_t vocab)
        : ids{std::move(i)}, lps{std::move(l)} {
        view.struct_size = sizeof view;
        view.token_ids = ids.view();
        view.logprobs = lps.view();
        view.vocab_size = vocab;
    }
};

TEST(FilterRuntime, HostStripsEnforceAndReportsItWithTheVerdict) {
    rltest::RuntimeFixture rt({"filter-gibberish", "filter-repetition"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *enforced = nullptr, *observed = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "filter", "gibberish",
                                 R"({"enforce": true, "token_id_threshold": 10})", &enforced),
              RL_OK)
        << rl_last_error();
    ASSERT_EQ(rl_instance_create(rt.get(), "filter", "gibberish", R"({"token_id_threshold": 10})",
                                 &observed),
              RL_OK)
        << rl_last_error();
    Rollout bad({3, 50}, {-0.1, -30.0}, 100);
    Result a, b;
    ASSERT_EQ(rl_filter_check(enforced, &bad.view, &a.r), RL_OK) << rl_last_error();
    EXPECT_EQ(a.scalar("flagged"), 1.0);
    EXPECT_EQ(a.scalar("enforce"), 1.0);
    EXPECT_EQ(a.text("reason"), "gibberish");
    EXPECT_EQ(a.metric("gibberish_tokens"), 1.0);
    ASSERT_EQ(rl_filter_check(observed, &bad.view, &b.r), RL_OK) << rl_last_error();
    EXPECT_EQ(b.scalar("flagged"), 1.0);
    EXPECT_EQ(b.scalar("enforce"), 0.0);
    rl_instance_destroy(enforced);
    rl_instance_destroy(observed);
}

TEST(FilterRuntime, CleanRolloutIsNotFlaggedAndBadParameterIsNamed) {
    rltest::RuntimeFixture rt({"filter-repetition"});
    ASSERT_EQ(rt.status(), RL_OK) << rl_last_error();
    rl_instance_t *inst = nullptr;
    ASSERT_EQ(rl_instance_create(rt.get(), "filter", "repetition", R"({"window": 2})", &inst),
              RL_OK)
        << rl_last_error();
    Rollout ok({1, 2, 3}, {std::log(0.999), std::log(0.2), std::log(0.999)}, 10);
    Result r;
    ASSERT_EQ(rl_filter_check(inst, &ok.view, &r.r), RL_OK) << rl_last_error();
    EXPECT_EQ(r.scalar("flagged"), 0.0);
    EXPECT_EQ(r.text("reason"), "");
    rl_instance_destroy(inst);

    rl_instance_t *bad = nullptr;
    EXPECT_EQ(rl_instance_create(rt.get(), "filter", "repetition", R"({"windw": 2})", &bad),
              RL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(rl_last_error()).find("windw"), std::string::npos) << rl_last_error();
}

} // namespace
