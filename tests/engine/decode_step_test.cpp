// The one decoding step of core/engine (core/engine/src/decode_step.hpp):
// Engine::generate (in one wave or several), the serving scheduler and
// Engine::generate_episodes draw the same tokens with the same logprobs, end
// their samples for the same reasons with the same texts, and record the same
// routing rows, on a small mixture-of-experts model with stop strings, stop
// ids, max_tokens, top-k and top-p, n > 1.
#include "../moe/moe_test_util.hpp"
#include "../platform/platform_util.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/scheduler.hpp"

#include <chrono>
#include <future>
#include <string>
#include <vector>

namespace rl::core::test {
namespace {

using namespace std::chrono_literals;

class DecodeStepTest : public ::testing::Test {
protected:
    void SetUp() override {
        write_tiny_model(dir / "moe", 5, small_moe_spec());
        policy = Policy::load(dir / "moe");
    }
    TempDir dir;
    std::shared_ptr<Policy> policy;
    std::vector<std::vector<int64_t>> prompts{
        {'r', 'o', 'u', 't', 'e'}, {'x', 'y'}, {'h', 'e', 'l', 'l', 'o', ' ', 'm', 'o', 'e'}};

    // n = 3 per prompt with temperature, top-k and top-p, both routing
    // records, and stops chosen from a run without them so that some samples
    // end on a stop id, some on a stop string and some at max_tokens.
    SamplingParams sampling() {
        SamplingParams sp;
        sp.n = 3;
        sp.temperature = 0.8;
        sp.top_k = 40;
        sp.top_p = 0.95;
        sp.max_tokens = 14;
        sp.seed = 21;
        sp.return_routed_experts = true;
        sp.return_expert_logits = true;
        sp.stop_token_ids = std::vector<int64_t>{};
        Engine engine(policy);
        // Sample 1 of prompt 0 ends on its 5th token at the latest; a sample
        // of prompt 1 at a stop string, a printable character from the
        // middle of its text.
        const Generation first = engine.generate({prompts[0]}, sp);
        sp.stop_token_ids = std::vector<int64_t>{first.token_ids[first.cu_seqlens[1] + 4]};
        const Generation second = engine.generate({prompts[1]}, sp);
        // (The random model writes mostly bytes that are no UTF-8: the
        // text is mostly U+FFFD, a printable ASCII character is rare.)
        auto printable = [](char c) { return c > ' ' && c < 127; };
        for (const std::string &text : second.completions)
            for (size_t i = 1; i < text.size() && sp.stop.empty(); ++i)
                if (printable(text[i])) sp.stop = {text.substr(i, 1)};
        return sp;
    }
};

// Sample s of g: [begin, end) of its tokens and of its routing rows.
struct Span {
    size_t begin = 0, end = 0, row_begin = 0, row_end = 0;
};

Span span_of(const Generation &g, const std::vector<std::vector<int64_t>> &prompts, int64_t s) {
    Span sp;
    size_t rows = 0;
    for (int64_t i = 0; i <= s; ++i) {
        const auto prompt = prompts[static_cast<size_t>(g.prompt_index[static_cast<size_t>(i)])];
        const size_t len = static_cast<size_t>(g.cu_seqlens[static_cast<size_t>(i) + 1] -
                                               g.cu_seqlens[static_cast<size_t>(i)]);
        sp.row_begin = rows;
        rows += prompt.size() + len;
    }
    sp.row_end = rows;
    const auto width = static_cast<size_t>(g.routed_layers * g.routed_k);
    sp.row_begin *= width;
    sp.row_end *= width;
    sp.begin = static_cast<size_t>(g.cu_seqlens[static_cast<size_t>(s)]);
    sp.end = static_cast<size_t>(g.cu_seqlens[static_cast<size_t>(s) + 1]);
    return sp;
}

template <typename T>
std::vector<T> slice(const std::vector<T> &v, size_t b, size_t e) {
    return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(b),
                          v.begin() + static_cast<std::ptrdiff_t>(e));
}

// A scheduler request of prompt p, sample s, is Engine::generate's sample s
// of {prompt p}: `want` holds those generations, one per prompt.
void expect_requests_equal(Scheduler &scheduler, const std::vector<std::vector<int64_t>> &prompts,
                           const SamplingParams &sp, const std::vector<Generation> &want,
                           bool exact) {
    SamplingParams one = sp;
    one.n = 1;
    const auto total = static_cast<size_t>(sp.n) * prompts.size();
    std::vector<std::promise<RequestResult>> done(total);
    scheduler.pause(); // the requests start together
    for (size_t i = 0; i < total; ++i) {
        ServeRequest request;
        request.prompt = prompts[i / static_cast<size_t>(sp.n)];
        request.params = one;
        request.sample_index = static_cast<int64_t>(i % static_cast<size_t>(sp.n));
        request.on_done = [&done, i](RequestResult r) { done[i].set_value(std::move(r)); };
        scheduler.submit(std::move(request));
    }
    scheduler.resume();
    for (size_t i = 0; i < total; ++i) {
        auto result = done[i].get_future();
        ASSERT_EQ(result.wait_for(120s), std::future_status::ready) << "request " << i;
        const RequestResult r = result.get();
        const size_t p = i / static_cast<size_t>(sp.n);
        const auto s = static_cast<int64_t>(i % static_cast<size_t>(sp.n));
        const Generation &g = want[p];
        const std::vector<std::vector<int64_t>> of{prompts[p]};
        const Span at = span_of(g, of, s);
        EXPECT_EQ(r.tokens, slice(g.token_ids, at.begin, at.end)) << "request " << i;
        EXPECT_EQ(r.text, g.completions[static_cast<size_t>(s)]) << "request " << i;
        EXPECT_STREQ(request_end_name(r.end),
                     finish_reason_name(g.finish_reasons[static_cast<size_t>(s)]))
            << "request " << i;
        EXPECT_EQ(r.routed_layers, g.routed_layers);
        EXPECT_EQ(r.routed_k, g.routed_k);
        EXPECT_EQ(std::vector<int64_t>(r.routed_experts.begin(), r.routed_experts.end()),
                  slice(g.routed_experts, at.row_begin, at.row_end))
            << "request " << i;
        const std::vector<float> lp = slice(g.logprobs, at.begin, at.end);
        const std::vector<float> w = slice(g.routed_expert_weights, at.row_begin, at.row_end);
        if (exact) {
            EXPECT_EQ(r.logprobs, lp) << "request " << i;
            EXPECT_EQ(r.routed_expert_weights, w) << "request " << i;
            continue;
        }
        ASSERT_EQ(r.logprobs.size(), lp.size());
        for (size_t t = 0; t < lp.size(); ++t)
            EXPECT_NEAR(r.logprobs[t], lp[t], 1e-5) << "request " << i << " token " << t;
        ASSERT_EQ(r.routed_expert_weights.size(), w.size());
        for (size_t t = 0; t < w.size(); ++t)
            EXPECT_NEAR(r.routed_expert_weights[t], w[t], 1e-5) << "request " << i << " at " << t;
    }
}

// One sample at a time on both sides: the same forwards, so everything is
// equal to the bit.
TEST_F(DecodeStepTest, SchedulerAndEngineDecodeTheSameSamples) {
    const SamplingParams sp = sampling();
    ASSERT_EQ(sp.stop.size(), 1u) << "no stop string found in the run without stops";
    EngineConfig one_at_a_time;
    one_at_a_time.max_batch_sequences = 1;
    Engine engine(policy, one_at_a_time);
    std::vector<Generation> want;
    int64_t stops = 0, lengths = 0;
    for (const auto &p : prompts) {
        want.push_back(engine.generate({p}, sp));
        ASSERT_GT(want.back().routed_layers, 0);
        ASSERT_EQ(want.back().routed_expert_weights.size(), want.back().routed_experts.size());
        for (FinishReason r : want.back().finish_reasons)
            (r == FinishReason::Stop ? stops : lengths) += 1;
    }
    EXPECT_GT(stops, 1);
    EXPECT_GT(lengths, 1);
    // One of them on the stop string: its last token is no stop id.
    int64_t string_stops = 0;
    for (const Generation &g : want)
        for (int64_t s = 0; s < g.samples(); ++s)
            string_stops += g.finish_reasons[static_cast<size_t>(s)] == FinishReason::Stop &&
                            g.token_ids[static_cast<size_t>(g.cu_seqlens[s + 1] - 1)] !=
                                sp.stop_token_ids->front();
    EXPECT_GT(string_stops, 0);
    SchedulerConfig sc;
    sc.max_running = 1;
    Scheduler scheduler(policy, sc);
    expect_requests_equal(scheduler, prompts, sp, want, /*exact=*/true);
}

// Requests sharing every step (the scheduler's batches are not the engine's:
// the logprobs and weights agree to float rounding, the rest exactly).
TEST_F(DecodeStepTest, SchedulerRequestsSharingStepsDecodeTheEnginesSamples) {
    const SamplingParams sp = sampling();
    Engine engine(policy);
    std::vector<Generation> want;
    for (const auto &p : prompts) want.push_back(engine.generate({p}, sp));
    Scheduler scheduler(policy);
    expect_requests_equal(scheduler, prompts, sp, want, /*exact=*/false);
}

TEST_F(DecodeStepTest, EpisodesDecodeTheirFirstTurnAsGenerateDecodesTheSample) {
    SamplingParams sp = sampling();
    sp.return_expert_logits = false; // episodes record the ids only
    Engine engine(policy);
    const Generation g = engine.generate(prompts, sp);
    const Episodes eps = engine.generate_episodes(prompts, sp, {}, [](const TurnEnd &) {
        return TurnReply{true, {}, std::nullopt};
    });
    ASSERT_EQ(static_cast<int64_t>(eps.episodes.size()), g.samples());
    EXPECT_EQ(eps.routed_layers, g.routed_layers);
    EXPECT_EQ(eps.routed_k, g.routed_k);
    for (int64_t s = 0; s < g.samples(); ++s) {
        const Episode &e = eps.episodes[static_cast<size_t>(s)];
        const Span at = span_of(g, prompts, s);
        EXPECT_EQ(e.tokens, slice(g.token_ids, at.begin, at.end)) << "episode " << s;
        EXPECT_EQ(e.logprobs, slice(g.logprobs, at.begin, at.end)) << "episode " << s;
        ASSERT_EQ(e.turn_texts.size(), 1u);
        EXPECT_EQ(e.turn_texts[0], g.completions[static_cast<size_t>(s)]) << "episode " << s;
        EXPECT_EQ(e.turn_reasons[0], g.finish_reasons[static_cast<size_t>(s)]) << "episode " << s;
        EXPECT_EQ(e.routed_experts, slice(g.routed_experts, at.row_begin, at.row_end))
            << "episode " << s;
    }
}

} // namespace
} // namespace rl::core::test
