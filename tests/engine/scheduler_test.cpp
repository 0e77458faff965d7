// The serving scheduler (continuous batching) on the tiny model: requests
// submitted at different times share decode steps and still produce exactly
// the engine's samples; cancellation, timeouts, back-pressure, pause, weight
// swaps and memory release.
#include "../platform/platform_util.hpp"

#include "rl/core/scheduler.hpp"

#include <ATen/core/grad_mode.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace rl::core::test {
namespace {

using namespace std::chrono_literals;

// Submits a request and collects its events and result.
struct Collected {
    std::vector<TokenEvent> events;
    std::promise<RequestResult> done;
    std::future<RequestResult> result = done.get_future();
};

ServeRequest request_of(std::vector<int64_t> prompt, SamplingParams sp, int64_t sample,
                        Collected &c) {
    ServeRequest r;
    r.prompt = std::move(prompt);
    r.params = sp;
    r.sample_index = sample;
    r.on_token = [&c](const TokenEvent &e) { c.events.push_back(e); };
    r.on_done = [&c](RequestResult res) { c.done.set_value(std::move(res)); };
    return r;
}

RequestResult wait_for(Collected &c, std::chrono::seconds limit = 120s) {
    if (c.result.wait_for(limit) != std::future_status::ready)
        throw std::runtime_error("request did not end within the limit");
    return c.result.get();
}

class SchedulerTest : public ::testing::Test {
protected:
    void SetUp() override { policy = tiny_policy(dir, at::kFloat); }
    TempDir dir;
    std::shared_ptr<Policy> policy;
    std::vector<std::vector<int64_t>> prompts{{104, 105, 10}, {97, 98, 99, 100, 101, 10}, {120}};
};

TEST_F(SchedulerTest, RequestsArrivingAtDifferentTimesGiveTheEnginesSamples) {
    SamplingParams sp;
    sp.n = 3;
    sp.max_tokens = 20;
    sp.seed = 7;
    sp.temperature = 0.9;
    sp.top_k = 50;
    Engine engine(policy);
    std::vector<Generation> ref;
    for (const auto &p : prompts) ref.push_back(engine.generate({p}, sp));

    Scheduler scheduler(policy);
    SamplingParams one = sp;
    one.n = 1;
    std::vector<std::unique_ptr<Collected>> got;
    for (size_t p = 0; p < prompts.size(); ++p) {
        for (int64_t s = 0; s < sp.n; ++s) {
            got.push_back(std::make_unique<Collected>());
            scheduler.submit(request_of(prompts[p], one, s, *got.back()));
            std::this_thread::sleep_for(3ms); // later arrivals join running decodes
        }
    }
    for (size_t p = 0; p < prompts.size(); ++p) {
        for (int64_t s = 0; s < sp.n; ++s) {
            Collected &c = *got[p * static_cast<size_t>(sp.n) + static_cast<size_t>(s)];
            const RequestResult r = wait_for(c);
            const Generation &g = ref[p];
            const auto b = static_cast<size_t>(g.cu_seqlens[static_cast<size_t>(s)]);
            const auto e = static_cast<size_t>(g.cu_seqlens[static_cast<size_t>(s) + 1]);
            const std::vector<int64_t> want(g.token_ids.begin() + static_cast<long>(b),
                                            g.token_ids.begin() + static_cast<long>(e));
            ASSERT_EQ(r.tokens, want) << "prompt " << p << " sample " << s;
            for (size_t t = 0; t < want.size(); ++t)
                EXPECT_NEAR(r.logprobs[t], g.logprobs[b + t], 1e-5);
            EXPECT_EQ(r.text, g.completions[static_cast<size_t>(s)]);
            EXPECT_STREQ(request_end_name(r.end),
                         finish_reason_name(g.finish_reasons[static_cast<size_t>(s)]));
            // The events carry every token, and their texts add up to the text.
            std::string text;
            ASSERT_EQ(c.events.size(), r.tokens.size());
            for (size_t t = 0; t < c.events.size(); ++t) {
                EXPECT_EQ(c.events[t].token, r.tokens[t]);
                text += c.events[t].text;
            }
            EXPECT_EQ(text, r.text);
            EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(prompts[p].size()));
        }
    }
    EXPECT_EQ(scheduler.stats().running, 0);
}

