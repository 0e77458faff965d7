// tests/buffer: the rollout buffer's grouping, staleness and difficulty rules.
#include "rl/core/buffer.hpp"
#include "rl/core/error.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <thread>

namespace {

using rl::core::BufferConfig;
using rl::core::BufferStats;
using rl::core::DropReason;
using rl::core::Group;
using rl::core::Rollout;
using rl::core::RolloutBuffer;

Rollout ro(int64_t group, double reward, int64_t version = 0, size_t n_tokens = 3) {
    Rollout r;
    r.group_id = group;
    r.reward = reward;
    r.policy_version = version;
    r.token_ids.assign(n_tokens, 5);
    r.logprobs.assign(n_tokens, -0.5f);
    r.loss_mask.assign(n_tokens, 1);
    r.loss_mask[0] = 0;
    return r;
}

std::vector<Rollout> group_of(int64_t id, std::vector<double> rewards, int64_t version = 0) {
    std::vector<Rollout> g;
    for (double x : rewards) g.push_back(ro(id, x, version));
    return g;
}

int64_t dropped(const BufferStats &s, const char *reason, bool groups = true) {
    const auto &c = s.dropped.at(reason);
    return groups ? c.groups : c.rollouts;
}

BufferConfig config(size_t group_size = 0) {
    BufferConfig c;
    c.group_size = group_size;
    return c;
}

// ---- grouping ---------------------------------------------------------------------------

TEST(Buffer, GroupCompletesWhenGroupSizeRolloutsArrived) {
    RolloutBuffer buf(config(3));
    buf.push(ro(1, 1.0));
    buf.push(ro(2, 0.0));
    buf.push(ro(1, 0.0));
    EXPECT_EQ(buf.ready_groups(), 0u);
    EXPECT_EQ(buf.pending_groups(), 2u);
    EXPECT_EQ(buf.pending_rollouts(), 3u);
    buf.push(ro(1, 0.5));
    ASSERT_EQ(buf.ready_groups(), 1u);
    std::vector<Group> out = buf.pop_groups(10);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].group_id, 1);
    ASSERT_EQ(out[0].rollouts.size(), 3u);
    EXPECT_EQ(out[0].rollouts[2].reward, 0.5); // arrival order
    EXPECT_DOUBLE_EQ(out[0].mean_reward(), 0.5);
    EXPECT_EQ(out[0].n_tokens(), 9u);
    EXPECT_EQ(buf.pending_groups(), 1u);
}

TEST(Buffer, ExpectGroupSetsAPerGroupSizeAndCloseGroupJudgesWhatArrived) {
    RolloutBuffer buf;
    buf.expect_group(4, 2);
    buf.push(ro(4, 1.0));
    EXPECT_EQ(buf.ready_groups(), 0u);
    buf.push(ro(4, 0.0));
    EXPECT_EQ(buf.ready_groups(), 1u);

    buf.expect_group(5, 4);
    buf.push(ro(5, 1.0));
    buf.push(ro(5, 0.0));
    EXPECT_TRUE(buf.close_group(5)); // two samples failed upstream
    EXPECT_FALSE(buf.close_group(5));
    EXPECT_EQ(buf.ready_groups(), 2u);
    EXPECT_EQ(buf.pop_groups(5)[1].rollouts.size(), 2u);
}

TEST(Buffer, ExpectGroupAfterArrivalsCompletesAtOnce) {
    RolloutBuffer buf(config(8));
    buf.push(ro(1, 1.0));
    buf.push(ro(1, 0.0));
    buf.expect_group(1, 2);
    EXPECT_EQ(buf.ready_groups(), 1u);
}

TEST(Buffer, PushWithoutAKnownGroupSizeIsRefused) {
    RolloutBuffer buf;
    try {
        buf.push(ro(9, 1.0));
        FAIL() << "no throw";
    } catch (const rl::core::Error &e) {
        EXPECT_NE(std::string(e.what()).find("expect_group(9"), std::string::npos) << e.what();
    }
    EXPECT_EQ(buf.pending_groups(), 0u);
}

