// `rlhost serve` on a mixture-of-experts model (the tiny-moe preset) in
// process, over loopback HTTP: /generate with return_routed_experts answers
// the routing in meta_info as xorl-sglang encodes it (base64 of int32
// [prompt + completion - 1, L_moe, K], routed_expert_meta {shape, dtype}),
// equal to what Engine::generate records for the same prompt and seed; a
// dense model refuses the field with a 400.
#include "serve/http.hpp"
#include "serve/server.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
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
    explicit Running(const std::string &preset)
        : dir(model_dir(preset)), policy(core::Policy::load(dir)) {
        rl::serve::ServerConfig config;
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

// Standard base64 to little-endian int32 values (the test's own decoder).
std::vector<int32_t> decode_int32(const std::string &b64) {
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
    std::vector<int32_t> out;
    for (size_t i = 0; i + 3 < bytes.size(); i += 4)
        out.push_back(static_cast<int32_t>(
            static_cast<uint32_t>(bytes[i]) | static_cast<uint32_t>(bytes[i + 1]) << 8 |
            static_cast<uint32_t>(bytes[i + 2]) << 16 | static_cast<uint32_t>(bytes[i + 3]) << 24));
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
