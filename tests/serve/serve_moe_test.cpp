// `rlhost serve` on a mixture-of-experts model (the tiny-moe preset) in
// process, over loopback HTTP: /generate with return_routed_experts answers
// the routing in meta_info as xorl-sglang encodes it (base64 of int32
// [prompt + completion - 1, L_moe, K], routed_expert_meta {shape, dtype}),
// equal to what Engine::generate records for the same prompt and seed; a
// dense model refuses the field with a 400.
#include "serve/http.hpp"
#include "serve/server.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using rl::serve::http_request;
using rl::serve::HttpResponse;
namespace core = rl::core;

std::string model_dir(const std::string &preset) {
    const auto d = std::filesystem::temp_directory_path() /
                   ("rl-serve-moe-test-" + preset + "-" + std::to_string(::getpid()));
    core::write_tiny_model(d.string(), 7, core::tiny_preset_spec(preset));
    return d.string();
}

struct Running {
    std::string dir;
    std::shared_ptr<core::Policy> policy;
    std::unique_ptr<rl::serve::Server> server;
    explicit Running(const std::string &preset, const json &options = json::object())
        : dir(model_dir(preset)), policy(core::Policy::load(dir)) {
        rl::serve::ServerConfig config = rl::serve::ServerConfig::from_json(options.dump());
        config.port = 0;
        config.model_path = dir;
        config.served_model_name = preset;
        server = std::make_unique<rl::serve::Server>(policy, config);
        server->start();
    }
    ~Running() {
        server.reset();
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    HttpResponse post(const json &body) const {
        return http_request(server->url(), "POST", "/generate", body.dump(), {}, 120);
    }
};

// Standard base64 to bytes (the test's own decoder).
std::vector<uint8_t> decode_bytes(const std::string &b64) {
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::vector<uint8_t> bytes;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : b64) {
        if (c == '=') break;
        const size_t v = alphabet.find(c);
        EXPECT_NE(v, std::string::npos) << "not base64: " << c;
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            bytes.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
        }
    }
    EXPECT_EQ(bytes.size() % 4, 0u);
    return bytes;
}

uint32_t le32(const std::vector<uint8_t> &bytes, size_t i) {
    return static_cast<uint32_t>(bytes[i]) | static_cast<uint32_t>(bytes[i + 1]) << 8 |
           static_cast<uint32_t>(bytes[i + 2]) << 16 | static_cast<uint32_t>(bytes[i + 3]) << 24;
}

// Little-endian int32 values of base64.
std::vector<int32_t> decode_int32(const std::string &b64) {
    const std::vector<uint8_t> bytes = decode_bytes(b64);
    std::vector<int32_t> out;
    for (size_t i = 0; i + 3 < bytes.size(); i += 4)
        out.push_back(static_cast<int32_t>(le32(bytes, i)));
    return out;
}

// Little-endian float32 values of base64.
std::vector<float> decode_float32(const std::string &b64) {
    const std::vector<uint8_t> bytes = decode_bytes(b64);
    std::vector<float> out;
    for (size_t i = 0; i + 3 < bytes.size(); i += 4) {
        const uint32_t u = le32(bytes, i);
        float f = 0;
        std::memcpy(&f, &u, 4);
        out.push_back(f);
    }
    return out;
}

TEST(ServeMoe, GenerateReturnsTheRoutingAsXorlSglangEncodesIt) {
    Running r("tiny-moe");
    const core::ModelConfig &mc = r.policy->model().config();
    const int64_t L = mc.num_hidden_layers, K = mc.num_experts_per_tok; // every layer sparse
    const std::vector<std::vector<int64_t>> prompts = {{'a', 'b', 'c', ' '}, {'m', 'o', 'e'}};
    const json body = {
        {"input_ids", prompts},
        {"sampling_params", {{"max_new_tokens", 6}, {"temperature", 1.0}, {"sampling_seed", 5}}},
        {"return_routed_experts", true}};
    const HttpResponse resp = r.post(body);
    ASSERT_EQ(resp.status, 200) << resp.body;
    const json out = json::parse(resp.body);
    ASSERT_EQ(out.size(), 2u);

    core::Engine engine(r.policy);
    for (size_t i = 0; i < prompts.size(); ++i) {
        const json &meta = out[i]["meta_info"];
        const auto ids = out[i]["output_ids"].get<std::vector<int64_t>>();
        const int64_t rows = static_cast<int64_t>(prompts[i].size() + ids.size()) - 1;
        ASSERT_TRUE(meta.contains("routed_experts")) << meta.dump();
        EXPECT_EQ(meta["routed_expert_meta"], json({{"shape", {rows, L, K}}, {"dtype", "int32"}}));
        const std::vector<int32_t> got = decode_int32(meta["routed_experts"].get<std::string>());
        ASSERT_EQ(static_cast<int64_t>(got.size()), rows * L * K);
        for (int32_t id : got) {
            EXPECT_GE(id, 0);
            EXPECT_LT(id, mc.num_experts);
        }

        // What Engine::generate records for the same prompt and seed: the
        // same tokens, and these rows (its last row, never read, is -1).
        core::SamplingParams sp;
        sp.max_tokens = 6;
        sp.temperature = 1.0;
        sp.seed = 5;
        sp.return_routed_experts = true;
        const core::Generation g = engine.generate({prompts[i]}, sp);
        EXPECT_EQ(g.token_ids, ids);
        ASSERT_EQ(static_cast<int64_t>(g.routed_experts.size()), (rows + 1) * L * K);
        EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()),
                  std::vector<int64_t>(g.routed_experts.begin(),
                                       g.routed_experts.begin() + rows * L * K));
    }

    // Not asked: no routing in the answer.
    const HttpResponse plain =
        r.post({{"input_ids", prompts[0]}, {"sampling_params", {{"max_new_tokens", 2}}}});
    ASSERT_EQ(plain.status, 200) << plain.body;
    EXPECT_FALSE(json::parse(plain.body)["meta_info"].contains("routed_experts"));
}

