// QeRL exploration noise (EngineConfig::noise, docs/moe.md): the schedule
// against Surogate's definition at every stage boundary, the rollout engine's
// noisy norm copies (their sigma, what generate samples with), the trainer's
// weights left bit-identical, determinism and resume, on a dense and an MoE
// model, and the refusals of bad settings.
#include "../core/test_util.hpp"

#include "rl/core/config.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/scheduler.hpp"
#include "rl/core/tiny.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace rl::core;
using test::error_of;

namespace {

// Surogate's compute_sigma, restated from its definition: num_stages - 1
// geometric values sigma_start * (sigma_end / sigma_start)^(i / (N - 2))
// ([sigma_start] when N <= 2), one noise-free interval before them, the run
// cut into len + 1 intervals of total / (len + 1) steps, the step clamped to
// the run, the interval index clamped to the last value.
double surogate_sigma(int64_t step, int64_t total, double start, double end, int64_t stages) {
    std::vector<double> trend;
    if (stages <= 2) {
        trend.push_back(start);
    } else {
        for (int64_t i = 0; i < stages - 1; ++i)
            trend.push_back(start * std::pow(end / start, static_cast<double>(i) /
                                                              static_cast<double>(stages - 2)));
    }
    const double intervals = static_cast<double>(trend.size() + 1);
    const double per = static_cast<double>(total) / intervals;
    const double s = static_cast<double>(std::min(step, total));
    const auto interval = static_cast<int64_t>(std::floor(s / per));
    if (interval == 0) return 0.0;
    return trend[static_cast<size_t>(
        std::min<int64_t>(interval - 1, static_cast<int64_t>(trend.size()) - 1))];
}

NoiseSchedule schedule(double start, double end, int64_t stages) {
    NoiseSchedule n;
    n.enabled = true;
    n.sigma_start = start;
    n.sigma_end = end;
    n.num_stages = stages;
    return n;
}

// A policy of the tiny (or tiny-moe) preset's shape with random weights and
// norm weights away from 1 (so "clean" is not a constant).
std::shared_ptr<Policy> make_policy(const std::string &preset, uint64_t seed) {
    auto model =
        std::make_shared<CausalLM>(ModelConfig::parse(tiny_config_json(tiny_preset_spec(preset))));
    model->init_weights(seed, 0.05);
    at::NoGradGuard g;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    for (auto &[name, p] : model->named_weights())
        if (name.find("norm.weight") != std::string::npos) {
            at::Tensor t = at::empty(p.sizes(), at::kFloat);
            t.uniform_(0.5, 1.5, gen);
            p.copy_(t);
        }
    return std::make_shared<Policy>(model, nullptr);
}

EngineConfig noisy_config(uint64_t seed) {
    EngineConfig c;
    c.noise = schedule(5e-2, 5e-4, 5); // 10 steps: stages of 2 steps
    c.total_steps = 10;
    c.seed = seed;
    return c;
}

std::map<std::string, at::Tensor> norm_copies(const CausalLM &m) {
    std::map<std::string, at::Tensor> out;
    for (const auto &[name, p] : m.named_weights())
        if (name.find("norm.weight") != std::string::npos) out[name] = p.detach().clone();
    return out;
}

SamplingParams sampling() {
    SamplingParams sp;
    sp.n = 2;
    sp.max_tokens = 12;
    sp.seed = 11;
    sp.stop_token_ids = std::vector<int64_t>{};
    return sp;
}

const std::vector<std::vector<int64_t>> kPrompts = {{72, 101, 108, 108, 111}, {1, 2, 3}};

} // namespace

