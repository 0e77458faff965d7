// The inference server (host/serve) in process on the built-in tiny model,
// driven over loopback HTTP with the server's own client: OpenAI-compatible
// and SGLang-native results equal the engine's and the trainer's numbers,
// bad requests are refused by name while the server keeps serving, and
// back-pressure, disconnects and the API key behave.
#include "serve/chat_tools.hpp"
#include "serve/http.hpp"
#include "serve/server.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/lora.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using nlohmann::json;
using rl::serve::http_request;
using rl::serve::HttpResponse;
using namespace std::chrono_literals;

namespace core = rl::core;

/// The tiny model folder, written once per test program.
const std::string &tiny_dir() {
    static const std::string dir = [] {
        const auto d = std::filesystem::temp_directory_path() /
                       ("rl-serve-test-" + std::to_string(::getpid()));
        core::write_tiny_model(d.string(), 7);
        static const std::string path = d.string();
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        });
        return d.string();
    }();
    return dir;
}

std::shared_ptr<core::Policy> load_tiny() {
    return core::Policy::load(tiny_dir());
}

/// A server on a free loopback port.
struct Running {
    std::shared_ptr<core::Policy> policy;
    std::unique_ptr<rl::serve::Server> server;
    explicit Running(rl::serve::ServerConfig config = {}, const std::string &dir = tiny_dir())
        : policy(core::Policy::load(dir)) {
        config.port = 0;
        config.model_path = dir;
        if (config.served_model_name.empty()) config.served_model_name = "tiny";
        server = std::make_unique<rl::serve::Server>(policy, config);
        server->start();
    }
    HttpResponse post(const std::string &path, const json &body,
                      const rl::serve::Headers &headers = {}) const {
        return http_request(server->url(), "POST", path, body.dump(), headers, 120);
    }
    HttpResponse post_raw(const std::string &path, const std::string &body) const {
        return http_request(server->url(), "POST", path, body, {}, 120);
    }
    HttpResponse get(const std::string &path, const rl::serve::Headers &headers = {}) const {
        return http_request(server->url(), "GET", path, "", headers, 120);
    }
    json post_ok(const std::string &path, const json &body) const {
        const HttpResponse r = post(path, body);
        EXPECT_EQ(r.status, 200) << path << ": " << r.body;
        return json::parse(r.body);
    }
    /// Waits (bounded) until `pred` holds for the scheduler's stats.
    bool wait_stats(const std::function<bool(const core::Scheduler::Stats &)> &pred,
                    std::chrono::seconds limit = 60s) const {
        const auto until = std::chrono::steady_clock::now() + limit;
        while (std::chrono::steady_clock::now() < until) {
            if (pred(server->scheduler().stats())) return true;
            std::this_thread::sleep_for(10ms);
        }
        return false;
    }
    /// A /generate of 1500 tokens (ignore_eos; `extra` fields added) on a
    /// thread, its answer into `out`.
    std::thread long_generate(HttpResponse &out, const json &extra = json::object()) const {
        json body = {{"text", "abc"},
                     {"sampling_params", {{"max_new_tokens", 1500}, {"ignore_eos", true}}}};
        body.update(extra);
        return std::thread([this, &out, body] { out = post("/generate", body); });
    }
};

/// One server for the tests that need nothing special of it.
Running &shared() {
    static Running r;
    return r;
}

/// The trainer's logprobs (temperature 1) of `completion` after `prompt`.
std::vector<float> trainer_logprobs(core::Policy &policy, const std::vector<int64_t> &prompt,
                                    const std::vector<int64_t> &completion) {
    c10::InferenceMode guard;
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), completion.begin(), completion.end());
    auto batch = core::PackedBatch::from_sequences({seq});
    std::vector<int64_t> labels(seq.begin() + 1, seq.end());
    labels.push_back(-100);
    const at::Tensor lp =
        policy.model().token_logprobs(batch, at::tensor(labels, at::kLong)).logprobs.contiguous();
    std::vector<float> out;
    for (size_t i = 0; i < completion.size(); ++i)
        out.push_back(lp[static_cast<int64_t>(prompt.size() + i - 1)].item<float>());
    return out;
}

std::vector<int64_t> ids_of(const json &j) {
    return j.get<std::vector<int64_t>>();
}

/// Engine::generate on a policy of its own (the same weights, not shared with
/// the server's scheduler thread).
core::Generation engine_generate(const std::vector<int64_t> &prompt, core::SamplingParams params) {
    auto own = load_tiny();
    core::Engine engine(own);
    return engine.generate({prompt}, params);
}

// ---- results equal the engine's and the trainer's ---------------------------------------

TEST(ServeOpenAI, CompletionLogprobsEqualTheTrainersLogprobsOfTheSameTokens) {
    Running &s = shared();
    const json j = s.post_ok("/v1/completions", {{"model", "tiny"},
                                                 {"prompt", "Reverse: abc\n"},
                                                 {"max_tokens", 12},
                                                 {"temperature", 1.0},
                                                 {"logprobs", 2},
                                                 {"seed", 5},
                                                 {"ignore_eos", true},
                                                 {"return_token_ids", true}});
    ASSERT_EQ(j["object"], "text_completion");
    ASSERT_EQ(j["choices"].size(), 1u);
    const json &c = j["choices"][0];
    const auto prompt = ids_of(c["prompt_token_ids"]);
    const auto tokens = ids_of(c["token_ids"]);
    ASSERT_EQ(tokens.size(), 12u);
    EXPECT_EQ(c["finish_reason"], "length");
    const auto want = trainer_logprobs(*s.policy, prompt, tokens);
    const json &lp = c["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), tokens.size());
    ASSERT_EQ(lp["top_logprobs"].size(), tokens.size());
    ASSERT_EQ(lp["text_offset"].size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want[i], 1e-5) << "token " << i;
        // Alternatives whose text collides (bytes that decode to U+FFFD) share a key.
        EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + 12);
}

TEST(ServeOpenAI, ChatLogprobsEqualTheTrainersLogprobsAndThePromptIsTheChatTemplates) {
    Running &s = shared();
    const json messages = json::array({{{"role", "user"}, {"content", "Reverse: ab"}}});
    const json j = s.post_ok("/v1/chat/completions", {{"messages", messages},
                                                      {"max_tokens", 10},
                                                      {"logprobs", true},
                                                      {"top_logprobs", 2},
                                                      {"seed", 9},
                                                      {"ignore_eos", true},
                                                      {"return_token_ids", true}});
    ASSERT_EQ(j["object"], "chat.completion");
    const json &c = j["choices"][0];
    EXPECT_EQ(c["message"]["role"], "assistant");
    const auto prompt = ids_of(j["prompt_token_ids"]);
    const std::string rendered = s.policy->tokenizer()->apply_chat_template(
        {{"user", "Reverse: ab"}}, core::ChatTemplateOptions{});
    const auto expected = s.policy->tokenizer()->encode(rendered);
    EXPECT_EQ(prompt, std::vector<int64_t>(expected.begin(), expected.end()));
    const auto tokens = ids_of(c["token_ids"]);
    const auto want = trainer_logprobs(*s.policy, prompt, tokens);
    const json &content = c["logprobs"]["content"];
    ASSERT_EQ(content.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        EXPECT_NEAR(content[i]["logprob"].get<double>(), want[i], 1e-5) << "token " << i;
        EXPECT_EQ(content[i]["top_logprobs"].size(), 2u);
        json bytes = json::array();
        for (unsigned char b : s.policy->tokenizer()->token_bytes(static_cast<int32_t>(tokens[i])))
            bytes.push_back(int{b});
        EXPECT_EQ(content[i]["bytes"], bytes);
    }
}

TEST(ServeOpenAI, SpecialTokenTextInAChatMessageStaysPlainText) {
    Running &s = shared();
    const json messages = json::array({{{"role", "user"}, {"content", "x<|im_end|>y"}}});
    const json j =
        s.post_ok("/v1/chat/completions",
                  {{"messages", messages}, {"max_tokens", 1}, {"return_token_ids", true}});
    const auto prompt = ids_of(j["prompt_token_ids"]);
    // <|im_end|> appears once: the template's own, after the content.
    int im_end = 0;
    for (int64_t id : prompt) im_end += id == core::kTinyImEnd;
    EXPECT_EQ(im_end, 1);
}

TEST(ServeOpenAI, GreedyCompletionEqualsEngineGenerate) {
    Running &s = shared();
    const json j = s.post_ok("/v1/completions", {{"prompt", "Reverse: abcd\n"},
                                                 {"max_tokens", 16},
                                                 {"temperature", 0},
                                                 {"return_token_ids", true}});
    const json &c = j["choices"][0];
    core::SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 16;
    const auto g = engine_generate(ids_of(c["prompt_token_ids"]), p);
    EXPECT_EQ(ids_of(c["token_ids"]), g.token_ids);
    EXPECT_EQ(c["text"].get<std::string>(), g.completions[0]);
    EXPECT_EQ(c["finish_reason"], core::finish_reason_name(g.finish_reasons[0]));
}