TEST(Buffer, PushGroupTakesOneWholeGroup) {
    RolloutBuffer buf;
    buf.push_group(group_of(3, {1, 0, 1}));
    EXPECT_EQ(buf.ready_rollouts(), 3u);
    std::vector<Rollout> mixed = group_of(3, {1, 0});
    mixed.push_back(ro(4, 1));
    EXPECT_THROW(buf.push_group(mixed), rl::core::Error);
    EXPECT_THROW(buf.push_group({}), rl::core::Error);
    buf.expect_group(6, 3);
    buf.push(ro(6, 1));
    EXPECT_THROW(buf.push_group(group_of(6, {1, 0})), rl::core::Error);
}

TEST(Buffer, GroupIdIsReusableAfterItsGroupCompleted) {
    RolloutBuffer buf(config(2));
    for (double r : {1.0, 0.0, 0.5, 0.25}) buf.push(ro(1, r));
    std::vector<Group> out = buf.pop_groups(10);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[1].rollouts[0].reward, 0.5);
}

// ---- difficulty -------------------------------------------------------------------------

TEST(BufferDifficulty, AllEqualRewardsAreDroppedAsZeroVariance) {
    RolloutBuffer buf;
    buf.push_group(group_of(1, {1, 1, 1}));
    buf.push_group(group_of(2, {0, 0}));
    buf.push_group(group_of(3, {0.3, 0.3}));
    buf.push_group(group_of(4, {1, 0}));
    EXPECT_EQ(buf.ready_groups(), 1u);
    const BufferStats s = buf.stats();
    EXPECT_EQ(dropped(s, "zero_variance"), 3);
    EXPECT_EQ(dropped(s, "zero_variance", false), 7);
    EXPECT_EQ(s.completed_groups, 4);
    EXPECT_EQ(s.ready_groups, 1);
}

TEST(BufferDifficulty, RewardToleranceWidensAllEqual) {
    BufferConfig c;
    c.reward_tolerance = 0.01;
    RolloutBuffer buf(c);
    buf.push_group(group_of(1, {0.5, 0.505}));
    buf.push_group(group_of(2, {0.5, 0.52}));
    EXPECT_EQ(buf.ready_groups(), 1u);
    EXPECT_EQ(buf.pop_groups(1)[0].group_id, 2);
}

TEST(BufferDifficulty, ZeroVarianceRuleCanBeTurnedOff) {
    BufferConfig c;
    c.drop_zero_variance = false;
    RolloutBuffer buf(c);
    buf.push_group(group_of(1, {1, 1}));
    EXPECT_EQ(buf.ready_groups(), 1u);
}

TEST(BufferDifficulty, ThresholdsAreInclusiveOnTheGroupMean) {
    BufferConfig c;
    c.easy_threshold = 0.75;
    c.hard_threshold = 0.25;
    RolloutBuffer buf(c);
    buf.push_group(group_of(1, {1, 0.5}));  // mean 0.75 -> too easy
    buf.push_group(group_of(2, {1, 0.4}));  // mean 0.7 -> kept
    buf.push_group(group_of(3, {0.5, 0}));  // mean 0.25 -> too hard
    buf.push_group(group_of(4, {0.6, 0}));  // mean 0.3 -> kept
    buf.push_group(group_of(5, {1, 1, 1})); // too easy wins over zero variance
    buf.push_group(group_of(6, {0, 0, 0})); // too hard wins over zero variance
    const BufferStats s = buf.stats();
    EXPECT_EQ(dropped(s, "too_easy"), 2);
    EXPECT_EQ(dropped(s, "too_hard"), 2);
    EXPECT_EQ(dropped(s, "zero_variance"), 0);
    std::vector<Group> out = buf.pop_groups(10);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].group_id, 2);
    EXPECT_EQ(out[1].group_id, 4);
}