TEST(QerlSchedule, MatchesSurogatesFormulaAtEveryStageBoundary) {
    struct Case {
        int64_t total, stages;
        double start, end;
    };
    for (const Case &c : {Case{100, 10, 5e-2, 5e-4}, Case{7, 3, 5e-2, 5e-4}, Case{9, 2, 1e-2, 1e-3},
                          Case{20, 4, 1e-3, 1e-1}, Case{3, 10, 5e-2, 5e-4}}) {
        const NoiseSchedule n = schedule(c.start, c.end, c.stages);
        const std::string what =
            "total " + std::to_string(c.total) + ", " + std::to_string(c.stages) + " stages";
        // Every boundary (the last step of a stage and the first of the
        // next), the run's end and past it.
        std::vector<int64_t> steps = {0, 1, c.total - 1, c.total, c.total + 5};
        for (int64_t s = 1; s < c.stages; ++s) {
            const auto b = static_cast<int64_t>(
                std::ceil(static_cast<double>(s * c.total) / static_cast<double>(c.stages)));
            steps.insert(steps.end(), {b - 1, b, b + 1});
        }
        for (int64_t step : steps) {
            if (step < 0) continue;
            EXPECT_EQ(n.sigma(step, c.total),
                      surogate_sigma(step, c.total, c.start, c.end, c.stages))
                << what << ", step " << step;
        }
    }
    // The stages themselves, by hand: 10 steps, 5 stages of 2 steps.
    const NoiseSchedule n = schedule(5e-2, 5e-4, 5);
    const double r = std::pow(1e-2, 1.0 / 3.0);
    const std::vector<double> expected = {
        0, 0, 5e-2, 5e-2, 5e-2 * r, 5e-2 * r, 5e-2 * r * r, 5e-2 * r * r, 5e-4, 5e-4, 5e-4};
    for (int64_t step = 0; step <= 10; ++step)
        EXPECT_NEAR(n.sigma(step, 10), expected[static_cast<size_t>(step)], 1e-15)
            << "step " << step;
    // The first stage is noise-free, the last stage ends at sigma_end.
    EXPECT_EQ(n.sigma(0, 10), 0.0);
    EXPECT_DOUBLE_EQ(n.sigma(10, 10), 5e-4);
    // Disabled, or no run length: no noise.
    NoiseSchedule off = n;
    off.enabled = false;
    EXPECT_EQ(off.sigma(5, 10), 0.0);
    EXPECT_EQ(n.sigma(5, 0), 0.0);
}

class QerlNoise : public ::testing::TestWithParam<std::string> {};

TEST_P(QerlNoise, RolloutNormsCarryTheScheduledSigmaAndTheTrainersStayClean) {
    auto policy = make_policy(GetParam(), 3);
    const auto clean = norm_copies(policy->model());
    const EngineConfig cfg = noisy_config(7);
    Engine engine(policy, cfg);

    // Stage 0: exactly the clean weights (no copies at all).
    EXPECT_EQ(engine.noise_sigma(), 0.0);
    EXPECT_TRUE(engine.noisy_norms().empty());

    for (int64_t version : {2, 5, 9, 10}) {
        policy->set_version(version);
        engine.sync_weights();
        const double sigma = cfg.noise.sigma(version, cfg.total_steps);
        ASSERT_GT(sigma, 0.0);
        EXPECT_EQ(engine.noise_sigma(), sigma) << "version " << version;

        // One copy per decoder layer's input and post-attention norm plus the
        // final norm; q_norm / k_norm are not noised (as Surogate).
        const CausalLM &m = policy->model();
        const auto layers = static_cast<size_t>(m.config().num_hidden_layers);
        ASSERT_EQ(engine.noisy_norms().size(), 2 * layers + 1);
        std::vector<at::Tensor> diffs;
        auto add = [&](const RMSNorm *norm) {
            const auto it = engine.noisy_norms().find(norm);
            ASSERT_NE(it, engine.noisy_norms().end());
            EXPECT_EQ(it->second.sizes(), norm->weight.sizes());
            EXPECT_EQ(it->second.scalar_type(), norm->weight.scalar_type());
            diffs.push_back((it->second - norm->weight).flatten());
        };
        for (const auto &layer : m.model->layers) {
            add(layer->input_layernorm.get());
            add(layer->post_attention_layernorm.get());
            EXPECT_EQ(engine.noisy_norms().count(layer->self_attn->q_norm.get()), 0u);
        }
        add(m.model->norm.get());
        const at::Tensor d = at::cat(diffs).to(at::kDouble);
        const double n = static_cast<double>(d.numel());
        const double std = d.std().item<double>(), mean = d.mean().item<double>();
        // Sampling error of a standard deviation over n draws: sigma / sqrt(2 n).
        EXPECT_NEAR(std / sigma, 1.0, 5.0 / std::sqrt(2.0 * n)) << "version " << version;
        EXPECT_NEAR(mean / sigma, 0.0, 5.0 / std::sqrt(n)) << "version " << version;

        // Generating with the noise leaves the trainer's tensors bit-identical.
        engine.generate(kPrompts, sampling());
        for (const auto &[name, p] : policy->model().named_weights()) {
            if (clean.count(name)) {
                EXPECT_TRUE(at::equal(p, clean.at(name))) << name;
            }
        }
    }
}