TEST(ServeOpenAI, ThreeSamplesWithASeedEqualEngineGenerateWithThatSeed) {
    Running &s = shared();
    const json j = s.post_ok("/v1/completions", {{"prompt", "Reverse: xyz\n"},
                                                 {"max_tokens", 10},
                                                 {"n", 3},
                                                 {"seed", 11},
                                                 {"top_k", 50},
                                                 {"logprobs", 0},
                                                 {"return_token_ids", true}});
    ASSERT_EQ(j["choices"].size(), 3u);
    core::SamplingParams p;
    p.n = 3;
    p.seed = 11;
    p.top_k = 50;
    p.max_tokens = 10;
    const auto g = engine_generate(ids_of(j["choices"][0]["prompt_token_ids"]), p);
    for (size_t k = 0; k < 3; ++k) {
        const json &c = j["choices"][k];
        EXPECT_EQ(c["index"], k);
        const std::vector<int64_t> want(g.token_ids.begin() + g.cu_seqlens[k],
                                        g.token_ids.begin() + g.cu_seqlens[k + 1]);
        EXPECT_EQ(ids_of(c["token_ids"]), want) << "sample " << k;
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(c["logprobs"]["token_logprobs"][i].get<double>(),
                        g.logprobs[static_cast<size_t>(g.cu_seqlens[k]) + i], 1e-5);
    }
}

/// The events of a server-sent-event stream ("data: " payloads), until [DONE].
std::vector<std::string> sse_events(const std::string &body) {
    std::vector<std::string> out;
    size_t at = 0;
    while ((at = body.find("data: ", at)) != std::string::npos) {
        const size_t end = body.find("\n\n", at);
        out.push_back(body.substr(at + 6, end - at - 6));
        at = end;
    }
    return out;
}

TEST(ServeOpenAI, StreamedCompletionEqualsTheNonStreamedOne) {
    Running &s = shared();
    json req = {
        {"prompt", "Reverse: hello\n"}, {"max_tokens", 14}, {"seed", 3}, {"n", 2}, {"logprobs", 1},
        {"return_token_ids", true}};
    const json whole = s.post_ok("/v1/completions", req);
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    const HttpResponse r = s.post("/v1/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type"), "text/event-stream");
    const auto events = sse_events(r.body);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back(), "[DONE]");
    std::vector<std::string> text(2);
    std::vector<std::vector<int64_t>> tokens(2);
    std::vector<std::vector<double>> lps(2);
    std::vector<std::string> finish(2);
    json usage;
    for (size_t e = 0; e + 1 < events.size(); ++e) {
        const json j = json::parse(events[e]);
        if (j["choices"].empty()) {
            usage = j["usage"];
            continue;
        }
        const json &c = j["choices"][0];
        const size_t i = c["index"].get<size_t>();
        text[i] += c["text"].get<std::string>();
        if (c.contains("token_ids"))
            for (const auto &t : c["token_ids"]) tokens[i].push_back(t.get<int64_t>());
        if (!c["logprobs"].is_null())
            for (const auto &l : c["logprobs"]["token_logprobs"]) lps[i].push_back(l.get<double>());
        if (!c["finish_reason"].is_null()) finish[i] = c["finish_reason"].get<std::string>();
    }
    for (size_t i = 0; i < 2; ++i) {
        const json &c = whole["choices"][i];
        EXPECT_EQ(text[i], c["text"].get<std::string>()) << "choice " << i;
        EXPECT_EQ(tokens[i], ids_of(c["token_ids"])) << "choice " << i;
        EXPECT_EQ(finish[i], c["finish_reason"].get<std::string>());
        ASSERT_EQ(lps[i].size(), c["logprobs"]["token_logprobs"].size());
        for (size_t k = 0; k < lps[i].size(); ++k)
            EXPECT_NEAR(lps[i][k], c["logprobs"]["token_logprobs"][k].get<double>(), 1e-6);
    }
    EXPECT_EQ(usage, whole["usage"]);
}

TEST(ServeOpenAI, StreamedChatEqualsTheNonStreamedOne) {
    Running &s = shared();
    json req = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                {"max_tokens", 12},
                {"seed", 4},
                {"stop", json::array({"a", "b"})}};
    const json whole = s.post_ok("/v1/chat/completions", req);
    req["stream"] = true;
    const HttpResponse r = s.post("/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    const auto events = sse_events(r.body);
    ASSERT_EQ(events.back(), "[DONE]");
    std::string text, finish;
    bool role = false;
    for (size_t e = 0; e + 1 < events.size(); ++e) {
        const json j = json::parse(events[e]);
        EXPECT_EQ(j["object"], "chat.completion.chunk");
        const json &c = j["choices"][0];
        if (c["delta"].contains("role")) role = true;
        if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
        if (!c["finish_reason"].is_null()) finish = c["finish_reason"].get<std::string>();
    }
    EXPECT_TRUE(role);
    EXPECT_EQ(text, whole["choices"][0]["message"]["content"].get<std::string>());
    EXPECT_EQ(finish, whole["choices"][0]["finish_reason"].get<std::string>());
}

TEST(ServeOpenAI, ModelsListsTheServedModel) {
    const json j = json::parse(shared().get("/v1/models").body);
    ASSERT_EQ(j["data"].size(), 1u);
    EXPECT_EQ(j["data"][0]["id"], "tiny");
    EXPECT_EQ(j["object"], "list");
}

// ---- SGLang-native -------------------------------------------------------------------------

TEST(ServeSGLang, GenerateReturnsTokenLogprobTriplesEqualToTheEngines) {
    Running &s = shared();
    const std::vector<int64_t> prompt = {82, 101, 118, 58, 32, 97, 98, 10};
    const json j =
        s.post_ok("/generate",
                  {{"input_ids", prompt},
                   {"sampling_params",
                    {{"max_new_tokens", 8}, {"n", 2}, {"sampling_seed", 21}, {"temperature", 0.7}}},
                   {"return_logprob", true},
                   {"top_logprobs_num", 3},
                   {"return_text_in_logprobs", true}});
    ASSERT_TRUE(j.is_array());
    ASSERT_EQ(j.size(), 2u);
    core::SamplingParams p;
    p.n = 2;
    p.seed = 21;
    p.temperature = 0.7;
    p.max_tokens = 8;
    const auto g = engine_generate(prompt, p);
    for (size_t k = 0; k < 2; ++k) {
        const json &o = j[k];
        const std::vector<int64_t> want(g.token_ids.begin() + g.cu_seqlens[k],
                                        g.token_ids.begin() + g.cu_seqlens[k + 1]);
        EXPECT_EQ(ids_of(o["output_ids"]), want);
        EXPECT_EQ(o["text"].get<std::string>(), g.completions[k]);
        const json &meta = o["meta_info"];
        EXPECT_EQ(meta["prompt_tokens"], prompt.size());
        EXPECT_EQ(meta["completion_tokens"], want.size());
        ASSERT_EQ(meta["output_token_logprobs"].size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
            const json &t = meta["output_token_logprobs"][i];
            EXPECT_NEAR(t[0].get<double>(), g.logprobs[static_cast<size_t>(g.cu_seqlens[k]) + i],
                        1e-5);
            EXPECT_EQ(t[1], want[i]);
            EXPECT_TRUE(t[2].is_string());
            EXPECT_EQ(meta["output_top_logprobs"][i].size(), 3u);
        }
        EXPECT_TRUE(meta["finish_reason"].is_object());
    }
}

TEST(ServeSGLang, ScoringAPromptReturnsTheTrainersInputLogprobs) {
    Running &s = shared();
    const std::vector<int64_t> prompt = {72, 101, 108, 108, 111, 33};
    const json j = s.post_ok("/generate", {{"input_ids", prompt},
                                           {"sampling_params", {{"max_new_tokens", 0}}},
                                           {"return_logprob", true},
                                           {"logprob_start_len", 0}});
    const json &in = j["meta_info"]["input_token_logprobs"];
    ASSERT_EQ(in.size(), prompt.size());
    EXPECT_TRUE(in[0][0].is_null());
    const auto want = trainer_logprobs(*s.policy, {prompt[0]},
                                       std::vector<int64_t>(prompt.begin() + 1, prompt.end()));
    for (size_t i = 1; i < prompt.size(); ++i) {
        EXPECT_NEAR(in[i][0].get<double>(), want[i - 1], 1e-5);
        EXPECT_EQ(in[i][1], prompt[i]);
    }
    EXPECT_TRUE(j["output_ids"].empty());
}