TEST(BufferDifficulty, SingletonGroupsAreKeptUnlessMinGroupSizeSaysOtherwise) {
    RolloutBuffer keep;
    keep.push_group(group_of(1, {1}));
    EXPECT_EQ(keep.ready_groups(), 1u); // the all-equal rule needs two rollouts

    BufferConfig c;
    c.min_group_size = 2;
    RolloutBuffer strict(c);
    strict.push_group(group_of(1, {1}));
    strict.push_group(group_of(2, {1, 0}));
    EXPECT_EQ(strict.ready_groups(), 1u);
    EXPECT_EQ(dropped(strict.stats(), "too_small"), 1);
}

TEST(BufferDifficulty, InconsistentConfigIsRefused) {
    BufferConfig c;
    c.easy_threshold = 0.5;
    c.hard_threshold = 0.5;
    EXPECT_THROW(RolloutBuffer{c}, rl::core::Error);
    BufferConfig d;
    d.max_off_policy_steps = -1;
    EXPECT_THROW(RolloutBuffer{d}, rl::core::Error);
    BufferConfig e;
    e.easy_threshold = NAN;
    EXPECT_THROW(RolloutBuffer{e}, rl::core::Error);
    BufferConfig f;
    f.group_size = 2;
    f.min_group_size = 3;
    EXPECT_THROW(RolloutBuffer{f}, rl::core::Error);
}

// ---- staleness --------------------------------------------------------------------------

TEST(BufferStaleness, RolloutMoreThanMaxStepsBehindIsDroppedAtPush) {
    BufferConfig c = config(2);
    c.max_off_policy_steps = 2;
    RolloutBuffer buf(c);
    buf.set_policy_version(10);
    buf.push(ro(1, 1.0, 7)); // 3 behind: stale
    buf.push(ro(1, 0.0, 8)); // 2 behind: fine
    // Arrivals (stale included) complete the group; one rollout is left.
    ASSERT_EQ(buf.ready_groups(), 1u);
    EXPECT_EQ(buf.pop_groups(1)[0].rollouts.size(), 1u);
    const BufferStats s = buf.stats();
    EXPECT_EQ(dropped(s, "stale", false), 1);
    EXPECT_EQ(dropped(s, "stale"), 0);
}

TEST(BufferStaleness, GroupWhoseRolloutsAreAllStaleIsDroppedAsStale) {
    BufferConfig c;
    c.max_off_policy_steps = 1;
    RolloutBuffer buf(c);
    buf.set_policy_version(5);
    buf.push_group(group_of(1, {1, 0}, 3));
    EXPECT_EQ(buf.ready_groups(), 0u);
    EXPECT_EQ(dropped(buf.stats(), "stale"), 1);
    EXPECT_EQ(dropped(buf.stats(), "stale", false), 2);
}

TEST(BufferStaleness, MovingTheVersionDropsStaleReadyRolloutsAndRejudges) {
    BufferConfig c;
    c.max_off_policy_steps = 1;
    RolloutBuffer buf(c);
    buf.set_policy_version(6);
    std::vector<Rollout> a = {ro(1, 1, 5), ro(1, 0, 5), ro(1, 1, 6), ro(1, 0, 6)};
    std::vector<Rollout> b = {ro(2, 1, 5), ro(2, 0, 5), ro(2, 1, 6), ro(2, 1, 6)};
    std::vector<Rollout> d = {ro(3, 1, 5), ro(3, 0, 5)};
    buf.push_group(a);
    buf.push_group(b);
    buf.push_group(d);
    EXPECT_EQ(buf.ready_groups(), 3u);
    buf.set_policy_version(7); // version-5 rollouts are now 2 behind
    // a keeps [1, 0]; b keeps [1, 1] -> zero variance; d is emptied.
    std::vector<Group> out = buf.pop_groups(10);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].group_id, 1);
    EXPECT_EQ(out[0].rollouts.size(), 2u);
    EXPECT_EQ(out[0].min_policy_version(), 6);
    const BufferStats s = buf.stats();
    EXPECT_EQ(dropped(s, "stale", false), 6);
    EXPECT_EQ(dropped(s, "stale"), 1);
    EXPECT_EQ(dropped(s, "zero_variance"), 1);
}