TEST_P(QerlNoise, GenerateSamplesWithTheNoisyNormsAndForwardsOutsideItDoNot) {
    auto noisy_policy = make_policy(GetParam(), 5);
    noisy_policy->set_version(4);
    Engine noisy(noisy_policy, noisy_config(9));
    ASSERT_GT(noisy.noise_sigma(), 0.0);

    // The same model with the noisy copies written into its weights, sampled
    // without noise: the same tokens and logprobs, so generate used exactly
    // the copies (and no other weight changed).
    auto written = make_policy(GetParam(), 5);
    {
        at::NoGradGuard g;
        const CausalLM &src = noisy_policy->model();
        CausalLM &dst = written->model();
        for (size_t i = 0; i < src.model->layers.size(); ++i) {
            dst.model->layers[i]->input_layernorm->weight.copy_(
                noisy.noisy_norms().at(src.model->layers[i]->input_layernorm.get()));
            dst.model->layers[i]->post_attention_layernorm->weight.copy_(
                noisy.noisy_norms().at(src.model->layers[i]->post_attention_layernorm.get()));
        }
        dst.model->norm->weight.copy_(noisy.noisy_norms().at(src.model->norm.get()));
    }
    Engine plain_written(written, EngineConfig{});
    const Generation a = noisy.generate(kPrompts, sampling());
    const Generation b = plain_written.generate(kPrompts, sampling());
    EXPECT_EQ(a.token_ids, b.token_ids);
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t i = 0; i < a.logprobs.size(); ++i) EXPECT_FLOAT_EQ(a.logprobs[i], b.logprobs[i]);

    // Episodes sample with the noise too: a one-turn episode is generate's
    // sample of the same seed.
    const Episodes eps =
        noisy.generate_episodes(kPrompts, sampling(), EpisodeOptions{}, [](const TurnEnd &) {
            TurnReply r;
            r.done = true;
            return r;
        });
    ASSERT_EQ(eps.episodes.size(), static_cast<size_t>(a.samples()));
    for (size_t i = 0; i < eps.episodes.size(); ++i) {
        const auto from = a.token_ids.begin() + a.cu_seqlens[i];
        const auto to = a.token_ids.begin() + a.cu_seqlens[i + 1];
        EXPECT_EQ(eps.episodes[i].tokens, std::vector<int64_t>(from, to)) << "episode " << i;
        const auto lp = a.logprobs.begin() + a.cu_seqlens[i];
        ASSERT_EQ(eps.episodes[i].logprobs.size(), static_cast<size_t>(to - from));
        for (size_t t = 0; t < eps.episodes[i].logprobs.size(); ++t)
            EXPECT_FLOAT_EQ(eps.episodes[i].logprobs[t], lp[static_cast<int64_t>(t)])
                << "episode " << i << " token " << t;
    }

    // The clean model samples otherwise (the noise reaches the logprobs).
    auto clean_policy = make_policy(GetParam(), 5);
    clean_policy->set_version(4);
    Engine clean(clean_policy, EngineConfig{});
    const Generation c = clean.generate(kPrompts, sampling());
    ASSERT_FALSE(c.logprobs.empty());
    bool differs = c.token_ids != a.token_ids;
    for (size_t i = 0; !differs && i < c.logprobs.size(); ++i)
        differs = std::abs(c.logprobs[i] - a.logprobs[i]) > 1e-6f;
    EXPECT_TRUE(differs);

    // A forward outside generate (the trainer's) reads the clean weights.
    const PackedBatch batch = PackedBatch::from_sequences(kPrompts);
    at::NoGradGuard g;
    EXPECT_TRUE(
        at::equal(noisy_policy->model().logits(batch), clean_policy->model().logits(batch)));
}