TEST_F(SchedulerTest, LogprobsAtTemperatureOneEqualTheTrainersScoring) {
    Scheduler scheduler(policy);
    SamplingParams sp;
    sp.max_tokens = 16;
    sp.seed = 3;
    sp.stop_token_ids = std::vector<int64_t>{}; // run to max_tokens
    Collected c;
    scheduler.submit(request_of(prompts[1], sp, 0, c));
    const RequestResult r = wait_for(c);
    ASSERT_EQ(r.tokens.size(), 16u);
    std::vector<int64_t> seq = prompts[1];
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
    const PackedBatch batch = PackedBatch::from_sequences({seq});
    at::Tensor labels = at::roll(batch.input_ids, -1);
    at::Tensor lp = policy->model().token_logprobs(batch, labels).logprobs.detach();
    const int64_t p = static_cast<int64_t>(prompts[1].size());
    for (int64_t t = 0; t < 16; ++t)
        EXPECT_NEAR(r.logprobs[static_cast<size_t>(t)], lp[p - 1 + t].item<float>(), 1e-5)
            << "token " << t;
}

TEST_F(SchedulerTest, StopStringsEndTheRequestAndAreCutFromTheText) {
    // Greedy continuation of a prompt, then the same with a stop string taken
    // from inside that continuation.
    Scheduler scheduler(policy);
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 24;
    sp.stop_token_ids = std::vector<int64_t>{};
    Collected a;
    scheduler.submit(request_of(prompts[0], sp, 0, a));
    const RequestResult full = wait_for(a);
    ASSERT_GE(full.text.size(), 6u);
    sp.stop = {full.text.substr(3, 2)};
    const size_t cut = full.text.find(sp.stop[0]);
    Collected b;
    scheduler.submit(request_of(prompts[0], sp, 0, b));
    const RequestResult r = wait_for(b);
    EXPECT_EQ(r.end, RequestEnd::Stop);
    EXPECT_EQ(r.text, full.text.substr(0, cut));
    std::string text;
    for (const auto &e : b.events) text += e.text;
    EXPECT_EQ(text, r.text);
}

TEST_F(SchedulerTest, ACancelledRequestEndsAndFreesItsSlotWhileOthersContinue) {
    SchedulerConfig cfg;
    cfg.max_running = 2;
    Scheduler scheduler(policy, cfg);
    SamplingParams sp;
    sp.max_tokens = 400;
    sp.seed = 1;
    sp.stop_token_ids = std::vector<int64_t>{};
    Collected a, b;
    const uint64_t ia = scheduler.submit(request_of(prompts[0], sp, 0, a));
    scheduler.submit(request_of(prompts[1], sp, 0, b));
    // Cancel once it produced a token.
    for (int i = 0; i < 6000 && a.result.wait_for(0s) != std::future_status::ready; ++i) {
        if (scheduler.stats().tokens_generated > 0) break;
        std::this_thread::sleep_for(10ms);
    }
    scheduler.cancel(ia);
    const RequestResult ra = wait_for(a);
    EXPECT_EQ(ra.end, RequestEnd::Cancelled);
    EXPECT_LT(ra.tokens.size(), 400u);
    const RequestResult rb = wait_for(b);
    EXPECT_EQ(rb.end, RequestEnd::Length);
    EXPECT_EQ(rb.tokens.size(), 400u);
    scheduler.cancel(ia); // already ended: ignored
    scheduler.cancel(12345);
    EXPECT_EQ(scheduler.stats().running, 0);
}

TEST_F(SchedulerTest, ARequestPastItsDeadlineEndsWithTimeout) {
    Scheduler scheduler(policy);
    SamplingParams sp;
    sp.max_tokens = 1000;
    sp.stop_token_ids = std::vector<int64_t>{};
    scheduler.pause(); // nothing runs: the deadline passes in the queue
    Collected c;
    ServeRequest r = request_of(prompts[0], sp, 0, c);
    r.deadline = std::chrono::steady_clock::now() + 50ms;
    scheduler.submit(std::move(r));
    const RequestResult res = wait_for(c);
    EXPECT_EQ(res.end, RequestEnd::Timeout);
    EXPECT_TRUE(res.tokens.empty());
}