TEST(BufferStaleness, PendingRolloutsGoStaleButStillCountTowardCompletion) {
    BufferConfig c = config(3);
    c.max_off_policy_steps = 0;
    RolloutBuffer buf(c);
    buf.push(ro(1, 1.0, 0));
    buf.set_policy_version(1);
    EXPECT_EQ(buf.pending_rollouts(), 0u);
    buf.push(ro(1, 1.0, 1));
    buf.push(ro(1, 0.0, 1));
    ASSERT_EQ(buf.ready_groups(), 1u);
    EXPECT_EQ(buf.pop_groups(1)[0].rollouts.size(), 2u);
}

TEST(BufferStaleness, UnsetLimitMeansNeverStale) {
    BufferConfig c;
    c.max_off_policy_steps.reset();
    RolloutBuffer buf(c);
    buf.set_policy_version(1000);
    buf.push_group(group_of(1, {1, 0}, 0));
    EXPECT_EQ(buf.ready_groups(), 1u);
}

TEST(BufferStaleness, DefaultLimitIsEightSteps) {
    RolloutBuffer buf;
    buf.set_policy_version(9);
    buf.push_group(group_of(1, {1, 0}, 1)); // 8 behind
    buf.push_group(group_of(2, {1, 0}, 0)); // 9 behind
    EXPECT_EQ(buf.ready_groups(), 1u);
}

TEST(BufferStaleness, VersionsNeverGoBackAndRolloutsFromTheFutureAreRefused) {
    RolloutBuffer buf;
    buf.set_policy_version(3);
    EXPECT_THROW(buf.set_policy_version(2), rl::core::Error);
    EXPECT_THROW(buf.push_group(group_of(1, {1, 0}, 4)), rl::core::Error);
}

// ---- validation ---------------------------------------------------------------------------

TEST(BufferValidation, MalformedRolloutsAreRefusedWithTheField) {
    RolloutBuffer buf;
    auto expect_refused = [&](Rollout r, const std::string &needle) {
        try {
            buf.push_group({r});
            ADD_FAILURE() << "accepted; expected an error about " << needle;
        } catch (const rl::core::Error &e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    Rollout r = ro(1, 1);
    r.logprobs.pop_back();
    expect_refused(r, "logprobs");
    r = ro(1, 1);
    r.loss_mask[1] = 2;
    expect_refused(r, "loss_mask");
    r = ro(1, NAN);
    expect_refused(r, "reward");
    r = ro(1, 1);
    r.token_ids.clear();
    r.logprobs.clear();
    r.loss_mask.clear();
    expect_refused(r, "token_ids");
    r = ro(1, 1);
    r.extras["ref_logprobs"] = {0.f};
    expect_refused(r, "ref_logprobs");
    r = ro(1, 1, -1);
    expect_refused(r, "policy_version");
    EXPECT_EQ(buf.stats().pushed_rollouts, 0);
}

TEST(BufferValidation, EmptyLogprobsAndMaskAreAllowed) {
    RolloutBuffer buf;
    Rollout r = ro(1, 1), s = ro(1, 0);
    r.logprobs.clear();
    r.loss_mask.clear();
    buf.push_group({r, s});
    EXPECT_EQ(buf.ready_groups(), 1u);
}

// ---- popping and reporting --------------------------------------------------------------

TEST(BufferPop, PopBatchIsAllOrNothingAndOvershootsByAtMostOneGroup) {
    RolloutBuffer buf;
    buf.push_group(group_of(1, {1, 0, 1}));
    buf.push_group(group_of(2, {1, 0, 0}));
    EXPECT_TRUE(buf.pop_batch(7).empty());
    EXPECT_EQ(buf.ready_rollouts(), 6u);
    std::vector<Group> b = buf.pop_batch(4);
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b[0].group_id, 1);
    EXPECT_EQ(buf.ready_rollouts(), 0u);
    EXPECT_THROW(buf.pop_batch(0), rl::core::Error);
    const BufferStats s = buf.stats();
    EXPECT_EQ(s.popped_groups, 2);
    EXPECT_EQ(s.popped_rollouts, 6);
}

TEST(BufferPop, WaitBatchWakesWhenAProducerCompletesAGroup) {
    RolloutBuffer buf(config(2));
    std::thread producer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        buf.push(ro(1, 1));
        buf.push(ro(1, 0));
    });
    std::vector<Group> b = buf.wait_batch(2, std::chrono::milliseconds(5000));
    producer.join();
    ASSERT_EQ(b.size(), 1u);
    EXPECT_TRUE(buf.wait_batch(1, std::chrono::milliseconds(20)).empty());
}