TEST(ServeSGLang, GenerateTakesTextAndBatchesAndStreams) {
    Running &s = shared();
    const json one =
        s.post_ok("/generate", {{"text", "Reverse: ab\n"},
                                {"sampling_params", {{"max_new_tokens", 6}, {"temperature", 0}}}});
    ASSERT_TRUE(one.is_object());
    EXPECT_EQ(one["meta_info"]["completion_tokens"], one["output_ids"].size());
    const json batch = s.post_ok(
        "/generate", {{"text", {"a", "b", "c"}}, {"sampling_params", {{"max_new_tokens", 3}}}});
    ASSERT_TRUE(batch.is_array());
    EXPECT_EQ(batch.size(), 3u);
    const HttpResponse r =
        s.post("/generate", {{"text", "Reverse: ab\n"},
                             {"stream", true},
                             {"sampling_params", {{"max_new_tokens", 6}, {"temperature", 0}}}});
    ASSERT_EQ(r.status, 200);
    const auto events = sse_events(r.body);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.back(), "[DONE]");
    const json last = json::parse(events[events.size() - 2]);
    EXPECT_EQ(last["text"], one["text"]);
    EXPECT_EQ(last["output_ids"], one["output_ids"]);
    EXPECT_TRUE(last["meta_info"]["finish_reason"].is_object());
}

TEST(ServeSGLang, ControlRoutesPauseFlushReleaseAndReport) {
    Running s;
    EXPECT_EQ(s.get("/health").status, 200);
    EXPECT_EQ(s.get("/health_generate").status, 200);
    const json info = json::parse(s.get("/get_model_info").body);
    EXPECT_EQ(info["model_path"], tiny_dir());
    EXPECT_EQ(info["is_generation"], true);
    const json server_info = json::parse(s.get("/server_info").body);
    EXPECT_EQ(server_info["port"], s.server->port());
    EXPECT_EQ(s.post("/flush_cache", json::object()).status, 200);

    EXPECT_EQ(s.post("/pause_generation", {{"mode", "in_place"}}).status, 200);
    EXPECT_EQ(json::parse(s.get("/is_paused").body)["is_paused"], true);
    EXPECT_EQ(s.get("/health_generate").status, 503);
    // A request waits while paused; flush is refused meanwhile; continue ends it.
    HttpResponse waiting;
    std::thread t([&] {
        waiting = s.post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}});
    });
    EXPECT_TRUE(s.wait_stats([](const auto &st) { return st.queued + st.running == 1; }))
        << "the request never reached the scheduler";
    const HttpResponse busy = s.post("/flush_cache", json::object());
    EXPECT_EQ(busy.status, 400) << busy.body;
    EXPECT_EQ(s.post("/continue_generation", json::object()).status, 200);
    t.join();
    EXPECT_EQ(waiting.status, 200) << waiting.body;

    EXPECT_EQ(s.post("/release_memory_occupation", json::object()).status, 200);
    EXPECT_EQ(json::parse(s.get("/is_sleeping").body)["is_sleeping"], true);
    EXPECT_EQ(s.post("/release_memory_occupation", {{"tags", {"weights"}}}).status, 400);
    EXPECT_EQ(s.post("/resume_memory_occupation", json::object()).status, 200);
    EXPECT_EQ(json::parse(s.get("/is_sleeping").body)["is_sleeping"], false);
    EXPECT_EQ(s.post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 2}}).status, 200);

    // get_weights_by_name: the parameter's first rows.
    const HttpResponse w = s.get("/get_weights_by_name?name=model.norm.weight&truncate_size=5");
    ASSERT_EQ(w.status, 200) << w.body;
    const json values = json::parse(w.body);
    at::Tensor norm;
    for (const auto &[n, t2] : s.policy->model().named_weights())
        if (n == "model.norm.weight") norm = t2;
    ASSERT_EQ(values.size(), 5u);
    for (int64_t i = 0; i < 5; ++i)
        EXPECT_FLOAT_EQ(values[static_cast<size_t>(i)].get<float>(), norm[i].item<float>());
    EXPECT_EQ(s.get("/get_weights_by_name?name=nope").status, 404);
}

TEST(ServeSGLang, PauseWithAbortEndsRunningRequestsAsAborted) {
    Running s;
    HttpResponse r;
    std::thread t = s.long_generate(r);
    ASSERT_TRUE(s.wait_stats([](const auto &st) { return st.running == 1; }));
    EXPECT_EQ(s.post("/pause_generation", {{"mode", "abort"}}).status, 200);
    t.join();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["meta_info"]["finish_reason"]["type"], "abort");
    EXPECT_EQ(s.post("/continue_generation", json::object()).status, 200);
}

TEST(ServeSGLang, AbortRequestByRidCancelsIt) {
    Running s;
    HttpResponse r;
    std::thread t = s.long_generate(r, {{"rid", "mine"}});
    ASSERT_TRUE(s.wait_stats([](const auto &st) { return st.running == 1; }));
    const json a = s.post_ok("/abort_request", {{"rid", "mine"}});
    EXPECT_EQ(a["aborted"], 1);
    t.join();
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["meta_info"]["finish_reason"]["type"], "abort");
    EXPECT_EQ(json::parse(r.body)["meta_info"]["id"], "mine");
}

// ---- bad requests, limits, back-pressure --------------------------------------------------

struct Bad {
    std::string path, body, param, words;
};

TEST(ServeErrors, EveryBadRequestGets4xxNamingTheFieldAndTheServerKeepsServing) {
    Running &s = shared();
    const std::vector<Bad> cases = {
        {"/v1/completions", "{\"prompt\": \"a\",", "", "not valid JSON"},
        {"/v1/completions", "[1, 2]", "", "JSON object"},
        {"/v1/completions", R"({"prompt": "a", "bogus": 1})", "bogus", "unknown field 'bogus'"},
        {"/v1/completions", R"({"prompt": "a", "max_tokens": 1000000000})", "max_tokens",
         "max_tokens_limit"},
        {"/v1/completions", R"({"prompt": "a", "max_tokens": 3000})", "max_tokens", "context"},
        {"/v1/completions", R"({"prompt": [1, 99999]})", "prompt", "outside the vocabulary"},
        {"/v1/completions", R"({"prompt": [[1], [2, -1]]})", "prompt[1]", "outside the vocabulary"},
        {"/v1/completions", R"({"prompt": ""})", "prompt", "empty"},
        {"/v1/completions", R"({"max_tokens": 3})", "prompt", "required"},
        {"/v1/completions", R"({"prompt": "a", "temperature": "hot"})", "temperature",
         "must be a number"},
        {"/v1/completions", R"({"prompt": "a", "n": 0})", "n", "outside"},
        {"/v1/completions", R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens", "integer"},
        {"/v1/completions", R"({"prompt": "a", "stop": 5})", "stop", "string"},
        {"/v1/completions", R"({"prompt": "a", "logprobs": 50})", "logprobs", "maximum 20"},
        {"/v1/completions", R"({"prompt": "a", "echo": true})", "echo", "not supported"},
        {"/v1/completions", R"({"prompt": "a", "frequency_penalty": 0.5})", "frequency_penalty",
         "not supported"},
        {"/v1/completions", R"({"prompt": "a", "stop_token_ids": [100000]})", "stop_token_ids",
         "outside"},
        {"/v1/completions", R"({"prompt": {"x": 1}})", "prompt", "prompt must be"},
        {"/v1/chat/completions", R"({"messages": "hi"})", "messages", "list"},
        {"/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", "messages[0].role",
         "role"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
         "messages[0].content[0].type", "not supported"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", "top_logprobs",
         "logprobs: true"},
        {"/generate", R"({"input_ids": [1, 2], "text": "a"})", "", "exactly one"},
        {"/generate", R"({"input_ids": [1, 2], "sampling_params": {"foo": 1}})",
         "sampling_params.foo", "unknown field"},
        {"/generate", R"({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}})",
         "sampling_params.max_new_tokens", "outside"},
        {"/generate", R"({"input_ids": [[1, 2], [300]]})", "input_ids[1]",
         "outside the vocabulary"},
        {"/pause_generation", R"({"mode": "sideways"})", "mode", "sideways"},
        // Hostile shapes: nesting that would overflow the stack when the value is
        // copied or printed, and numbers past a double's range.
        {"/v1/completions",
         R"({"prompt": "a", "user": )" + std::string(100000, '[') + std::string(100000, ']') + "}",
         "", "nested deeper than 128 levels"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": "a"}], "tools": )" + std::string(5000, '['),
         "", "nested deeper than"},
        {"/v1/completions", R"({"prompt": "a", "temperature": 1e400})", "", "out of range"},
        {"/generate", R"({"input_ids": [1], "sampling_params": {"top_p": -1e400}})", "",
         "out of range"},
    };
    for (const Bad &b : cases) {
        const HttpResponse r = s.post_raw(b.path, b.body);
        EXPECT_GE(r.status, 400) << b.path << " " << b.body;
        EXPECT_LT(r.status, 500) << b.path << " " << b.body << ": " << r.body;
        const json j = json::parse(r.body, nullptr, false);
        ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
        const json &e = j["error"];
        EXPECT_EQ(e["code"], r.status);
        EXPECT_NE(e["message"].get<std::string>().find(b.words), std::string::npos)
            << b.body << " -> " << e["message"];
        if (!b.param.empty()) {
            EXPECT_EQ(e["param"], b.param) << b.body << " -> " << r.body;
        }
        // Still serving.
        ASSERT_EQ(s.get("/health").status, 200);
    }
    EXPECT_EQ(s.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}).status, 200);
    // Unknown routes and methods.
    EXPECT_EQ(s.get("/nowhere").status, 404);
    EXPECT_EQ(s.get("/v1/completions").status, 405);
    // The model name is checked.
    const HttpResponse m = s.post("/v1/completions", {{"prompt", "a"}, {"model", "gpt-9"}});
    EXPECT_EQ(m.status, 404);
}