TEST_F(SchedulerTest, AFullQueueIsRefusedWithSchedulerFull) {
    SchedulerConfig cfg;
    cfg.max_running = 1;
    cfg.max_queued = 2;
    Scheduler scheduler(policy, cfg);
    scheduler.pause();
    SamplingParams sp;
    sp.max_tokens = 4;
    std::vector<std::unique_ptr<Collected>> cs;
    for (int i = 0; i < 3; ++i) {
        cs.push_back(std::make_unique<Collected>());
        scheduler.submit(request_of(prompts[0], sp, 0, *cs.back()));
    }
    Collected extra;
    EXPECT_THROW(scheduler.submit(request_of(prompts[0], sp, 0, extra)), SchedulerFull);
    scheduler.resume();
    for (auto &c : cs) EXPECT_NE(wait_for(*c).end, RequestEnd::Error);
}

TEST_F(SchedulerTest, BadRequestsAreRefusedNamingTheField) {
    Scheduler scheduler(policy);
    SamplingParams sp;
    Collected c;
    EXPECT_NE(error_of([&] { scheduler.submit(request_of({}, sp, 0, c)); }).find("prompt is empty"),
              std::string::npos);
    const std::string oov = error_of([&] { scheduler.submit(request_of({1, 5000}, sp, 0, c)); });
    EXPECT_NE(oov.find("prompt token 1 = 5000 is outside the vocabulary"), std::string::npos)
        << oov;
    sp.max_tokens = 1 << 20;
    const std::string big = error_of([&] { scheduler.submit(request_of({1}, sp, 0, c)); });
    EXPECT_NE(big.find("max_tokens"), std::string::npos) << big;
    sp.max_tokens = 4;
    sp.n = 2;
    EXPECT_NE(error_of([&] { scheduler.submit(request_of({1}, sp, 0, c)); }).find("n must be 1"),
              std::string::npos);
}

TEST_F(SchedulerTest, AWeightSwapInExclusiveReprefillsRunningRequestsUnderTheNewWeights) {
    // Greedy with new weights from the start must equal a request that began
    // under the old weights and was swapped before its first token.
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 30;
    sp.stop_token_ids = std::vector<int64_t>{};
    Scheduler scheduler(policy);
    scheduler.pause();
    Collected c;
    scheduler.submit(request_of(prompts[1], sp, 0, c));
    scheduler.exclusive([&] {
        at::NoGradGuard ng;
        for (auto &[name, w] : policy->model().named_weights()) w.mul_(1.5);
        policy->bump_version();
    });
    EXPECT_EQ(scheduler.stats().version, policy->version());
    scheduler.resume();
    const RequestResult r = wait_for(c);
    EXPECT_EQ(r.first_version, policy->version());
    Engine engine(policy);
    const Generation g = engine.generate({prompts[1]}, sp);
    EXPECT_EQ(r.tokens, g.token_ids);
}

TEST_F(SchedulerTest, ReleasedMemoryHoldsRequestsUntilResumedWithTheSameResult) {
    SamplingParams sp;
    sp.seed = 5;
    sp.max_tokens = 12;
    Engine engine(policy);
    const Generation g = engine.generate({prompts[0]}, sp);
    Scheduler scheduler(policy);
    scheduler.release_memory();
    EXPECT_EQ(scheduler.stats().cache_bytes, 0);
    EXPECT_TRUE(scheduler.stats().memory_released);
    Collected c;
    scheduler.submit(request_of(prompts[0], sp, 0, c));
    EXPECT_EQ(c.result.wait_for(100ms), std::future_status::timeout);
    scheduler.resume_memory();
    EXPECT_EQ(wait_for(c).tokens, g.token_ids);
    EXPECT_GT(scheduler.stats().cache_bytes, 0);
}

TEST_F(SchedulerTest, DestroyingTheSchedulerCancelsEverythingItHolds) {
    std::vector<std::unique_ptr<Collected>> cs;
    {
        Scheduler scheduler(policy);
        scheduler.pause();
        SamplingParams sp;
        for (int i = 0; i < 4; ++i) {
            cs.push_back(std::make_unique<Collected>());
            scheduler.submit(request_of(prompts[0], sp, 0, *cs.back()));
        }
    }
    for (auto &c : cs) EXPECT_EQ(wait_for(*c, 1s).end, RequestEnd::Cancelled);
}

} // namespace
} // namespace rl::core::test
