// Multi-turn episodes on the rollout engine (Engine::generate_episodes): the
// KV cache is continued across turns (the logprobs equal a full forward of the
// whole sequence), observations are never trained (mask 0), turn limits,
// context limits and environment errors end an episode with their reason.
#include "../platform/platform_util.hpp"

#include "rl/core/engine.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace rl::core::test {
namespace {

class EpisodesTest : public ::testing::Test {
protected:
    void SetUp() override { policy = tiny_policy(dir, at::kFloat); }
    TempDir dir;
    std::shared_ptr<Policy> policy;
    std::vector<std::vector<int64_t>> prompts{{104, 105, 10}, {97, 98, 99, 100, 101, 10}};

    SamplingParams sampling(int64_t n, int64_t max_tokens) const {
        SamplingParams sp;
        sp.n = n;
        sp.max_tokens = max_tokens;
        sp.seed = 11;
        sp.temperature = 1.0;
        return sp;
    }
};

// The scripted environment: after every turn, the observation "<turn>:" as
// byte tokens (the tiny model's vocabulary is bytes).
std::vector<int64_t> observation_of(int64_t turn) {
    const std::string s = "\n" + std::to_string(turn) + ":";
    return std::vector<int64_t>(s.begin(), s.end());
}

TEST_F(EpisodesTest, FirstTurnIsTheSampleGenerateGivesWithTheSameSeed) {
    const SamplingParams sp = sampling(3, 12);
    Engine engine(policy);
    const Generation g = engine.generate(prompts, sp);
    const Episodes eps = engine.generate_episodes(prompts, sp, {}, [](const TurnEnd &) {
        return TurnReply{true, {}, std::nullopt};
    });
    ASSERT_EQ(static_cast<int64_t>(eps.episodes.size()), g.samples());
    for (int64_t s = 0; s < g.samples(); ++s) {
        const Episode &e = eps.episodes[static_cast<size_t>(s)];
        const std::vector<int64_t> want(g.token_ids.begin() + g.cu_seqlens[s],
                                        g.token_ids.begin() + g.cu_seqlens[s + 1]);
        EXPECT_EQ(e.tokens, want) << "episode " << s;
        EXPECT_EQ(e.end, EpisodeEnd::Done);
        EXPECT_EQ(e.turn_starts, std::vector<int64_t>{0});
        EXPECT_EQ(eps.prompt_index[static_cast<size_t>(s)], g.prompt_index[s]);
    }
}

TEST_F(EpisodesTest, ObservationsAreMaskedAndTurnsRecordedExactly) {
    const SamplingParams sp = sampling(2, 6);
    Engine engine(policy);
    EpisodeOptions opt;
    opt.max_turns = 3;
    std::vector<TurnEnd> seen;
    const Episodes eps = engine.generate_episodes(prompts, sp, opt, [&](const TurnEnd &t) {
        seen.push_back(t);
        return TurnReply{false, observation_of(t.turn), std::nullopt};
    });
    ASSERT_EQ(eps.episodes.size(), 4u);
    EXPECT_EQ(seen.size(), 12u); // 4 episodes x 3 turns, each reported once
    for (size_t s = 0; s < eps.episodes.size(); ++s) {
        const Episode &e = eps.episodes[s];
        EXPECT_EQ(e.end, EpisodeEnd::MaxTurns);
        ASSERT_EQ(e.turn_starts.size(), 3u);
        ASSERT_EQ(e.mask.size(), e.tokens.size());
        ASSERT_EQ(e.logprobs.size(), e.tokens.size());
        // Rebuild the expected mask: turn tokens 1, observation tokens 0
        // (after every turn but the last, which ends the episode).
        std::vector<uint8_t> want;
        for (size_t t = 0; t < 3; ++t) {
            EXPECT_EQ(e.turn_starts[t], static_cast<int64_t>(want.size()));
            const int64_t len = e.turn_ends[t] - e.turn_starts[t];
            EXPECT_GE(len, 1);
            want.insert(want.end(), static_cast<size_t>(len), 1);
            if (t < 2) {
                const auto obs = observation_of(static_cast<int64_t>(t));
                EXPECT_TRUE(std::equal(obs.begin(), obs.end(), e.tokens.begin() + e.turn_ends[t]))
                    << "episode " << s << " turn " << t;
                want.insert(want.end(), obs.size(), 0);
            }
        }
        EXPECT_EQ(e.mask, want) << "episode " << s;
        for (size_t i = 0; i < e.mask.size(); ++i) {
            if (e.mask[i] == 0) {
                EXPECT_EQ(e.logprobs[i], 0.0f);
            }
        }
    }
    // The turn callback saw each turn's own tokens.
    for (const TurnEnd &t : seen) {
        const Episode &e = eps.episodes[static_cast<size_t>(t.episode)];
        const size_t a = static_cast<size_t>(e.turn_starts[static_cast<size_t>(t.turn)]);
        EXPECT_TRUE(std::equal(t.tokens.begin(), t.tokens.end(), e.tokens.begin() + a));
        EXPECT_EQ(static_cast<int64_t>(a + t.tokens.size()),
                  e.turn_ends[static_cast<size_t>(t.turn)]);
    }
}

TEST_F(EpisodesTest, ContinuingFromTheCacheEqualsAFullForwardOfTheSequence) {
    const SamplingParams sp = sampling(2, 8);
    Engine engine(policy);
    EpisodeOptions opt;
    opt.max_turns = 4;
    const Episodes eps = engine.generate_episodes(prompts, sp, opt, [](const TurnEnd &t) {
        return TurnReply{false, observation_of(t.turn), std::nullopt};
    });
    c10::InferenceMode guard;
    for (size_t s = 0; s < eps.episodes.size(); ++s) {
        const Episode &e = eps.episodes[s];
        const auto &prompt = prompts[static_cast<size_t>(eps.prompt_index[s])];
        std::vector<int64_t> seq = prompt;
        seq.insert(seq.end(), e.tokens.begin(), e.tokens.end());
        const at::Tensor logits = policy->model().logits(PackedBatch::from_sequences({seq}));
        const at::Tensor lp = at::log_softmax(logits, -1);
        ASSERT_GT(e.turn_starts.size(), 1u) << "the episode must have continued";
        for (size_t i = 0; i < e.tokens.size(); ++i) {
            if (e.mask[i] == 0) continue;
            const int64_t pos = static_cast<int64_t>(prompt.size() + i) - 1;
            const float full = lp[pos][e.tokens[i]].item<float>();
            EXPECT_NEAR(e.logprobs[i], full, 1e-5) << "episode " << s << " token " << i;
        }
    }
}

TEST_F(EpisodesTest, ContextLimitEndsTheEpisodeAndAnErrorDropsOnlyItsEpisode) {
    const SamplingParams sp = sampling(1, 5);
    Engine engine(policy);
    EpisodeOptions opt;
    opt.max_turns = 50;
    opt.max_context = 40;
    const Episodes eps = engine.generate_episodes(prompts, sp, opt, [](const TurnEnd &t) {
        if (t.episode == 1 && t.turn == 1) return TurnReply{false, {}, std::string("tool died")};
        return TurnReply{false, observation_of(t.turn), std::nullopt};
    });
    const Episode &a = eps.episodes[0];
    EXPECT_EQ(a.end, EpisodeEnd::Context);
    EXPECT_LE(static_cast<int64_t>(prompts[0].size() + a.tokens.size()), opt.max_context);
    EXPECT_GT(a.turn_starts.size(), 2u);
    const Episode &b = eps.episodes[1];
    EXPECT_EQ(b.end, EpisodeEnd::Error);
    EXPECT_EQ(b.error, "tool died");
    EXPECT_EQ(b.turn_starts.size(), 2u);
    EXPECT_STREQ(episode_end_name(EpisodeEnd::Context), "context");
}

TEST_F(EpisodesTest, RefusesBadOptionsNamingThem) {
    Engine engine(policy);
    const auto done = [](const TurnEnd &) { return TurnReply{true, {}, std::nullopt}; };
    EpisodeOptions opt;
    opt.max_turns = 0;
    try {
        engine.generate_episodes(prompts, sampling(1, 4), opt, done);
        FAIL() << "max_turns 0 accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("max_turns"), std::string::npos) << e.what();
    }
    opt = {};
    opt.max_context = 4;
    try {
        engine.generate_episodes(prompts, sampling(1, 4), opt, done);
        FAIL() << "a prompt longer than max_context accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("max_context"), std::string::npos) << e.what();
    }
}

} // namespace
} // namespace rl::core::test