// xorl-sglang's return_expert_logits: meta_info "expert_logits" (base64 of
// float32 [prompt + completion - 1, L_moe, K]) with "expert_logits_meta", the
// weights each token's routed experts were mixed with: what Engine::generate
// records for the same prompt and seed, and what one packed forward over the
// sequence mixes them with. Without return_routed_experts: a 400 naming it.
TEST(ServeMoe, GenerateReturnsTheExpertWeightsAsXorlSglangEncodesThem) {
    Running r("tiny-moe");
    const core::ModelConfig &mc = r.policy->model().config();
    const int64_t L = mc.num_hidden_layers, K = mc.num_experts_per_tok; // every layer sparse
    const std::vector<int64_t> prompt = {'w', 'e', 'i', 'g', 'h'};
    const json body = {
        {"input_ids", prompt},
        {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 1.0}, {"sampling_seed", 3}}},
        {"return_routed_experts", true},
        {"return_expert_logits", true}};
    const HttpResponse resp = r.post(body);
    ASSERT_EQ(resp.status, 200) << resp.body;
    const json out = json::parse(resp.body);
    const json &meta = out["meta_info"];
    const auto ids = out["output_ids"].get<std::vector<int64_t>>();
    const int64_t rows = static_cast<int64_t>(prompt.size() + ids.size()) - 1;
    ASSERT_TRUE(meta.contains("expert_logits")) << meta.dump();
    EXPECT_EQ(meta["expert_logits_meta"], json({{"shape", {rows, L, K}}, {"dtype", "float32"}}));
    const std::vector<float> got = decode_float32(meta["expert_logits"].get<std::string>());
    ASSERT_EQ(static_cast<int64_t>(got.size()), rows * L * K);

    // Engine::generate, same prompt and seed: the same tokens and weights
    // (its last row, never read, 0).
    core::SamplingParams sp;
    sp.max_tokens = 5;
    sp.temperature = 1.0;
    sp.seed = 3;
    sp.return_routed_experts = true;
    sp.return_expert_logits = true;
    core::Engine engine(r.policy);
    const core::Generation g = engine.generate({prompt}, sp);
    EXPECT_EQ(g.token_ids, ids);
    ASSERT_EQ(g.routed_expert_weights.size(), g.routed_experts.size());
    ASSERT_EQ(static_cast<int64_t>(g.routed_expert_weights.size()), (rows + 1) * L * K);
    for (int64_t i = 0; i < rows * L * K; ++i)
        EXPECT_NEAR(got[static_cast<size_t>(i)], g.routed_expert_weights[static_cast<size_t>(i)],
                    1e-5)
            << i;
    for (int64_t i = rows * L * K; i < (rows + 1) * L * K; ++i)
        EXPECT_EQ(g.routed_expert_weights[static_cast<size_t>(i)], 0.0f);

    // One packed forward over prompt + completion: the weights its routers
    // mix the experts with.
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), ids.begin(), ids.end());
    core::PackedBatch pb;
    pb.input_ids = at::tensor(seq, at::kLong);
    pb.cu_seqlens =
        at::tensor(std::vector<int64_t>{0, static_cast<int64_t>(seq.size())}, at::kLong);
    at::Tensor want;
    {
        at::NoGradGuard ng;
        core::RouterLogitsRecorder rec;
        r.policy->model().logits(pb);
        want = core::routed_expert_weights_of(rec.logits(), K, mc.norm_topk_prob);
    }
    const float *w = want.data_ptr<float>();
    for (int64_t i = 0; i < rows * L * K; ++i)
        EXPECT_NEAR(got[static_cast<size_t>(i)], w[i], 1e-5) << i;

    // The weights alone are refused, naming the field.
    const HttpResponse alone = r.post({{"input_ids", prompt},
                                       {"sampling_params", {{"max_new_tokens", 2}}},
                                       {"return_expert_logits", true}});
    EXPECT_EQ(alone.status, 400) << alone.body;
    EXPECT_NE(alone.body.find("return_expert_logits"), std::string::npos) << alone.body;
    EXPECT_NE(alone.body.find("needs return_routed_experts"), std::string::npos) << alone.body;
    // Ids without weights: no expert_logits.
    const HttpResponse ids_only = r.post({{"input_ids", prompt},
                                          {"sampling_params", {{"max_new_tokens", 2}}},
                                          {"return_routed_experts", true}});
    ASSERT_EQ(ids_only.status, 200) << ids_only.body;
    EXPECT_FALSE(json::parse(ids_only.body)["meta_info"].contains("expert_logits"));
}