TEST(BufferReport, TakeStatsCountsPerIntervalAndStatsAccumulate) {
    BufferConfig c;
    c.easy_threshold = 1.0;
    RolloutBuffer buf(c);
    buf.push_group(group_of(1, {1, 1}));
    BufferStats first = buf.take_stats();
    EXPECT_EQ(dropped(first, "too_easy"), 1);
    buf.push_group(group_of(2, {0, 0}));
    BufferStats second = buf.take_stats();
    EXPECT_EQ(dropped(second, "too_easy"), 0);
    EXPECT_EQ(dropped(second, "zero_variance"), 1);
    EXPECT_EQ(second.dropped.size(), 5u); // every reason is listed
    const BufferStats total = buf.stats();
    EXPECT_EQ(total.dropped_groups(), 2);
    EXPECT_EQ(total.dropped_rollouts(), 4);
    EXPECT_EQ(total.pushed_rollouts, 4);
}

TEST(BufferReport, DropLogSaysWhichGroupWasDroppedAndWhy) {
    BufferConfig c;
    c.max_off_policy_steps = 0;
    c.drop_log_capacity = 2;
    RolloutBuffer buf(c);
    buf.set_policy_version(2);
    buf.push_group(group_of(10, {1, 1}, 2));
    buf.push_group({ro(11, 1, 1), ro(11, 0, 2)});
    buf.push_group(group_of(12, {0.5, 0.5}, 2));
    std::vector<rl::core::DropRecord> log = buf.take_drop_log();
    ASSERT_EQ(log.size(), 2u); // capacity 2: the oldest record went
    EXPECT_EQ(log[0].group_id, 11);
    EXPECT_EQ(log[0].reason, DropReason::Stale);
    EXPECT_EQ(log[0].rollouts, 1u);
    EXPECT_EQ(log[0].policy_version, 1);
    EXPECT_EQ(log[0].current_version, 2);
    EXPECT_EQ(log[1].group_id, 12);
    EXPECT_EQ(log[1].reason, DropReason::ZeroVariance);
    EXPECT_DOUBLE_EQ(log[1].mean_reward, 0.5);
    EXPECT_TRUE(buf.take_drop_log().empty());
    EXPECT_STREQ(rl::core::drop_reason_name(DropReason::TooHard), "too_hard");
}

} // namespace

// ---- state (a restarted orchestrator, docs/buffer.md) -----------------------------------

namespace state_test {

// The state of a buffer that took pending and ready groups, dropped one, was
// moved to version 2 and popped once.
RolloutBuffer &filled(RolloutBuffer &buf) {
    buf.set_policy_version(2);
    Rollout odd = ro(7, 0.25, 1, 4);
    odd.extras["advantages"] = {0.1f, -0.2f, 0.3f, 1.0f / 3.0f};
    odd.sampling_temperature = 0.7;
    odd.task = R"({"prompt": "ab"})";
    odd.completion = "ba \xc3\xa9";
    buf.push(odd);                           // pending: 1 of 3
    buf.push_group(group_of(3, {1.0, 0.0})); // ready
    buf.push_group(group_of(4, {0.5, 0.5})); // dropped: zero variance
    buf.push_group(group_of(5, {0.0, 1.0, 0.5}, 2));
    EXPECT_EQ(buf.pop_groups(1).size(), 1u); // group 3 leaves
    return buf;
}

} // namespace state_test