namespace {

// The scheduler's config of the engine's noise (noisy_config).
SchedulerConfig noisy_scheduler(uint64_t seed) {
    const EngineConfig e = noisy_config(seed);
    SchedulerConfig c;
    c.max_running = 4;
    c.noise = e.noise;
    c.total_steps = e.total_steps;
    c.seed = e.seed;
    return c;
}

struct Served {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
};

// One request per prompt (sample 0, sampling()'s seed) through `s`.
std::vector<Served> serve(Scheduler &s) {
    SamplingParams sp = sampling();
    sp.n = 1;
    std::vector<std::promise<RequestResult>> done(kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
        ServeRequest r;
        r.prompt = kPrompts[i];
        r.params = sp;
        r.on_done = [&done, i](RequestResult res) { done[i].set_value(std::move(res)); };
        s.submit(std::move(r));
    }
    std::vector<Served> out;
    for (auto &d : done) {
        auto f = d.get_future();
        if (f.wait_for(std::chrono::seconds(120)) != std::future_status::ready)
            throw std::runtime_error("a served request did not end within 120 s");
        RequestResult res = f.get();
        EXPECT_NE(res.end, RequestEnd::Error) << res.error;
        out.push_back({res.tokens, res.logprobs});
    }
    return out;
}

// Engine::generate's sample 0 of each prompt (sampling()'s seed, n = 1).
std::vector<Served> generate(Engine &e) {
    SamplingParams sp = sampling();
    sp.n = 1;
    std::vector<Served> out;
    for (const auto &p : kPrompts) {
        const Generation g = e.generate({p}, sp);
        out.push_back({g.token_ids, g.logprobs});
    }
    return out;
}

void expect_same(const std::vector<Served> &a, const std::vector<Served> &b, const char *what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].tokens, b[i].tokens) << what << ", prompt " << i;
        ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size()) << what << ", prompt " << i;
        for (size_t t = 0; t < a[i].logprobs.size(); ++t)
            EXPECT_NEAR(a[i].logprobs[t], b[i].logprobs[t], 1e-5)
                << what << ", prompt " << i << " token " << t;
    }
}

bool differ(const std::vector<Served> &a, const std::vector<Served> &b) {
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].tokens != b[i].tokens) return true;
        for (size_t t = 0; t < a[i].logprobs.size(); ++t)
            if (std::abs(a[i].logprobs[t] - b[i].logprobs[t]) > 1e-4f) return true;
    }
    return false;
}

} // namespace

// The serving scheduler (rlhost serve) applies the engine's schedule to every
// weight version it adopts: in the first stage it samples as a clean one; a
// weight update (exclusive) to a noisy version gives the scheduled sigma and
// exactly the co-located engine's noisy samples for that seed and version,
// which differ from the clean model's.
TEST_P(QerlNoise, TheServingSchedulerSamplesWithTheEnginesNoiseAtEveryVersion) {
    auto served_policy = make_policy(GetParam(), 5);
    auto clean_policy = make_policy(GetParam(), 5);
    Scheduler noisy(served_policy, noisy_scheduler(9));
    Scheduler clean(clean_policy, SchedulerConfig{});
    // Version 0: the first stage, noise-free.
    EXPECT_EQ(noisy.stats().noise_sigma, 0.0);
    const std::vector<Served> clean_v0 = serve(clean);
    expect_same(serve(noisy), clean_v0, "first stage");

    // A weight update to version 4 (stage 2 of 10 steps in 5 stages).
    noisy.exclusive([&] { served_policy->set_version(4); });
    const EngineConfig ec = noisy_config(9);
    const double sigma = ec.noise.sigma(4, ec.total_steps);
    ASSERT_GT(sigma, 0.0);
    EXPECT_EQ(noisy.stats().version, 4);
    EXPECT_EQ(noisy.stats().noise_sigma, sigma);
    auto engine_policy = make_policy(GetParam(), 5);
    engine_policy->set_version(4);
    Engine engine(engine_policy, noisy_config(9));
    ASSERT_EQ(engine.noise_sigma(), sigma);
    const std::vector<Served> served_v4 = serve(noisy);
    expect_same(served_v4, generate(engine), "version 4");
    clean.exclusive([&] { clean_policy->set_version(4); });
    EXPECT_TRUE(differ(served_v4, serve(clean))) << "the noise did not reach the samples";
    // The served model's own weights stay clean.
    const PackedBatch batch = PackedBatch::from_sequences(kPrompts);
    at::NoGradGuard g;
    EXPECT_TRUE(
        at::equal(served_policy->model().logits(batch), clean_policy->model().logits(batch)));
}