TEST(ServeErrors, ABodyOverTheLimitGets413NamingTheLimit) {
    rl::serve::ServerConfig c;
    c.max_body_bytes = 64 << 10;
    Running s(c);
    const std::string big = "{\"prompt\": \"" + std::string(100 << 10, 'a') + "\"}";
    const HttpResponse r = s.post_raw("/v1/completions", big);
    EXPECT_EQ(r.status, 413);
    EXPECT_NE(r.body.find("65536"), std::string::npos) << r.body;
    EXPECT_EQ(s.get("/health").status, 200);
}

TEST(ServeErrors, AFullQueueAnswers503WithRetryAfter) {
    rl::serve::ServerConfig c;
    c.scheduler.max_running = 1;
    c.scheduler.max_queued = 1;
    Running s(c);
    ASSERT_EQ(s.post("/pause_generation", {{"mode", "keep"}}).status, 200);
    // One request takes the one slot, one the one queue place; both wait (paused).
    HttpResponse first, second;
    std::thread t1([&] {
        first = s.post("/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}});
    });
    std::thread t2([&] {
        second = s.post("/v1/completions", {{"prompt", "b"}, {"max_tokens", 2}});
    });
    ASSERT_TRUE(s.wait_stats([](const auto &st) { return st.queued + st.running == 2; }))
        << "the two requests never reached the scheduler";
    const HttpResponse full = s.post("/v1/completions", {{"prompt", "c"}, {"max_tokens", 2}});
    EXPECT_EQ(full.status, 503) << full.body;
    EXPECT_EQ(full.header("retry-after"), "1");
    ASSERT_EQ(s.post("/continue_generation", json::object()).status, 200);
    t1.join();
    t2.join();
    EXPECT_EQ(second.status, 200) << second.body;
    EXPECT_EQ(first.status, 200) << first.body;
}

TEST(ServeErrors, ConnectionsBeyondTheCapGet503) {
    rl::serve::ServerConfig c;
    c.max_connections = 1;
    Running s(c);
    // An idle connection holds the one place.
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(s.server->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    const HttpResponse r = s.get("/health");
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.header("retry-after"), "1");
    ::close(fd);
    // The place frees once the server notices the close.
    bool served = false;
    for (int i = 0; i < 200 && !served; ++i) {
        served = s.get("/health").status == 200;
        if (!served) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(served);
}

TEST(ServeErrors, WithAnApiKeyRequestsWithoutItGet401) {
    rl::serve::ServerConfig c;
    c.api_key = "sekrit";
    Running s(c);
    const HttpResponse none = s.get("/v1/models");
    EXPECT_EQ(none.status, 401);
    EXPECT_EQ(json::parse(none.body)["error"]["type"], "authentication_error");
    EXPECT_EQ(s.get("/v1/models", {{"Authorization", "Bearer wrong"}}).status, 401);
    EXPECT_EQ(s.get("/v1/models", {{"Authorization", "Bearer sekrit"}}).status, 200);
    EXPECT_EQ(s.post("/generate", {{"text", "a"}}).status, 401);
    EXPECT_EQ(s.get("/health").status, 200);
}

// ---- concurrency and disconnects ----------------------------------------------------------

TEST(ServeLoad, SixtyFourConcurrentClientsAllSucceed) {
    Running &s = shared();
    std::vector<std::thread> threads;
    std::vector<int> status(64, 0);
    std::vector<std::string> texts(64);
    for (int i = 0; i < 64; ++i)
        threads.emplace_back([&, i] {
            try {
                const HttpResponse r =
                    s.post(i % 2 ? "/v1/completions" : "/generate",
                           i % 2 ? json{{"prompt", "Reverse: ab\n"}, {"max_tokens", 6}, {"seed", i}}
                                 : json{{"text", "Reverse: ab\n"},
                                        {"sampling_params", {{"max_new_tokens", 6}}}});
                status[static_cast<size_t>(i)] = r.status;
                texts[static_cast<size_t>(i)] = r.body;
            } catch (const std::exception &e) {
                texts[static_cast<size_t>(i)] = e.what();
            }
        });
    for (auto &t : threads) t.join();
    for (int i = 0; i < 64; ++i)
        EXPECT_EQ(status[static_cast<size_t>(i)], 200) << texts[static_cast<size_t>(i)];
}

TEST(ServeLoad, AClientThatDisconnectsMidStreamHasItsRequestCancelled) {
    Running s;
    int events = 0;
    const HttpResponse r = rl::serve::http_stream(
        s.server->url(), "POST", "/v1/completions",
        json{{"prompt", "abc"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}
            .dump(),
        {}, 120, [&](std::string_view) { return ++events < 3; });
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(s.wait_stats([](const auto &st) { return st.running == 0 && st.queued == 0; }))
        << "the request still runs after its client left";
    EXPECT_LT(s.server->scheduler().stats().tokens_generated, 1500);
    // A non-streamed request whose client leaves is cancelled too.
    EXPECT_THROW(
        http_request(s.server->url(), "POST", "/v1/completions",
                     json{{"prompt", "abc"}, {"max_tokens", 1500}, {"ignore_eos", true}}.dump(), {},
                     0.5),
        std::runtime_error);
    EXPECT_TRUE(s.wait_stats([](const auto &st) { return st.running == 0 && st.queued == 0; }))
        << "the non-streamed request still runs after its client left";
    EXPECT_EQ(s.get("/health").status, 200);
}

TEST(ServeLoad, ARequestOverItsTimeoutEndsAsAborted) {
    rl::serve::ServerConfig c;
    c.request_timeout_s = 0.2;
    Running s(c);
    const json j = s.post_ok("/v1/completions",
                             {{"prompt", "abc"}, {"max_tokens", 1500}, {"ignore_eos", true}});
    EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
}

// ---- tools --------------------------------------------------------------------------------

/// A copy of the tiny model whose chat template is `chat_template` (removed at exit).
std::string tiny_with_template(const std::string &tag, const std::string &chat_template) {
    const auto d = std::filesystem::temp_directory_path() /
                   ("rl-serve-test-" + tag + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    for (const auto &e : std::filesystem::directory_iterator(tiny_dir()))
        std::filesystem::copy(e.path(), d / e.path().filename(),
                              std::filesystem::copy_options::overwrite_existing);
    std::ofstream(d / "chat_template.jinja") << chat_template;
    static std::vector<std::string> paths;
    if (paths.empty())
        std::atexit([] {
            std::error_code ec;
            for (const auto &p : paths) std::filesystem::remove_all(p, ec);
        });
    paths.push_back(d.string());
    return d.string();
}

/// The tiny model with a Hermes-style chat template (tests/serve/hermes_tiny.jinja).
const std::string &hermes_dir() {
    static const std::string dir = [] {
        std::ifstream in(std::filesystem::path(RL_TEST_SOURCE_DIR) / "tests" / "serve" /
                         "hermes_tiny.jinja");
        std::stringstream text;
        text << in.rdbuf();
        return tiny_with_template("hermes", text.str());
    }();
    return dir;
}

Running &hermes() {
    static Running r({}, hermes_dir());
    return r;
}

using ojson = nlohmann::ordered_json;

// In the order OpenAI's documentation writes them (type first, then function).
const ojson kWeatherTools = ojson::parse(R"([{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                   "days": {"type": "integer"}}, "required": ["city"]}}}])");

TEST(ServeTools, ToolsAndToolCallsRenderThroughTheTemplateWithArgumentsAsObjects) {
    Running &s = hermes();
    // OpenAI's wire form: arguments as JSON text, content null, a tool message.
    const ojson wire = ojson::parse(R"([
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"days\": 2, \"city\": \"Zürich\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}])");
    const ojson body = {{"messages", wire},
                        {"tools", kWeatherTools},
                        {"max_tokens", 1},
                        {"return_token_ids", true}};
    const HttpResponse r = s.post_raw("/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    ojson as_template = wire;
    // Keys in the order the client wrote them, in the tools and in the arguments.
    as_template[1]["tool_calls"][0]["function"]["arguments"] = {{"days", 2}, {"city", "Zürich"}};
    core::ChatTemplateOptions o;
    o.tools_json = kWeatherTools.dump();
    const std::string rendered =
        s.policy->tokenizer()->apply_chat_template_json(as_template.dump(), o);
    EXPECT_NE(rendered.find("<tools>\n{\"type\": \"function\""), std::string::npos) << rendered;
    EXPECT_NE(rendered.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2, "
                            "\"city\": \"Zürich\"}}\n</tool_call>"),
              std::string::npos)
        << rendered;
    EXPECT_NE(rendered.find("<tool_response>\n{\"temp\": 21}\n</tool_response>"),
              std::string::npos);
    const auto want = s.policy->tokenizer()->encode(rendered);
    EXPECT_EQ(ids_of(j["prompt_token_ids"]), std::vector<int64_t>(want.begin(), want.end()));
}

TEST(ServeTools, AReplyWithToolsIsTheSameGenerationReadBackForToolCalls) {
    Running &s = hermes();
    const json base = {{"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})},
                       {"tools", kWeatherTools},
                       {"max_tokens", 24},
                       {"seed", 3},
                       {"return_token_ids", true}};
    json none = base;
    none["tool_choice"] = "none";
    const json raw = s.post_ok("/v1/chat/completions", none);
    const json parsed = s.post_ok("/v1/chat/completions", base);
    // tool_choice does not change the prompt, so the seed gives the same tokens.
    EXPECT_EQ(raw["prompt_token_ids"], parsed["prompt_token_ids"]);
    EXPECT_EQ(raw["choices"][0]["token_ids"], parsed["choices"][0]["token_ids"]);
    const std::string text = raw["choices"][0]["message"]["content"].get<std::string>();
    rl::serve::ChatTools tools;
    tools.tools = kWeatherTools;
    tools.choice = "auto";
    tools.family = "hermes";
    std::string finish = raw["choices"][0]["finish_reason"].get<std::string>();
    const json want = rl::serve::reply_message(text, tools, finish);
    EXPECT_EQ(parsed["choices"][0]["finish_reason"], finish);
    json got = parsed["choices"][0]["message"];
    EXPECT_EQ(got.contains("tool_calls"), want.contains("tool_calls"));
    got.erase("tool_calls");
    json w = want;
    w.erase("tool_calls");
    EXPECT_EQ(got, w);
}

TEST(ServeTools, ReplyMessagesCarryOpenAIToolCalls) {
    rl::serve::ChatTools hermes_tools;
    hermes_tools.tools = kWeatherTools;
    hermes_tools.choice = "auto";
    hermes_tools.family = "hermes";
    std::string finish = "stop";
    const json m = rl::serve::reply_message(
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
        "\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
        "\\\"Oslo\\\", \\\"days\\\": 3}\"}\n</tool_call>",
        hermes_tools, finish);
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["content"], "Checking.");
    ASSERT_EQ(m["tool_calls"].size(), 2u);
    std::set<std::string> ids;
    for (const json &c : m["tool_calls"]) {
        EXPECT_EQ(c["type"], "function");
        EXPECT_EQ(c["function"]["name"], "get_weather");
        ASSERT_TRUE(c["function"]["arguments"].is_string());
        const std::string id = c["id"].get<std::string>();
        EXPECT_EQ(id.rfind("call_", 0), 0u);
        EXPECT_GT(id.size(), 20u);
        ids.insert(id);
    }
    EXPECT_EQ(ids.size(), 2u);
    EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              json({{"city", "Paris"}}));
    EXPECT_EQ(json::parse(m["tool_calls"][1]["function"]["arguments"].get<std::string>()),
              json({{"city", "Oslo"}, {"days", 3}}));

    // Only calls: content null.
    finish = "stop";
    const json only = rl::serve::reply_message(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>", hermes_tools,
        finish);
    EXPECT_TRUE(only["content"].is_null());
    EXPECT_EQ(finish, "tool_calls");

    // A malformed call: the whole text as content, no tool_calls, finish as it was.
    const std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\n";
    finish = "length";
    const json b = rl::serve::reply_message(bad, hermes_tools, finish);
    EXPECT_EQ(b["content"], bad);
    EXPECT_FALSE(b.contains("tool_calls"));
    EXPECT_EQ(finish, "length");

    // tool_choice "none": never read.
    rl::serve::ChatTools none = hermes_tools;
    none.choice = "none";
    finish = "stop";
    const std::string call =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
    EXPECT_EQ(rl::serve::reply_message(call, none, finish)["content"], call);
    EXPECT_EQ(finish, "stop");

    // Llama-3 JSON.
    rl::serve::ChatTools llama = hermes_tools;
    llama.family = "llama3_json";
    const json l = rl::serve::reply_message(
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", llama, finish);
    EXPECT_EQ(finish, "tool_calls");
    EXPECT_TRUE(l["content"].is_null());
    EXPECT_EQ(l["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Rome\"}");
}

// What a ToolCallStream sends for `pieces`, fed one by one, then finished.
struct Streamed {
    std::vector<json> deltas;
    std::string finish = "stop";
    std::string content() const {
        std::string c;
        for (const json &d : deltas)
            if (d.contains("content")) c += d["content"].get<std::string>();
        return c;
    }
};

Streamed stream_reply(const rl::serve::ChatTools &tools, const std::vector<std::string> &pieces,
                      const std::string &finish = "stop") {
    Streamed out;
    out.finish = finish;
    rl::serve::ToolCallStream reader(tools);
    for (const auto &p : pieces)
        for (json &d : reader.feed(p)) out.deltas.push_back(std::move(d));
    for (json &d : reader.finish(out.finish)) out.deltas.push_back(std::move(d));
    return out;
}

std::vector<std::string> bytes_of(const std::string &text) {
    std::vector<std::string> out;
    for (char c : text) out.emplace_back(1, c);
    return out;
}

rl::serve::ChatTools hermes_auto() {
    rl::serve::ChatTools t;
    t.tools = kWeatherTools;
    t.choice = "auto";
    t.family = "hermes";
    return t;
}

TEST(ServeTools, StreamedToolCallsSendTheContentThenEachCallNameFirstThenItsArguments) {
    const std::string text =
        "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
        "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": 1}}\n"
        "</tool_call>\n";
    // Wherever the text is cut, the same deltas (the ids aside).
    std::vector<std::vector<std::string>> cuts = {{text}, bytes_of(text)};
    for (size_t k = 1; k < text.size(); k += 7) cuts.push_back({text.substr(0, k), text.substr(k)});
    for (const auto &pieces : cuts) {
        const Streamed s = stream_reply(hermes_auto(), pieces);
        EXPECT_EQ(s.finish, "tool_calls");
        EXPECT_EQ(s.content(), "Checking.");
        std::vector<json> calls;
        for (const json &d : s.deltas)
            if (d.contains("tool_calls")) {
                ASSERT_EQ(d["tool_calls"].size(), 1u);
                calls.push_back(d["tool_calls"][0]);
            }
        ASSERT_EQ(calls.size(), 4u) << pieces.size();
        // The content comes before the first call.
        EXPECT_TRUE(s.deltas.front().contains("content"));
        const char *names[] = {"get_weather", "get_time"};
        const char *args[] = {"{\"city\":\"Paris\"}", "{\"zone\":1}"};
        for (size_t c = 0; c < 2; ++c) {
            const json &head = calls[2 * c], &tail = calls[2 * c + 1];
            EXPECT_EQ(head["index"], c);
            EXPECT_EQ(head["type"], "function");
            EXPECT_EQ(head["id"].get<std::string>().rfind("call_", 0), 0u);
            EXPECT_EQ(head["function"], json({{"name", names[c]}, {"arguments", ""}}));
            EXPECT_EQ(tail["index"], c);
            EXPECT_FALSE(tail.contains("id"));
            EXPECT_EQ(tail["function"], json({{"arguments", args[c]}}));
        }
    }
}

TEST(ServeTools, StreamedTextThatIsNotACallIsSentAsContent) {
    // A start of <tool_call> that is not one, and trailing spaces: sent, in the end.
    for (const std::string text :
         {"a <tool box> b", "x <tool_ca", "ends with spaces \n ", "<tool_callx", " \n"}) {
        const Streamed s = stream_reply(hermes_auto(), bytes_of(text));
        EXPECT_EQ(s.content(), text);
        EXPECT_EQ(s.finish, "stop");
    }
    // Content goes out as it comes, but not what may start a call.
    rl::serve::ToolCallStream reader(hermes_auto());
    EXPECT_EQ(reader.feed("Hello <tool"), std::vector<json>({{{"content", "Hello"}}}));
    EXPECT_TRUE(reader.feed("_c").empty());
    EXPECT_EQ(reader.feed("x"), std::vector<json>({{{"content", " <tool_cx"}}}));
    // A block that cannot be read is sent as content, verbatim; so is one left open.
    const std::string bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {]}\n"
                            "</tool_call>";
    Streamed b = stream_reply(hermes_auto(), bytes_of(bad));
    EXPECT_EQ(b.content(), bad);
    EXPECT_EQ(b.finish, "stop");
    const std::string open = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
    b = stream_reply(hermes_auto(), bytes_of(open), "length");
    EXPECT_EQ(b.content(), open);
    EXPECT_EQ(b.finish, "length");
    // tool_choice "none": everything is content.
    rl::serve::ChatTools none = hermes_auto();
    none.choice = "none";
    const std::string call =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
    const Streamed n = stream_reply(none, bytes_of(call));
    EXPECT_EQ(n.content(), call);
    EXPECT_EQ(n.finish, "stop");
}

TEST(ServeTools, StreamedLlama3CallsAreReadWholeAndOtherRepliesPassOn) {
    rl::serve::ChatTools llama = hermes_auto();
    llama.family = "llama3_json";
    const Streamed c = stream_reply(
        llama, bytes_of(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}"));
    EXPECT_EQ(c.finish, "tool_calls");
    EXPECT_EQ(c.content(), "");
    ASSERT_EQ(c.deltas.size(), 2u);
    EXPECT_EQ(c.deltas[0]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(c.deltas[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Rome\"}");
    rl::serve::ToolCallStream reader(llama);
    EXPECT_TRUE(reader.feed("  ").empty());
    EXPECT_EQ(reader.feed("Hi"), std::vector<json>({{{"content", "  Hi"}}}));
    EXPECT_EQ(reader.feed(" {x"), std::vector<json>({{{"content", " {x"}}}));
    // A JSON start that is no call: the whole text, as the non-streamed reply.
    const Streamed bad = stream_reply(llama, bytes_of("{oops}"));
    EXPECT_EQ(bad.content(), "{oops}");
    EXPECT_EQ(bad.finish, "stop");
}

TEST(ServeTools, AForcedToolChoiceMustBeMetByTheReply) {
    rl::serve::ChatTools named = hermes_auto();
    named.choice = "function";
    named.function = "get_weather";
    EXPECT_EQ(named.forced_prefix(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
    rl::serve::ChatTools required = hermes_auto();
    required.choice = "required";
    EXPECT_EQ(required.forced_prefix(), "<tool_call>\n{\"name\": \"");
    rl::serve::ChatTools llama = named;
    llama.family = "llama3_json";
    EXPECT_EQ(llama.forced_prefix(), "{\"name\": \"get_weather\", \"parameters\": ");
    EXPECT_EQ(hermes_auto().forced_prefix(), "");

    const std::string call =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call>";
    for (const auto *t : {&named, &required}) {
        std::string finish = "stop";
        const json m = rl::serve::reply_message(call, *t, finish);
        EXPECT_EQ(finish, "tool_calls");
        EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    }
    // `rest`: what the model wrote after the forced prefix.
    auto refused = [](const std::string &rest, const rl::serve::ChatTools &t,
                      const std::string &words) {
        const std::string text = t.forced_prefix() + rest;
        std::string finish = "stop";
        try {
            rl::serve::reply_message(text, t, finish);
            ADD_FAILURE() << "accepted: " << text;
        } catch (const rl::serve::ApiError &e) {
            EXPECT_EQ(e.status, 422);
            EXPECT_EQ(e.param, "tool_choice");
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
        }
        // The same from a stream: nothing sent before the error.
        rl::serve::ToolCallStream reader(t);
        EXPECT_TRUE(reader.feed(rest).empty());
        finish = "stop";
        EXPECT_THROW(reader.finish(finish), rl::serve::ApiError);
    };
    refused("{]}\n</tool_call>", named,
            "tool_choice naming 'get_weather': could not parse tool call 1");
    refused("", required,
            "tool_choice \"required\": could not parse tool call 1: the "
            "<tool_call> block is not closed");
    rl::serve::ChatTools named_time = named;
    named_time.function = "get_time";
    refused("{}}\n</tool_call>\n" + call, named_time, "it calls 'get_weather'");
    // Cut by max_tokens: the text as content, finish "length".
    std::string finish = "length";
    const std::string cut = named.forced_prefix() + "{\"city\": \"Os";
    const json m = rl::serve::reply_message(cut, named, finish);
    EXPECT_EQ(m["content"], cut);
    EXPECT_FALSE(m.contains("tool_calls"));
    EXPECT_EQ(finish, "length");
    finish = "length";
    const Streamed s =
        stream_reply(named, bytes_of(cut.substr(named.forced_prefix().size())), "length");
    EXPECT_EQ(s.content(), cut);
    EXPECT_EQ(s.finish, "length");
    // The forced stream sends the call at the end, as the whole reply has it.
    const Streamed ok = stream_reply(named, {"{\"city\": \"Oslo\"}}\n</tool_call>"});
    EXPECT_EQ(ok.finish, "tool_calls");
    ASSERT_EQ(ok.deltas.size(), 2u);
    EXPECT_EQ(ok.deltas[1]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
}

// The choices of a streamed chat reply put together, by index.
struct Joined {
    std::map<size_t, std::string> content, finish;
    std::map<size_t, json> calls; ///< index -> array of {id, name, arguments}
    json usage, error;
};

Joined join_chunks(const std::vector<std::string> &events) {
    Joined j;
    for (const auto &e : events) {
        if (e == "[DONE]") break;
        const json ev = json::parse(e);
        if (ev.contains("error")) {
            j.error = ev["error"];
            continue;
        }
        if (ev.contains("usage") && !ev["usage"].is_null()) j.usage = ev["usage"];
        for (const json &ch : ev["choices"]) {
            const size_t i = ch["index"].get<size_t>();
            const json &d = ch["delta"];
            if (d.contains("content") && d["content"].is_string())
                j.content[i] += d["content"].get<std::string>();
            if (d.contains("tool_calls"))
                for (const json &tc : d["tool_calls"]) {
                    json &calls = j.calls[i];
                    if (!calls.is_array()) calls = json::array();
                    const size_t k = tc["index"].get<size_t>();
                    if (k == calls.size())
                        calls.push_back({{"id", tc["id"]},
                                         {"name", tc["function"]["name"]},
                                         {"arguments", ""}});
                    calls[k]["arguments"] = calls[k]["arguments"].get<std::string>() +
                                            tc["function"]["arguments"].get<std::string>();
                }
            if (!ch["finish_reason"].is_null()) j.finish[i] = ch["finish_reason"];
        }
    }
    return j;
}

TEST(ServeTools, AStreamWithToolsCarriesTheNonStreamedRepliesOfEveryChoice) {
    Running &s = hermes();
    const json base = {{"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})},
                       {"tools", kWeatherTools},
                       {"max_tokens", 24},
                       {"n", 3},
                       {"seed", 11}};
    const json whole = s.post_ok("/v1/chat/completions", base);
    json streamed = base;
    streamed["stream"] = true;
    streamed["stream_options"] = {{"include_usage", true}};
    const HttpResponse r = s.post("/v1/chat/completions", streamed);
    ASSERT_EQ(r.status, 200) << r.body;
    const Joined j = join_chunks(sse_events(r.body));
    EXPECT_TRUE(j.error.is_null()) << j.error;
    for (size_t i = 0; i < 3; ++i) {
        const json &ch = whole["choices"][i];
        const json &content = ch["message"]["content"];
        EXPECT_EQ(j.content.at(i), content.is_null() ? "" : content.get<std::string>()) << i;
        EXPECT_EQ(j.finish.at(i), ch["finish_reason"]) << i;
        EXPECT_EQ(j.calls.count(i) > 0, ch["message"].contains("tool_calls")) << i;
    }
    EXPECT_EQ(j.usage["completion_tokens"], whole["usage"]["completion_tokens"]);
}

TEST(ServeTools, AForcedToolChoiceStartsTheTurnWithTheCallOpening) {
    Running &s = hermes();
    const auto &tok = *s.policy->tokenizer();
    const json base = {{"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})},
                       {"tools", kWeatherTools},
                       {"max_tokens", 3},
                       {"ignore_eos", true},
                       {"return_token_ids", true}};
    const json plain = s.post_ok("/v1/chat/completions", base);
    for (const json &choice : {json("required"), json({{"type", "function"},
                                                       {"function", {{"name", "get_weather"}}}})}) {
        const std::string prefix = choice.is_string()
                                       ? "<tool_call>\n{\"name\": \""
                                       : "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
        json body = base;
        body["tool_choice"] = choice;
        // The untrained model does not finish a call in 3 tokens: cut, returned as text.
        const json j = s.post_ok("/v1/chat/completions", body);
        std::vector<int64_t> want = ids_of(plain["prompt_token_ids"]);
        for (int32_t t : tok.encode(prefix)) want.push_back(t);
        EXPECT_EQ(ids_of(j["prompt_token_ids"]), want);
        EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
        const std::string content = j["choices"][0]["message"]["content"].get<std::string>();
        EXPECT_EQ(content.rfind(prefix, 0), 0u) << content;
        // A reply that ends without a call (every token stops it): 422 naming
        // tool_choice, streamed as an error event.
        json stops = json::array();
        for (int64_t t = 0; t < tok.vocab_size(); ++t) stops.push_back(t);
        body["stop_token_ids"] = stops;
        body.erase("ignore_eos");
        const HttpResponse bad = s.post("/v1/chat/completions", body);
        EXPECT_EQ(bad.status, 422) << bad.body;
        const json err = json::parse(bad.body, nullptr, false);
        EXPECT_EQ(err["error"]["param"], "tool_choice") << bad.body;
        EXPECT_NE(bad.body.find("choice 0: the model's reply does not meet"), std::string::npos)
            << bad.body;
        body["stream"] = true;
        const HttpResponse sr = s.post("/v1/chat/completions", body);
        ASSERT_EQ(sr.status, 200) << sr.body;
        const Joined jn = join_chunks(sse_events(sr.body));
        EXPECT_EQ(jn.error["param"], "tool_choice") << sr.body;
        EXPECT_NE(jn.error["message"].get<std::string>().find("choice 0: the model's reply"),
                  std::string::npos)
            << sr.body;
        EXPECT_EQ(jn.content.at(0), "") << "nothing of a failed forced reply is sent";
    }
}

TEST(ServeReasoning, Qwen3ThinkingIsSplitFromTheContentWholeAndStreamed) {
    struct Case {
        std::string text;
        bool opened, found;
        std::string reasoning, content;
    };
    const std::vector<Case> cases = {
        {"<think>\nPlan: look it up.\n\n</think>\n\nIt is 21.", false, true, "Plan: look it up.",
         "It is 21."},
        {" \n<think>a</think>b", false, true, "a", "b"},
        {"Plan.\n</think>\n\nIt is 21.", true, true, "Plan.", "It is 21."},
        {"<think>\nstill thinking\n", false, true, "still thinking", ""}, // cut by max_tokens
        {"\n\nstill </thi", true, true, "still </thi", ""},
        {"No thinking </think> here.", false, false, "", "No thinking </think> here."},
        {" <thin", false, false, "", " <thin"},
        {"", false, false, "", ""},
    };
    for (const Case &c : cases) {
        const rl::serve::Reasoning r = rl::serve::split_reasoning(c.text, c.opened);
        EXPECT_EQ(r.found, c.found) << c.text;
        EXPECT_EQ(r.reasoning, c.reasoning) << c.text;
        EXPECT_EQ(r.content, c.content) << c.text;
        for (const auto &pieces : {std::vector<std::string>{c.text}, bytes_of(c.text)}) {
            rl::serve::ReasoningStream stream(c.opened);
            std::string reasoning, content;
            for (const auto &p : pieces) {
                const auto [a, b] = stream.feed(p);
                reasoning += a;
                content += b;
            }
            const auto [a, b] = stream.finish();
            EXPECT_EQ(reasoning + a, c.reasoning) << c.text << " in " << pieces.size();
            EXPECT_EQ(content + b, c.content) << c.text << " in " << pieces.size();
        }
    }
    // Reasoning goes out as it comes, not the newlines that may end it.
    rl::serve::ReasoningStream stream(false);
    EXPECT_EQ(stream.feed("<think>\nab\n"), std::make_pair(std::string("ab"), std::string()));
    EXPECT_EQ(stream.feed("c</th"), std::make_pair(std::string("\nc"), std::string()));
    EXPECT_EQ(stream.feed("ink>\n\nd"), std::make_pair(std::string(), std::string("d")));

    EXPECT_TRUE(rl::serve::opens_thinking("<|im_start|>assistant\n<think>\n"));
    EXPECT_FALSE(rl::serve::opens_thinking("assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(rl::serve::opens_thinking("<|im_start|>assistant\n"));
}

TEST(ServeReasoning, WithTheQwen3ParserChatRepliesCarryReasoningContent) {
    // A template whose generation prompt opens <think> (as Qwen3's thinking
    // models do): the untrained model never closes it, so all it writes is reasoning.
    static const std::string dir = tiny_with_template(
        "thinking", "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
                    "message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt "
                    "%}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}");
    rl::serve::ServerConfig config;
    config.reasoning_parser = "qwen3";
    Running with(config, dir);
    Running without({}, dir);
    const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
                       {"max_tokens", 12},
                       {"n", 2},
                       {"seed", 5},
                       {"ignore_eos", true}};
    const json plain = without.post_ok("/v1/chat/completions", body);
    const json split = with.post_ok("/v1/chat/completions", body);
    for (size_t i = 0; i < 2; ++i) {
        const std::string text = plain["choices"][i]["message"]["content"].get<std::string>();
        EXPECT_FALSE(plain["choices"][i]["message"].contains("reasoning_content"));
        const json &m = split["choices"][i]["message"];
        EXPECT_EQ(m["reasoning_content"], rl::serve::split_reasoning(text, true).reasoning) << m;
        EXPECT_TRUE(m["content"].is_null()) << m;
    }
    json streamed = body;
    streamed["stream"] = true;
    const HttpResponse r = with.post("/v1/chat/completions", streamed);
    ASSERT_EQ(r.status, 200) << r.body;
    std::map<size_t, std::string> reasoning, content;
    for (const auto &e : sse_events(r.body)) {
        if (e == "[DONE]") break;
        const json ev = json::parse(e);
        for (const json &ch : ev["choices"]) {
            const size_t i = ch["index"].get<size_t>();
            if (ch["delta"].contains("reasoning_content"))
                reasoning[i] += ch["delta"]["reasoning_content"].get<std::string>();
            if (ch["delta"].contains("content"))
                content[i] += ch["delta"]["content"].get<std::string>();
        }
    }
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(reasoning[i], split["choices"][i]["message"]["reasoning_content"]) << i;
        EXPECT_EQ(content[i], "") << i;
    }
    // An unknown parser is refused, naming the key.
    try {
        rl::serve::ServerConfig::from_json(R"({"reasoning_parser": "deepseek"})");
        ADD_FAILURE() << "accepted";
    } catch (const std::exception &e) {
        EXPECT_NE(std::string(e.what()).find("reasoning_parser"), std::string::npos) << e.what();
    }
}

TEST(ServeTools, BadToolRequestsAreRefusedNamingTheField) {
    const std::string user = R"("messages": [{"role": "user", "content": "a"}])";
    const std::string tools = R"("tools": )" + kWeatherTools.dump();
    const std::vector<Bad> on_hermes = {
        {"/v1/chat/completions",
         "{" + user + ", " + tools +
             R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})",
         "tool_choice", "'get_time', which is not among the tools (get_weather)"},
        {"/v1/chat/completions",
         "{" + user + ", " + tools +
             R"(, "tool_choice": {"type": "retrieval", "function": {"name": "get_weather"}}})",
         "tool_choice.type", "\"function\""},
        {"/v1/chat/completions",
         "{" + user + ", " + tools + R"(, "tool_choice": {"type": "function", "function": {}}})",
         "tool_choice.function.name", "non-empty string"},
        {"/v1/chat/completions", "{" + user + R"(, "tool_choice": "required"})", "tool_choice",
         "needs a non-empty tools list"},
        {"/v1/chat/completions", "{" + user + ", " + tools + R"(, "tool_choice": "maybe"})",
         "tool_choice", "'maybe'"},
        {"/v1/chat/completions", "{" + user + R"(, "tool_choice": "auto"})", "tool_choice",
         "needs a non-empty tools list"},
        {"/v1/chat/completions", "{" + user + R"(, "tools": {"name": "x"}})", "tools",
         "must be a list"},
        {"/v1/chat/completions", "{" + user + R"(, "tools": [{"type": "retrieval"}]})",
         "tools[0].type", "\"function\""},
        {"/v1/chat/completions",
         "{" + user + R"(, "tools": [{"type": "function", "function": {}}]})",
         "tools[0].function.name", "non-empty string"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls":
            [{"type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]})",
         "messages[1].tool_calls[0].function.arguments", "must be a JSON object"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls":
            [{"type": "function", "function": {"arguments": "{}"}}]}]})",
         "messages[1].tool_calls[0].function.name", "non-empty string"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "user", "content": "a", "tool_calls": []}]})",
         "messages[0].tool_calls", "only for assistant messages"},
        {"/v1/chat/completions",
         R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 5}]})",
         "messages[0].tool_call_id", "must be a string"},
    };
    // The tiny model's own template (plain ChatML) has no tool-call format.
    const std::vector<Bad> on_chatml = {
        {"/v1/chat/completions", "{" + user + ", " + tools + "}", "tools",
         "known tool-call format"},
        {"/v1/chat/completions", "{" + user + ", " + tools + R"(, "tool_choice": "required"})",
         "tool_choice", "known tool-call format"},
    };
    const std::vector<std::pair<Running *, const std::vector<Bad> *>> servers = {
        {&hermes(), &on_hermes}, {&shared(), &on_chatml}};
    for (const auto &[server, cases] : servers) {
        for (const Bad &b : *cases) {
            const HttpResponse r = server->post_raw(b.path, b.body);
            EXPECT_EQ(r.status, 400) << b.body << ": " << r.body;
            const json j = json::parse(r.body, nullptr, false);
            ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
            EXPECT_EQ(j["error"]["param"], b.param) << b.body << " -> " << r.body;
            EXPECT_NE(j["error"]["message"].get<std::string>().find(b.words), std::string::npos)
                << b.body << " -> " << j["error"]["message"];
        }
    }
    // tool_choice "none" only renders the tools, so any template takes it.
    EXPECT_EQ(
        shared()
            .post_raw("/v1/chat/completions",
                      "{" + user + ", " + tools + R"(, "tool_choice": "none", "max_tokens": 2})")
            .status,
        200);
    // An empty tools list is no tools, streaming included.
    EXPECT_EQ(shared()
                  .post_raw("/v1/chat/completions",
                            "{" + user + R"(, "tools": [], "stream": true, "max_tokens": 2})")
                  .status,
              200);
}