TEST(BufferState, ARestoredBufferHoldsAndCountsExactlyWhatTheSavedOneDid) {
    RolloutBuffer a(config(3));
    state_test::filled(a);
    const std::string state = a.state_json();
    RolloutBuffer b(config(3));
    b.restore(state, "state.json");
    EXPECT_EQ(b.state_json(), state);
    EXPECT_EQ(b.policy_version(), 2);
    EXPECT_EQ(b.pending_rollouts(), 1u);
    EXPECT_EQ(b.ready_groups(), 1u);
    EXPECT_EQ(b.stats().popped_groups, 1);
    EXPECT_EQ(dropped(b.stats(), "zero_variance"), 1);
    // Both go on identically: the pending group completes, both pop the same.
    for (RolloutBuffer *buf : {&a, &b}) {
        buf->push(ro(7, 1.0, 2, 4));
        buf->push(ro(7, 0.0, 2, 4));
    }
    const auto ga = a.pop_groups(10), gb = b.pop_groups(10);
    ASSERT_EQ(ga.size(), 2u);
    ASSERT_EQ(gb.size(), 2u);
    for (size_t i = 0; i < ga.size(); ++i) {
        EXPECT_EQ(ga[i].group_id, gb[i].group_id);
        ASSERT_EQ(ga[i].rollouts.size(), gb[i].rollouts.size());
        for (size_t k = 0; k < ga[i].rollouts.size(); ++k) {
            const Rollout &x = ga[i].rollouts[k], &y = gb[i].rollouts[k];
            EXPECT_EQ(x.token_ids, y.token_ids);
            EXPECT_EQ(x.logprobs, y.logprobs); // bit for bit
            EXPECT_EQ(x.loss_mask, y.loss_mask);
            EXPECT_EQ(x.extras, y.extras);
            EXPECT_EQ(x.reward, y.reward);
            EXPECT_EQ(x.policy_version, y.policy_version);
            EXPECT_EQ(x.sampling_temperature, y.sampling_temperature);
            EXPECT_EQ(x.task, y.task);
            EXPECT_EQ(x.completion, y.completion);
        }
    }
    EXPECT_EQ(a.take_drop_log().size(), b.take_drop_log().size());
}

TEST(BufferState, BadStatesAreRefusedNamingTheFieldAndTheBufferIsUnchanged) {
    RolloutBuffer a(config(3));
    state_test::filled(a);
    const std::string good = a.state_json();
    auto error_of = [](const std::string &text, RolloutBuffer &into) {
        try {
            into.restore(text, "orch/buffer.json");
        } catch (const rl::core::Error &e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    RolloutBuffer b(config(3));
    EXPECT_NE(error_of("{", b).find("orch/buffer.json: not valid JSON"), std::string::npos);
    EXPECT_NE(error_of(R"({"format": "x"})", b).find("not a rl.buffer_state/1 state"),
              std::string::npos);
    std::string wrong = good;
    wrong.replace(wrong.find("\"token_ids\":["), 13, "\"token_ids\":[\"x\",");
    EXPECT_NE(error_of(wrong, b).find("orch/buffer.json.pending[0].rollouts[0].token_ids has the "
                                      "wrong type"),
              std::string::npos)
        << error_of(wrong, b);
    EXPECT_EQ(b.pending_rollouts(), 0u);
    EXPECT_EQ(b.ready_groups(), 0u);
    // Only into a buffer that took nothing.
    EXPECT_NE(error_of(good, a).find("restored into a new buffer only"), std::string::npos);
    b.restore(good, "orch/buffer.json");
    EXPECT_EQ(b.state_json(), good);
}