TEST(QerlConfig, TheSchedulerRefusesBadNoiseSettingsNamingTheKey) {
    auto policy = make_policy("tiny", 1);
    SchedulerConfig c = noisy_scheduler(1);
    c.noise.sigma_start = 0;
    EXPECT_NE(
        error_of([&] { Scheduler s(policy, c); }).find("noise_scheduler.sigma_start must be > 0"),
        std::string::npos);
    c = noisy_scheduler(1);
    c.noise.num_stages = 1;
    EXPECT_NE(
        error_of([&] { Scheduler s(policy, c); }).find("noise_scheduler.num_stages must be >= 2"),
        std::string::npos);
    c = noisy_scheduler(1);
    c.total_steps = 0;
    EXPECT_NE(error_of([&] { Scheduler s(policy, c); }).find("needs total_steps > 0"),
              std::string::npos);
}

TEST_P(QerlNoise, NoiseIsDeterministicGivenTheSeedAndVersionAndResumesAlike) {
    auto p1 = make_policy(GetParam(), 3), p2 = make_policy(GetParam(), 3);
    Engine e1(p1, noisy_config(7)), e2(p2, noisy_config(7));
    // e1 syncs through the run; e2 is a fresh engine over a policy restored at
    // version 5 (a resumed run): same sigma, same noise.
    for (int64_t v = 1; v <= 5; ++v) {
        p1->set_version(v);
        e1.sync_weights();
    }
    p2->set_version(5);
    Engine resumed(p2, noisy_config(7));
    EXPECT_EQ(resumed.noise_sigma(), e1.noise_sigma());
    auto same = [](const Engine &a, const Engine &b, const CausalLM &ma, const CausalLM &mb) {
        bool all = a.noisy_norms().size() == b.noisy_norms().size();
        for (size_t i = 0; all && i < ma.model->layers.size(); ++i)
            all =
                at::equal(a.noisy_norms().at(ma.model->layers[i]->input_layernorm.get()),
                          b.noisy_norms().at(mb.model->layers[i]->input_layernorm.get())) &&
                at::equal(a.noisy_norms().at(ma.model->layers[i]->post_attention_layernorm.get()),
                          b.noisy_norms().at(mb.model->layers[i]->post_attention_layernorm.get()));
        return all && at::equal(a.noisy_norms().at(ma.model->norm.get()),
                                b.noisy_norms().at(mb.model->norm.get()));
    };
    EXPECT_TRUE(same(e1, resumed, p1->model(), p2->model()));
    // Syncing the same version again draws the same noise.
    e1.sync_weights();
    EXPECT_TRUE(same(e1, resumed, p1->model(), p2->model()));

    // Another seed, or another version of the same stage: other noise.
    Engine other_seed(p2, noisy_config(8));
    EXPECT_EQ(other_seed.noise_sigma(), resumed.noise_sigma());
    EXPECT_FALSE(same(other_seed, resumed, p2->model(), p2->model()));
    p2->set_version(4); // stage 2 as version 5
    Engine other_version(p2, noisy_config(7));
    EXPECT_EQ(other_version.noise_sigma(), resumed.noise_sigma());
    EXPECT_FALSE(same(other_version, resumed, p2->model(), p2->model()));
}