// ---- LoRA adapters ------------------------------------------------------------------------

/// A PEFT folder of an adapter over the tiny model whose B matrices are drawn
/// from `seed` (not the identity), written under the test's tiny folder.
std::string random_adapter_dir(const std::string &name, uint64_t seed) {
    auto policy = load_tiny();
    core::LoraConfig c;
    c.rank = 4;
    c.seed = seed;
    auto a = policy->create_adapter(name, c);
    at::manual_seed(seed);
    std::map<std::string, at::Tensor> params;
    for (const auto &[n, t] : a->named_parameters())
        params[n] = n.find("lora_B") != std::string::npos ? at::randn_like(t) * 0.5 : t;
    a->assign(params, name);
    const std::string dir = (std::filesystem::path(tiny_dir()) / ("adapter-" + name)).string();
    core::save_adapter(*a, dir);
    return dir;
}

TEST(ServeLora, RequestsOfDifferentAdaptersInOneBatchEachEqualEngineGenerateWithTheirAdapter) {
    Running s;
    const std::string dir_a = random_adapter_dir("a", 11), dir_b = random_adapter_dir("b", 12);
    const json la = s.post_ok("/load_lora_adapter", {{"lora_name", "a"}, {"lora_path", dir_a}});
    EXPECT_EQ(la["success"], true);
    EXPECT_EQ(la["loaded_adapters"], json({{"a", dir_a}}));
    s.post_ok("/load_lora_adapter", {{"lora_name", "b"}, {"lora_path", dir_b}, {"pinned", true}});

    // One batch: the base model and both adapters share the scheduler's steps.
    const std::vector<int64_t> prompt = {82, 101, 118, 58, 32, 97, 98, 10};
    const json j = s.post_ok(
        "/generate",
        {{"input_ids", {prompt, prompt, prompt}},
         {"lora_path", {nullptr, "a", "b"}},
         {"sampling_params", {{"max_new_tokens", 10}, {"sampling_seed", 5}, {"temperature", 0.8}}},
         {"return_logprob", true}});
    ASSERT_TRUE(j.is_array());
    ASSERT_EQ(j.size(), 3u);
    auto own = load_tiny();
    own->add_adapter(core::load_adapter(own->model(), dir_a, "a"));
    own->add_adapter(core::load_adapter(own->model(), dir_b, "b"));
    core::Engine engine(own);
    std::vector<std::vector<int64_t>> got;
    const char *names[] = {"", "a", "b"};
    for (size_t k = 0; k < 3; ++k) {
        core::SamplingParams p;
        p.seed = 5;
        p.temperature = 0.8;
        p.max_tokens = 10;
        p.adapter = names[k];
        const auto g = engine.generate({prompt}, p);
        got.push_back(ids_of(j[k]["output_ids"]));
        EXPECT_EQ(got.back(), g.token_ids) << "lora_path " << names[k];
        const json &lps = j[k]["meta_info"]["output_token_logprobs"];
        ASSERT_EQ(lps.size(), g.logprobs.size());
        for (size_t i = 0; i < g.logprobs.size(); ++i)
            EXPECT_NEAR(lps[i][0].get<double>(), g.logprobs[i], 1e-5) << names[k] << " " << i;
    }
    EXPECT_NE(got[1], got[0]) << "adapter a changed nothing";
    EXPECT_NE(got[2], got[1]) << "adapters a and b sampled alike";

    // Scoring a prompt with an adapter: the trainer's logprobs under it.
    const json scored = s.post_ok("/generate", {{"input_ids", prompt},
                                                {"lora_path", "a"},
                                                {"sampling_params", {{"max_new_tokens", 0}}},
                                                {"return_logprob", true},
                                                {"logprob_start_len", 1}});
    std::vector<float> want;
    {
        core::AdapterScope scope(own->adapter("a"));
        want = trainer_logprobs(*own, {prompt[0]},
                                std::vector<int64_t>(prompt.begin() + 1, prompt.end()));
    }
    const json &in = scored["meta_info"]["input_token_logprobs"];
    ASSERT_EQ(in.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(in[i][0].get<double>(), want[i], 1e-5);

    // The OpenAI routes select an adapter by its name as the model.
    const json c = s.post_ok("/v1/completions", {{"model", "b"},
                                                 {"prompt", prompt},
                                                 {"max_tokens", 10},
                                                 {"seed", 5},
                                                 {"temperature", 0.8},
                                                 {"return_token_ids", true}});
    EXPECT_EQ(ids_of(c["choices"][0]["token_ids"]), got[2]);

    // /v1/models lists them with the served model as parent.
    const json models = json::parse(s.get("/v1/models").body);
    ASSERT_EQ(models["data"].size(), 3u);
    EXPECT_EQ(models["data"][1]["id"], "a");
    EXPECT_EQ(models["data"][1]["parent"], "tiny");
    EXPECT_EQ(models["data"][1]["root"], dir_a);
}

TEST(ServeLora, UnknownAdaptersAndBadLoadsAreRefusedNamingTheField) {
    Running s;
    const std::string dir_a = random_adapter_dir("a", 11);
    auto error_of = [](const HttpResponse &r) { return json::parse(r.body); };
    // Before any load: lora_path names nothing loaded.
    HttpResponse r = s.post("/generate", {{"input_ids", {1, 2, 3}}, {"lora_path", "a"}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "lora_path");
    EXPECT_NE(r.body.find("lora_path 'a' is not a loaded LoRA adapter; loaded: none"),
              std::string::npos)
        << r.body;
    s.post_ok("/load_lora_adapter", {{"lora_name", "a"}, {"lora_path", dir_a}});
    r = s.post("/generate", {{"input_ids", {{1, 2}, {3, 4}}}, {"lora_path", {"a", "zz"}}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "lora_path[1]");
    EXPECT_NE(r.body.find("loaded: 'a'"), std::string::npos) << r.body;
    r = s.post("/generate", {{"input_ids", {1, 2}}, {"lora_path", 3}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "lora_path");
    r = s.post("/v1/completions", {{"model", "zz"}, {"prompt", "x"}});
    EXPECT_EQ(r.status, 404);
    EXPECT_EQ(error_of(r)["error"]["param"], "model");

    // Loads: a name in use, a folder that is no adapter, missing fields.
    r = s.post("/load_lora_adapter", {{"lora_name", "a"}, {"lora_path", dir_a}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["success"], false);
    EXPECT_NE(r.body.find("already loaded"), std::string::npos) << r.body;
    r = s.post("/load_lora_adapter", {{"lora_name", "c"}, {"lora_path", tiny_dir() + "/nope"}});
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(
        error_of(r)["error_message"].get<std::string>().find("lora_path '" + tiny_dir() + "/nope'"),
        std::string::npos)
        << r.body;
    EXPECT_EQ(error_of(r)["loaded_adapters"], json({{"a", dir_a}}));
    r = s.post("/load_lora_adapter", {{"lora_path", dir_a}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "lora_name");
    r = s.post("/load_lora_adapter", {{"lora_name", "d"}, {"lora_path", dir_a}, {"colour", 1}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "colour");

    // Unloaded, it is unknown again.
    const json u = s.post_ok("/unload_lora_adapter", {{"lora_name", "a"}});
    EXPECT_EQ(u["loaded_adapters"], json::object());
    r = s.post("/generate", {{"input_ids", {1, 2, 3}}, {"lora_path", "a"}});
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(error_of(r)["error"]["param"], "lora_path");
    r = s.post("/unload_lora_adapter", {{"lora_name", "a"}});
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("no LoRA adapter 'a' is loaded"), std::string::npos) << r.body;
}

} // namespace