// rlhost serve's QeRL noise options (--noise-total-steps, ...): the first
// stage serves the clean model; after a weight update to a noisy version
// /get_server_info reports the scheduled sigma and /generate samples what a
// co-located engine with the same schedule samples at that version. A noise
// setting without the run's length is refused naming the option.
TEST(ServeMoe, TheServerSamplesWithTheQerlNoiseOfEachWeightVersion) {
    const json options = {{"noise_total_steps", 10},
                          {"noise_num_stages", 5},
                          {"noise_sigma_start", 0.05},
                          {"noise_sigma_end", 0.0005},
                          {"noise_seed", 9}};
    Running r("tiny-moe", options);
    const std::vector<int64_t> prompt = {'n', 'o', 'i', 's', 'e'};
    const json body = {
        {"input_ids", prompt},
        {"sampling_params", {{"max_new_tokens", 8}, {"temperature", 1.0}, {"sampling_seed", 4}}},
        {"return_logprob", true}};
    auto info = [&] {
        const HttpResponse i = http_request(r.server->url(), "GET", "/get_server_info", "", {}, 60);
        EXPECT_EQ(i.status, 200) << i.body;
        return json::parse(i.body);
    };
    auto sample = [&](core::Engine &e) {
        core::SamplingParams sp;
        sp.max_tokens = 8;
        sp.temperature = 1.0;
        sp.seed = 4;
        return e.generate({prompt}, sp);
    };
    auto lps = [](const json &out) {
        std::vector<double> v;
        for (const auto &t : out["meta_info"]["output_token_logprobs"])
            v.push_back(t[0].get<double>());
        return v;
    };
    EXPECT_EQ(info()["noise_scheduler"]["total_steps"], 10);
    EXPECT_EQ(info()["scheduler"]["noise_sigma"], 0.0);
    // Version 0, the first stage: the clean model's samples.
    core::Engine clean(r.policy);
    const json v0 = json::parse(r.post(body).body);
    EXPECT_EQ(v0["output_ids"].get<std::vector<int64_t>>(), sample(clean).token_ids);

    // A weight update to version 4: stage 2 of 5.
    r.server->scheduler().exclusive([&] { r.policy->set_version(4); });
    core::EngineConfig ec;
    ec.noise.enabled = true;
    ec.noise.num_stages = 5;
    ec.total_steps = 10;
    ec.seed = 9;
    const double sigma = ec.noise.sigma(4, 10);
    ASSERT_GT(sigma, 0.0);
    EXPECT_DOUBLE_EQ(info()["scheduler"]["noise_sigma"].get<double>(), sigma);
    const json v4 = json::parse(r.post(body).body);
    auto twin = core::Policy::load(r.dir); // the same weights, its own engine
    twin->set_version(4);
    core::Engine noisy(twin, ec);
    const core::Generation g = sample(noisy);
    EXPECT_EQ(v4["output_ids"].get<std::vector<int64_t>>(), g.token_ids);
    const std::vector<double> got = lps(v4);
    ASSERT_EQ(got.size(), g.logprobs.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], g.logprobs[i], 1e-5) << i;
    // ... which the clean model does not sample.
    clean.sync_weights();
    const core::Generation c = sample(clean);
    bool differs = c.token_ids != g.token_ids;
    for (size_t i = 0; !differs && i < c.logprobs.size(); ++i)
        differs = std::abs(c.logprobs[i] - g.logprobs[i]) > 1e-4;
    EXPECT_TRUE(differs);

    try {
        rl::serve::ServerConfig::from_json(R"({"noise_sigma_start": 0.1})");
        ADD_FAILURE() << "noise_sigma_start without noise_total_steps was accepted";
    } catch (const std::exception &e) {
        EXPECT_NE(std::string(e.what()).find("noise_sigma_start"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("needs noise_total_steps"), std::string::npos)
            << e.what();
    }
}

TEST(ServeMoe, ADenseModelRefusesReturnRoutedExpertsNamingTheField) {
    Running r("tiny");
    const HttpResponse resp = r.post({{"text", "abc"},
                                      {"sampling_params", {{"max_new_tokens", 2}}},
                                      {"return_routed_experts", true}});
    EXPECT_EQ(resp.status, 400) << resp.body;
    EXPECT_NE(resp.body.find("return_routed_experts"), std::string::npos) << resp.body;
    EXPECT_NE(resp.body.find("no sparse mixture-of-experts layer"), std::string::npos) << resp.body;
}

} // namespace