TEST(QerlNoiseSteps, TheScheduleStartsAtFirstStepAfterAWarmUp) {
    // 100 supervised warm-up steps before the RL loop: version 100 is the
    // schedule's step 0, version 104 its step 4.
    auto policy = make_policy("tiny", 3);
    EngineConfig cfg = noisy_config(7);
    cfg.first_step = 100;
    policy->set_version(100);
    Engine engine(policy, cfg);
    EXPECT_EQ(engine.noise_sigma(), 0.0);
    EXPECT_TRUE(engine.noisy_norms().empty());
    policy->set_version(104);
    engine.sync_weights();
    EXPECT_EQ(engine.noise_sigma(), cfg.noise.sigma(4, cfg.total_steps));
    EXPECT_GT(engine.noise_sigma(), 0.0);
    // Before first_step (a warm-up still running): no noise.
    policy->set_version(50);
    engine.sync_weights();
    EXPECT_EQ(engine.noise_sigma(), 0.0);
    EXPECT_EQ(EngineConfig::from_json(R"({"first_step": 7})").first_step, 7);
    EXPECT_NE(error_of([] {
                  EngineConfig::from_json(R"({"first_step": -1})");
              }).find("engine.first_step"),
              std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, QerlNoise, ::testing::Values("tiny", "tiny-moe"),
                         [](const auto &info) {
                             return info.param == "tiny" ? std::string("Dense")
                                                         : std::string("Moe");
                         });

TEST(QerlConfig, NoiseSettingsAreReadNestedOrDotted) {
    const EngineConfig nested = EngineConfig::from_json(
        R"({"noise_scheduler": {"enabled": true, "sigma_start": 0.02, "sigma_end": 0.001,
            "num_stages": 4}, "total_steps": 40, "seed": 3})");
    EXPECT_TRUE(nested.noise.enabled);
    EXPECT_EQ(nested.noise.sigma_start, 0.02);
    EXPECT_EQ(nested.noise.sigma_end, 0.001);
    EXPECT_EQ(nested.noise.num_stages, 4);
    EXPECT_EQ(nested.total_steps, 40);
    EXPECT_EQ(nested.seed, 3u);
    const EngineConfig dotted = EngineConfig::from_json(
        R"({"noise_scheduler.enabled": true, "noise_scheduler.num_stages": 4, "total_steps": 8})");
    EXPECT_TRUE(dotted.noise.enabled);
    EXPECT_EQ(dotted.noise.num_stages, 4);
    // Surogate's defaults.
    const EngineConfig d = EngineConfig::from_json("");
    EXPECT_FALSE(d.noise.enabled);
    EXPECT_EQ(d.noise.sigma_start, 5e-2);
    EXPECT_EQ(d.noise.sigma_end, 5e-4);
    EXPECT_EQ(d.noise.num_stages, 10);
}

TEST(QerlConfig, BadNoiseSettingsAreRefusedNamingTheKey) {
    auto refused = [](const std::string &json) {
        return error_of([&] { EngineConfig::from_json(json); });
    };
    EXPECT_NE(refused(R"({"noise_scheduler": {"sigma_start": 0}})")
                  .find("engine.noise_scheduler.sigma_start"),
              std::string::npos);
    EXPECT_NE(refused(R"({"noise_scheduler": {"sigma_end": -1e-3}})")
                  .find("engine.noise_scheduler.sigma_end"),
              std::string::npos);
    EXPECT_NE(refused(R"({"noise_scheduler": {"num_stages": 1}})")
                  .find("engine.noise_scheduler.num_stages"),
              std::string::npos);
    EXPECT_NE(refused(R"({"noise_scheduler": {"enabled": "yes"}})")
                  .find("engine.noise_scheduler.enabled"),
              std::string::npos);
    EXPECT_NE(refused(R"({"noise_scheduler": {"sigma": 0.1}})")
                  .find("unknown key 'engine.noise_scheduler.sigma'"),
              std::string::npos);
    EXPECT_NE(refused(R"({"noise_scheduler": 1})").find("engine.noise_scheduler"),
              std::string::npos);
    // Enabled without the run's length: nothing to schedule over.
    const std::string no_length = refused(R"({"noise_scheduler": {"enabled": true}})");
    EXPECT_NE(no_length.find("engine.noise_scheduler.enabled"), std::string::npos) << no_length;
    EXPECT_NE(no_length.find("engine.total_steps"), std::string::npos) << no_length;

    // A config built in C++ is checked by the engine.
    auto policy = make_policy("tiny", 1);
    EngineConfig c = noisy_config(1);
    c.noise.num_stages = 1;
    EXPECT_NE(error_of([&] { Engine e(policy, c); }).find("noise_scheduler.num_stages"),
              std::string::npos);
    c = noisy_config(1);
    c.noise.sigma_start = 0;
    EXPECT_NE(error_of([&] { Engine e(policy, c); }).find("noise_scheduler.sigma_start"),
              std::string::npos);
    c = noisy_config(1);
    c.total_steps = 0;
    EXPECT_NE(error_of([&] { Engine e(policy, c); }).find("total_steps"), std::string::npos);
}
