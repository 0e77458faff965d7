// The training server (host/serve/training_server.hpp) in process on the tiny
// model, driven over loopback HTTP with the server's own client as the Tinker
// SDK drives it: sessions, futures, JSON and protobuf wires, the ordering of a
// model's calls, isolation of sessions, and refusals that name the field.
#include "bridge/loss_node.hpp"
#include "serve/http.hpp"
#include "serve/training_server.hpp"

#include "rl/core/lora.hpp"
#include "rl/core/model.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using nlohmann::json;
using rl::serve::http_request;
using rl::serve::HttpResponse;
namespace core = rl::core;
namespace fs = std::filesystem;

const std::string &tiny_dir() {
    static const std::string dir = [] {
        const auto d =
            fs::temp_directory_path() / ("rl-training-server-test-" + std::to_string(::getpid()));
        core::write_tiny_model(d.string(), 7);
        static const std::string path = d.string();
        std::atexit([] {
            std::error_code ec;
            fs::remove_all(path, ec);
            fs::remove_all(path + "-ckpt", ec);
        });
        return d.string();
    }();
    return dir;
}

// The built plugins (Tinker's loss names run them), loaded once for every server.
rl::host::bridge::LossFactory plugin_losses() {
    static rl_runtime_t *runtime = [] {
        rl_runtime_desc_t desc = RL_RUNTIME_DESC_INIT;
        desc.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
        desc.plugin_path = RL_TEST_PLUGIN_DIR;
        desc.log_level = "error";
        rl_runtime_t *r = nullptr;
        if (rl_runtime_create(&desc, &r) != RL_OK) throw std::runtime_error(rl_last_error());
        return r;
    }();
    return rl::host::bridge::loss_factory(runtime);
}

struct Srv {
    std::shared_ptr<core::Policy> base;
    std::unique_ptr<rl::serve::TrainingServer> server;
    rl::serve::Headers auth;

    explicit Srv(json options = json::object(),
                 rl::host::bridge::LossFactory losses = plugin_losses(),
                 const std::string &dir = tiny_dir())
        : base(core::Policy::load(dir)) {
        options["port"] = 0;
        options["model_path"] = dir;
        options["base_model"] = "tiny";
        options["poll_timeout_s"] = options.value("poll_timeout_s", 5.0);
        if (!options.contains("checkpoint_dir"))
            options["checkpoint_dir"] =
                tiny_dir() + "-ckpt/" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
        server = std::make_unique<rl::serve::TrainingServer>(
            base, rl::serve::TrainingServerConfig::from_json(options.dump()), std::move(losses));
        server->start();
    }
    HttpResponse post(const std::string &path, const json &body) const {
        return http_request(server->url(), "POST", path, body.dump(), auth, 120);
    }
    HttpResponse post_raw(const std::string &path, const std::string &body,
                          const rl::serve::Headers &headers) const {
        rl::serve::Headers h = auth;
        h.insert(h.end(), headers.begin(), headers.end());
        return http_request(server->url(), "POST", path, body, h, 120);
    }
    /// A submitted call's request id (the submit must succeed).
    std::string submit(const std::string &path, const json &body) const {
        const HttpResponse r = post(path, body);
        EXPECT_EQ(r.status, 200) << path << ": " << r.body;
        return json::parse(r.body).value("request_id", "");
    }
    /// Polls retrieve_future until the call ended; its JSON body.
    json result(const std::string &request_id, const rl::serve::Headers &extra = {}) const {
        for (int i = 0; i < 100; ++i) {
            rl::serve::Headers h = auth;
            h.insert(h.end(), extra.begin(), extra.end());
            const HttpResponse r = http_request(server->url(), "POST", "/api/v1/retrieve_future",
                                                json{{"request_id", request_id}}.dump(), h, 120);
            EXPECT_EQ(r.status, 200) << r.body;
            if (r.header("content-type") == "application/x-protobuf")
                return json{{"proto", r.body}};
            json j = json::parse(r.body);
            if (j.value("type", "") != "try_again") return j;
        }
        ADD_FAILURE() << "no result for " << request_id;
        return json();
    }
    json call(const std::string &path, const json &body) const {
        return result(submit(path, body));
    }

    std::string session() const {
        const HttpResponse r = post("/api/v1/create_session", {{"tags", json::array()},
                                                               {"user_metadata", json::object()},
                                                               {"sdk_version", "0.16.1"},
                                                               {"project_id", nullptr}});
        EXPECT_EQ(r.status, 200) << r.body;
        return json::parse(r.body)["session_id"].get<std::string>();
    }
    std::string model(const std::string &session, int seq = 0) const {
        const json r = call("/api/v1/create_model", {{"session_id", session},
                                                     {"model_seq_id", seq},
                                                     {"base_model", "tiny"},
                                                     {"lora_config", nullptr},
                                                     {"user_metadata", nullptr}});
        EXPECT_TRUE(r.contains("model_id")) << r.dump();
        return r.value("model_id", "");
    }
};

/// A Tinker datum (0.16's JSON: a chunk without "type") for next-token
/// prediction of `text` with unit weights.
json sft_datum(const std::string &text) {
    std::vector<int64_t> ids(text.begin(), text.end());
    std::vector<int64_t> input(ids.begin(), ids.end() - 1), target(ids.begin() + 1, ids.end());
    std::vector<double> w(target.size(), 1.0);
    return {{"model_input", {{"chunks", {{{"tokens", input}}}}}},
            {"loss_fn_inputs",
             {{"target_tokens", {{"data", target}, {"dtype", "int64"}, {"shape", {target.size()}}}},
              {"weights", {{"data", w}, {"dtype", "float32"}, {"shape", {w.size()}}}}}}};
}

json fb_body(const std::string &model, int64_t seq, const json &data,
             const std::string &loss = "cross_entropy", const json &config = nullptr) {
    return {{"model_id", model},
            {"seq_id", seq},
            {"forward_backward_input",
             {{"data", data}, {"loss_fn", loss}, {"loss_fn_config", config}}}};
}

std::vector<double> logprobs_of(const json &fb_result, size_t datum) {
    return fb_result["loss_fn_outputs"][datum]["logprobs"]["data"].get<std::vector<double>>();
}

/// Reference training, alone: `steps` steps of summed cross-entropy on `text`
/// with Adam at learning rate 1e-2 (Tinker's other AdamParams defaults, as the
/// server's optim_step fills them), no clipping.
void train_ce_locally(core::Trainer &t, const std::string &text, int steps) {
    std::vector<int64_t> ids(text.begin(), text.end());
    core::LossFunction ce;
    ce.name = "ce";
    ce.signature.required = {"logprobs"};
    ce.signature.differentiable = {"logprobs"};
    ce.compute = [](const core::LossCall &call) {
        core::LossResult r;
        const at::Tensor lp = call.tensors[0].second;
        r.loss = -lp.sum().item<double>();
        r.grads["logprobs"] = -at::ones_like(lp);
        return r;
    };
    core::OptimOverrides o = rl::serve::tinker_adam_defaults();
    o.learning_rate = 1e-2;
    for (int step = 0; step < steps; ++step) {
        core::TrainBatch bt;
        bt.input_ids = at::tensor(ids, at::kLong);
        bt.cu_seqlens = {0, static_cast<int64_t>(ids.size())};
        t.forward_backward(bt, ce);
        t.optim_step(o);
    }
}

/// Reference: the trainer's logprobs of `text` (token t from the tokens before it).
std::vector<double> trainer_logprobs(core::Trainer &t, const std::string &text) {
    std::vector<int64_t> ids(text.begin(), text.end());
    core::TrainBatch b;
    b.input_ids = at::tensor(ids, at::kLong);
    b.cu_seqlens = {0, static_cast<int64_t>(ids.size())};
    const at::Tensor lp = t.forward(b, nullptr).tensors.at("logprobs").to(at::kDouble);
    return std::vector<double>(lp.data_ptr<double>() + 1, lp.data_ptr<double>() + lp.numel());
}

const char *kText = "Reverse: abcdef -> fedcba";

TEST(TrainingServer, SftOverTheJsonWireLowersTheLoss) {
    Srv s;
    const std::string model = s.model(s.session());
    const json data = json::array({sft_datum(kText), sft_datum("Reverse: xyz -> zyx")});
    std::vector<double> losses;
    int64_t seq = 1;
    for (int step = 0; step < 6; ++step) {
        const json fb = s.call("/api/v1/forward_backward", fb_body(model, seq++, data));
        ASSERT_TRUE(fb.contains("metrics")) << fb.dump();
        losses.push_back(fb["metrics"]["loss:sum"].get<double>());
        // 0.16 sends only the fields the user set.
        const json opt = s.call(
            "/api/v1/optim_step",
            {{"model_id", model}, {"seq_id", seq++}, {"adam_params", {{"learning_rate", 3e-3}}}});
        ASSERT_TRUE(opt.contains("metrics")) << opt.dump();
        EXPECT_GT(opt["metrics"]["grad_norm"].get<double>(), 0);
    }
    EXPECT_LT(losses.back(), losses.front() * 0.8) << json(losses).dump();
}

TEST(TrainingServer, LogprobsAreTheTrainersForTheShiftedTargets) {
    Srv s;
    const std::string model = s.model(s.session());
    const json fwd =
        s.call("/api/v1/forward",
               {{"model_id", model},
                {"seq_id", 1},
                {"forward_input",
                 {{"data", json::array({sft_datum(kText)})}, {"loss_fn", "cross_entropy"}}}});
    ASSERT_TRUE(fwd.contains("loss_fn_outputs")) << fwd.dump();
    const auto lp = logprobs_of(fwd, 0);
    core::Trainer ref(core::Policy::load(tiny_dir()), core::TrainerConfig{});
    const auto want = trainer_logprobs(ref, kText);
    ASSERT_EQ(lp.size(), want.size());
    double sum = 0;
    for (size_t i = 0; i < lp.size(); ++i) {
        EXPECT_NEAR(lp[i], want[i], 1e-5) << "token " << i;
        sum -= want[i];
    }
    EXPECT_NEAR(fwd["metrics"]["loss:sum"].get<double>(), sum, 1e-3);
    const auto el =
        fwd["loss_fn_outputs"][0]["elementwise_loss"]["data"].get<std::vector<double>>();
    EXPECT_NEAR(el[3], -want[3], 1e-5);
}

// ---- a small protobuf writer / reader (independent of the server's) --------------------

std::string varint(uint64_t v) {
    std::string s;
    while (v >= 0x80) {
        s.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    s.push_back(static_cast<char>(v));
    return s;
}
std::string field(uint32_t f, const std::string &bytes) {
    return varint((f << 3) | 2) + varint(bytes.size()) + bytes;
}
std::string field_varint(uint32_t f, uint64_t v) {
    return varint(f << 3) + varint(v);
}
template <typename T>
std::string raw(const std::vector<T> &v) {
    return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

std::string proto_datum(const std::string &text) {
    std::vector<int32_t> input(text.begin(), text.end() - 1);
    std::vector<int64_t> target(text.begin() + 1, text.end());
    std::vector<float> w(target.size(), 1.0f);
    const std::string chunk = field(1, field(1, raw(input)));
    const std::string t1 =
        field(1, raw(target)) + field_varint(3, 2) + field(4, varint(target.size()));
    const std::string t2 = field(1, raw(w)) + field_varint(3, 1) + field(4, varint(w.size()));
    return field(1, chunk) + field(2, field(1, "target_tokens") + field(2, t1)) +
           field(2, field(1, "weights") + field(2, t2));
}

struct Reader {
    const char *p, *end;
    bool done() const { return p >= end; }
    uint64_t v() {
        uint64_t x = 0;
        for (int s = 0;; s += 7) {
            const uint8_t b = static_cast<uint8_t>(*p++);
            x |= static_cast<uint64_t>(b & 0x7f) << s;
            if (!(b & 0x80)) return x;
        }
    }
    std::string bytes() {
        const uint64_t n = v();
        std::string s(p, n);
        p += n;
        return s;
    }
    /// The next length-delimited field (its number and bytes), skipping
    /// varint and 64-bit fields; false at the end.
    bool next(uint64_t &number, std::string &out) {
        while (!done()) {
            const uint64_t tag = v();
            if ((tag & 7) == 0) {
                v();
            } else if ((tag & 7) == 1) {
                p += 8;
            } else {
                number = tag >> 3;
                out = bytes();
                return true;
            }
        }
        return false;
    }
};

/// ForwardBackwardOutput -> field name -> per-datum float vectors.
std::map<std::string, std::vector<std::vector<float>>>
decode_fb(const std::string &msg, std::map<std::string, double> &metrics) {
    std::map<std::string, std::vector<std::vector<float>>> out;
    Reader r{msg.data(), msg.data() + msg.size()};
    uint64_t n = 0;
    std::string b;
    while (r.next(n, b)) {
        if (n == 2) { // ArrayRecord
            Reader a{b.data(), b.data() + b.size()};
            uint64_t an = 0;
            std::string e;
            while (a.next(an, e)) {
                if (an != 2) continue;
                Reader en{e.data(), e.data() + e.size()};
                uint64_t k = 0;
                std::string key, bt, x;
                while (en.next(k, x)) (k == 1 ? key : bt) = x;
                Reader t{bt.data(), bt.data() + bt.size()};
                std::string data, offsets;
                while (t.next(k, x)) {
                    if (k == 1) data = x;
                    if (k == 2) offsets = x;
                }
                std::vector<int64_t> off(offsets.size() / 8);
                std::memcpy(off.data(), offsets.data(), offsets.size());
                for (size_t i = 0; i + 1 < off.size(); ++i) {
                    std::vector<float> f((off[i + 1] - off[i]) / 4);
                    std::memcpy(f.data(), data.data() + off[i], f.size() * 4);
                    out[key].push_back(f);
                }
            }
        } else if (n == 3) { // metrics entry
            Reader en{b.data(), b.data() + b.size()};
            std::string key;
            double value = 0;
            while (!en.done()) {
                const uint64_t et = en.v();
                if ((et >> 3) == 1)
                    key = en.bytes();
                else {
                    std::memcpy(&value, en.p, 8);
                    en.p += 8;
                }
            }
            metrics[key] = value;
        }
    }
    return out;
}

TEST(TrainingServer, ProtobufRequestsAndResultsMatchTheJsonWire) {
    Srv s;
    const std::string model = s.model(s.session());
    // Forward only, as SDK 0.25+ sends it: forward_only in the protobuf request.
    const std::string req = field(1, model) + field_varint(2, 1) + field(3, proto_datum(kText)) +
                            field(4, "cross_entropy") + field_varint(6, 1);
    const HttpResponse sub =
        s.post_raw("/api/v1/forward_backward", req, {{"Content-Type", "application/x-protobuf"}});
    ASSERT_EQ(sub.status, 200) << sub.body;
    const std::string id = json::parse(sub.body)["request_id"];
    const json got = s.result(id, {{"Accept", "application/x-protobuf"}});
    ASSERT_TRUE(got.contains("proto")) << got.dump();
    std::map<std::string, double> metrics;
    auto fields = decode_fb(got["proto"].get<std::string>(), metrics);
    ASSERT_EQ(fields["logprobs"].size(), 1u);
    // The same call's JSON result (retrieved again without Accept: protobuf).
    const json js = s.result(id);
    const auto lp = logprobs_of(js, 0);
    ASSERT_EQ(fields["logprobs"][0].size(), lp.size());
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(fields["logprobs"][0][i], lp[i], 1e-6);
    EXPECT_NEAR(metrics["loss:sum"], js["metrics"]["loss:sum"].get<double>(), 1e-9);
    // A compressed body is refused: the server does not advertise it.
    const HttpResponse z =
        s.post_raw("/api/v1/forward_backward", req,
                   {{"Content-Type", "application/x-protobuf"}, {"Content-Encoding", "zstd"}});
    EXPECT_EQ(z.status, 415) << z.body;
    // A truncated body is a 400.
    const HttpResponse t = s.post_raw("/api/v1/forward_backward", req.substr(0, req.size() - 3),
                                      {{"Content-Type", "application/x-protobuf"}});
    EXPECT_EQ(t.status, 400) << t.body;
}

void expect_refused(const HttpResponse &r, int status, const std::string &param,
                    const std::string &words) {
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"].value("param", ""), param) << r.body;
    EXPECT_NE(j["error"].value("message", "").find(words), std::string::npos) << r.body;
}

TEST(TrainingServer, BadRequestsAreRefusedNamingTheField) {
    Srv s;
    const std::string model = s.model(s.session());
    const json data = json::array({sft_datum(kText)});
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, data, "no_such_loss")), 400,
                   "forward_backward_input.loss_fn", "no_such_loss");
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, data, "dro")), 400,
                   "forward_backward_input.loss_fn", "not implemented");
    json bad = data;
    bad[0]["loss_fn_inputs"]["weights"] = {
        {"data", {1.0, 1.0}}, {"dtype", "float32"}, {"shape", {2}}};
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, bad)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.weights", "shape [2]");
    json two_d = data;
    two_d[0]["loss_fn_inputs"]["weights"]["shape"] = {2, 12};
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, two_d)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.weights", "shape");
    expect_refused(
        s.post("/api/v1/forward_backward", fb_body(model, 1, data, "importance_sampling")), 400,
        "forward_backward_input.data[0].loss_fn_inputs.logprobs", "required");
    expect_refused(
        s.post("/api/v1/forward_backward", fb_body(model, 1, data, "ppo", {{"clip_bogus", 1.0}})),
        400, "forward_backward_input.loss_fn_config", "'clip_bogus'");
    expect_refused(s.post("/api/v1/forward_backward",
                          fb_body(model, 1, data, "ppo", {{"clip_low_threshold", 0.0}})),
                   400, "loss_fn_config.clip_low_threshold", "outside (0, 1]");
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, data, "importance_sampling",
                                                              {{"clip_high_threshold", 2.0}})),
                   400, "loss_fn_config.clip_high_threshold", "only ppo and cispo clip");
    json extra = data;
    extra[0]["loss_fn_inputs"]["mystery"] = {1, 2, 3};
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, extra)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.mystery", "");
    json oov = data;
    oov[0]["model_input"]["chunks"][0]["tokens"][2] = 100000;
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, oov)), 400,
                   "forward_backward_input.data[0].model_input", "vocabulary");
    json image = data;
    image[0]["model_input"]["chunks"][0]["type"] = "image";
    expect_refused(s.post("/api/v1/forward_backward", fb_body(model, 1, image)), 400,
                   "forward_backward_input.data[0].model_input.chunks[0].type", "text");
    expect_refused(s.post("/api/v1/forward_backward", fb_body("nobody", 1, data)), 404, "model_id",
                   "unknown model_id");
    expect_refused(s.post("/api/v1/optim_step",
                          {{"model_id", model}, {"adam_params", {{"learning_rate", "fast"}}}}),
                   400, "adam_params.learning_rate", "number");
    // A nested object given as something else: before, it read as {} and the call ran
    // on defaults (an optimizer step at Tinker's default learning rate).
    expect_refused(s.post("/api/v1/optim_step", {{"model_id", model}, {"adam_params", 5}}), 400,
                   "adam_params", "must be a JSON object, not number");
    expect_refused(s.post("/api/v1/create_model", {{"session_id", s.session()},
                                                   {"base_model", "tiny"},
                                                   {"lora_config", json::array({4})}}),
                   400, "lora_config", "must be a JSON object, not array");
    expect_refused(
        s.post("/api/v1/create_model", {{"session_id", s.session()}, {"base_model", "gpt-9"}}), 400,
        "base_model", "gpt-9");
    expect_refused(s.post("/api/v1/retrieve_future", json::object()), 400, "request_id",
                   "required");
    expect_refused(s.post("/api/v1/retrieve_future", {{"request_id", "future-nope"}}), 410,
                   "request_id", "unknown");
    expect_refused(
        s.post("/api/v1/load_weights", {{"model_id", model}, {"path", "tinker://a/b/c/d"}}), 400,
        "path", "not a checkpoint path");
    const HttpResponse notjson = s.post_raw("/api/v1/optim_step", "{nope", {});
    EXPECT_EQ(notjson.status, 400) << notjson.body;
    // An optimizer step with no gradients fails in its future, category user.
    const json opt = s.call("/api/v1/optim_step", {{"model_id", model}, {"seq_id", 1}});
    EXPECT_EQ(opt.value("category", ""), "user") << opt.dump();
    EXPECT_FALSE(opt.value("error", "").empty());
}

/// A Tinker RL datum over `text`: the sampler's logprobs `sampled` and the
/// advantages and weights per target token (as many as the text has tokens - 1).
json rl_datum(const std::string &text, const std::vector<double> &sampled,
              const std::vector<double> &adv, const std::vector<double> &w) {
    json d = sft_datum(text);
    auto tensor = [](const std::vector<double> &v) {
        return json{{"data", v}, {"dtype", "float32"}, {"shape", {v.size()}}};
    };
    d["loss_fn_inputs"]["logprobs"] = tensor(sampled);
    d["loss_fn_inputs"]["advantages"] = tensor(adv);
    d["loss_fn_inputs"]["weights"] = tensor(w);
    return d;
}

// Tinker's four loss names run the loss plugins that implement them (one
// implementation per loss everywhere), as sums over the target tokens, with
// Tinker's thresholds translated; the summed loss is Tinker's formula over the
// logprobs the server returns.
TEST(TrainingServer, TinkerLossNamesRunTheLossPluginsAsSums) {
    auto asked = std::make_shared<std::vector<std::pair<std::string, json>>>();
    rl::host::bridge::LossFactory inner = plugin_losses();
    Srv s(json::object(), [asked, inner](const std::string &name, const std::string &params) {
        asked->emplace_back(name, json::parse(params));
        return inner(name, params);
    });
    const std::string model = s.model(s.session());
    const std::string text = kText;
    const size_t n = text.size() - 1;
    std::vector<double> sampled(n), adv(n), w(n);
    for (size_t i = 0; i < n; ++i) {
        sampled[i] = -4.0 + 0.35 * std::sin(1.7 * static_cast<double>(i)) * 6;
        adv[i] = std::cos(0.9 * static_cast<double>(i));
        w[i] = i % 5 == 3 ? 0.0 : 0.5 + 0.25 * static_cast<double>(i % 3);
    }
    const json data = json::array({rl_datum(text, sampled, adv, w)});
    int64_t seq = 1;
    // Forward-only calls: the weights stay as they are, so every formula reads
    // the same logprobs.
    auto run = [&](const std::string &loss, const json &config) {
        const json r = s.call(
            "/api/v1/forward",
            {{"model_id", model},
             {"seq_id", seq++},
             {"forward_input", {{"data", data}, {"loss_fn", loss}, {"loss_fn_config", config}}}});
        EXPECT_TRUE(r.contains("metrics")) << r.dump();
        return r;
    };
    auto sum = [&](const json &r, const std::function<double(double, size_t)> &term) {
        const auto lp = logprobs_of(r, 0);
        EXPECT_EQ(lp.size(), n);
        double total = 0;
        for (size_t i = 0; i < n; ++i) total += w[i] * term(lp[i], i);
        return total;
    };
    auto expect_loss = [&](const json &r, double want) {
        const double got = r["metrics"]["loss:sum"].get<double>();
        EXPECT_NEAR(got, want, 1e-4 * (1 + std::fabs(want))) << r.dump();
    };

    const json is = run("importance_sampling", nullptr);
    expect_loss(is,
                sum(is, [&](double lp, size_t i) { return -std::exp(lp - sampled[i]) * adv[i]; }));
    const json ppo = run("ppo", {{"clip_low_threshold", 0.9}, {"clip_high_threshold", 1.1}});
    expect_loss(ppo, sum(ppo, [&](double lp, size_t i) {
                    const double r = std::exp(lp - sampled[i]);
                    return -std::min(r * adv[i], std::clamp(r, 0.9, 1.1) * adv[i]);
                }));
    const json cispo = run("cispo", {{"clip_high_threshold", 2.0}});
    expect_loss(cispo, sum(cispo, [&](double lp, size_t i) {
                    return -std::clamp(std::exp(lp - sampled[i]), 0.0, 2.0) * adv[i] * lp;
                }));
    // Weights of either sign: what the SDK's forward_backward_custom sends.
    json ce_data = json::array({sft_datum(text)});
    std::vector<double> signed_w(n);
    for (size_t i = 0; i < n; ++i) signed_w[i] = i % 2 ? -0.5 : 1.5;
    ce_data[0]["loss_fn_inputs"]["weights"]["data"] = signed_w;
    const json ce = s.call("/api/v1/forward",
                           {{"model_id", model},
                            {"seq_id", seq++},
                            {"forward_input", {{"data", ce_data}, {"loss_fn", "cross_entropy"}}}});
    {
        const auto lp = logprobs_of(ce, 0);
        double want = 0;
        for (size_t i = 0; i < n; ++i) want += -signed_w[i] * lp[i];
        expect_loss(ce, want);
    }

    ASSERT_EQ(asked->size(), 4u);
    EXPECT_EQ((*asked)[0].first, "importance_sampling");
    EXPECT_EQ((*asked)[0].second, json({{"loss_agg_mode", "sum"}}));
    EXPECT_EQ((*asked)[1].first, "policy_loss");
    EXPECT_EQ((*asked)[1].second.value("loss_agg_mode", ""), "sum");
    EXPECT_NEAR((*asked)[1].second.value("eps_clip", 0.0), 0.1, 1e-12);
    EXPECT_NEAR((*asked)[1].second.value("eps_clip_high", 0.0), 0.1, 1e-12);
    EXPECT_EQ((*asked)[2].first, "cispo");
    EXPECT_EQ((*asked)[2].second, json({{"loss_agg_mode", "sum"}, {"clip_high", 2.0}}));
    EXPECT_EQ((*asked)[3].first, "per_token_ce");

    // The plugin's own parameters pass through (xorl clients send them).
    const json xorl_style = run("cispo", {{"clip_low", 0.5}, {"clip_high", 1.5}});
    expect_loss(xorl_style, sum(xorl_style, [&](double lp, size_t i) {
                    return -std::clamp(std::exp(lp - sampled[i]), 0.5, 1.5) * adv[i] * lp;
                }));
}

TEST(TrainingServer, WithoutLossPluginsTinkerLossNamesAreRefusedSayingSo) {
    Srv s(json::object(), rl::host::bridge::LossFactory());
    const std::string model = s.model(s.session());
    expect_refused(
        s.post("/api/v1/forward_backward", fb_body(model, 1, json::array({sft_datum(kText)}))), 400,
        "forward_backward_input.loss_fn",
        "Tinker's cross_entropy runs loss plugin 'per_token_ce'): no loss plugins are "
        "loaded");
}

// Bodies a hostile client can send: each is a 400 naming the field, and the
// server stays up for the next request.
TEST(TrainingServer, HostileBodiesAreRefusedWith400AndTheServerStaysUp) {
    Srv s;
    const std::string model = s.model(s.session());
    const json data = json::array({sft_datum(kText)});
    const std::string fb = "/api/v1/forward_backward";
    // 100,000 nested lists in `tokens`: copying or printing it would overflow the stack.
    std::string body = fb_body(model, 1, data).dump();
    const std::string tokens = "\"tokens\":[";
    const size_t at = body.find(tokens);
    ASSERT_NE(at, std::string::npos);
    body.insert(at + tokens.size(), std::string(100000, '[') + std::string(100000, ']') + ",");
    HttpResponse r = s.post_raw(fb, body, {});
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
    EXPECT_NE(r.body.find("nested deeper than"), std::string::npos) << r.body.substr(0, 300);
    // A number past a double's range.
    r = s.post_raw("/api/v1/optim_step",
                   R"({"model_id": ")" + model + R"(", "adam_params": {"learning_rate": 1e400}})",
                   {});
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("out of range"), std::string::npos) << r.body;
    // Sparse CSR weights whose row pointer runs past the values.
    json sparse = data;
    const size_t n = sparse[0]["loss_fn_inputs"]["target_tokens"]["data"].size();
    std::vector<int64_t> crow(n + 1, 0);
    crow[1] = 1000000;
    crow[n] = 1;
    sparse[0]["loss_fn_inputs"]["weights"] = {{"data", {1.0}},
                                              {"dtype", "float32"},
                                              {"shape", {n, 1}},
                                              {"sparse_crow_indices", crow},
                                              {"sparse_col_indices", {0}}};
    expect_refused(s.post(fb, fb_body(model, 1, sparse)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.weights",
                   "sparse_crow_indices[1] = 1000000");
    // A huge sparse shape with no values would densify to 2^60 values.
    sparse[0]["loss_fn_inputs"]["weights"] = {{"data", json::array()},
                                              {"dtype", "float32"},
                                              {"shape", {1, int64_t{1} << 60}},
                                              {"sparse_crow_indices", {0, 0}},
                                              {"sparse_col_indices", json::array()}};
    expect_refused(s.post(fb, fb_body(model, 1, sparse)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.weights.shape", "more than");
    // A dense shape whose product overflows 64 bits to the number of values (0).
    json wrap = data;
    wrap[0]["loss_fn_inputs"]["weights"] = {{"data", json::array()},
                                            {"dtype", "float32"},
                                            {"shape", {int64_t{1} << 32, int64_t{1} << 32}}};
    expect_refused(s.post(fb, fb_body(model, 1, wrap)), 400,
                   "forward_backward_input.data[0].loss_fn_inputs.weights.shape", "more than");
    // The server still trains.
    const json ok = s.call(fb, fb_body(model, 1, data));
    EXPECT_TRUE(ok.contains("loss_fn_outputs")) << ok.dump().substr(0, 300);
}

// tinker >= 0.38 finishes its session from ServiceClient.close().
TEST(TrainingServer, AFinishedSessionIsTerminalAndTheFirstReasonWins) {
    Srv s;
    const std::string session = s.session();
    const std::string model = s.model(session);
    const std::string finish = "/api/v1/sessions/" + session + "/finish";
    HttpResponse r = s.post(finish, {{"reason", {{"type", "interrupted"}}}, {"detail", "ctrl-c"}});
    ASSERT_EQ(r.status, 200) << r.body;
    r = s.post(finish, {{"reason", {{"type", "success"}}}, {"detail", nullptr}});
    EXPECT_EQ(r.status, 200) << r.body; // a second finish changes nothing
    expect_refused(
        s.post("/api/v1/forward_backward", fb_body(model, 1, json::array({sft_datum(kText)}))), 410,
        "model_id", "was finished by its client (interrupted: ctrl-c)");
    expect_refused(s.post("/api/v1/session_heartbeat", {{"session_id", session}}), 410,
                   "session_id", "was finished by its client (interrupted: ctrl-c)");
    expect_refused(s.post("/api/v1/sessions/session-nope/finish", json::object()), 404,
                   "session_id", "unknown session");
    const std::string other = s.session();
    expect_refused(
        s.post("/api/v1/sessions/" + other + "/finish", {{"reason", {{"type", "exploded"}}}}), 400,
        "reason.type", "exploded");
    EXPECT_EQ(s.post("/api/v1/sessions/" + other + "/stop", json::object()).status, 404);
}

TEST(TrainingServer, ExpiredSessionsAreRefusedWith410) {
    Srv s(json{{"session_timeout_s", 0.5}});
    const std::string session = s.session();
    const std::string model = s.model(session);
    // Heartbeats keep it alive.
    for (int i = 0; i < 4; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        EXPECT_EQ(s.post("/api/v1/session_heartbeat", {{"session_id", session}}).status, 200);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    expect_refused(
        s.post("/api/v1/forward_backward", fb_body(model, 1, json::array({sft_datum(kText)}))), 410,
        "model_id", "expired");
    expect_refused(s.post("/api/v1/session_heartbeat", {{"session_id", session}}), 410,
                   "session_id", "expired");
}

TEST(TrainingServer, CallsOfOneModelRunInSeqIdOrder) {
    Srv s(json{{"seq_gap_wait_s", 30}, {"workers", 2}});
    const std::string model = s.model(s.session());
    // optim_step (seq 2) arrives before the forward_backward (seq 1) it needs.
    const std::string opt =
        s.submit("/api/v1/optim_step",
                 {{"model_id", model}, {"seq_id", 2}, {"adam_params", {{"learning_rate", 1e-3}}}});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string fb =
        s.submit("/api/v1/forward_backward", fb_body(model, 1, json::array({sft_datum(kText)})));
    const json o = s.result(opt);
    EXPECT_TRUE(o.contains("metrics")) << o.dump();
    EXPECT_TRUE(s.result(fb).contains("loss_fn_outputs"));
}

TEST(TrainingServer, ACallThatIsNextInSeqIdOrderRunsAtOnceAfterTheLaneEmptied) {
    // A client that waits for each result before the next call empties the model's
    // queue between calls. Its next seq_id must still count as the next one: before,
    // every such call waited seq_gap_wait_s (2 s by default) for calls long done.
    // With an hour of gap wait, a call that waited never ends within the polls.
    Srv s(json{{"seq_gap_wait_s", 3600}, {"poll_timeout_s", 0.5}});
    const std::string model = s.model(s.session());
    const json data = json::array({sft_datum(kText)});
    int64_t seq = 1;
    for (int step = 0; step < 3; ++step) {
        const json fb = s.call("/api/v1/forward_backward", fb_body(model, seq++, data));
        ASSERT_TRUE(fb.contains("loss_fn_outputs")) << "step " << step << ": " << fb.dump();
        const json opt = s.call(
            "/api/v1/optim_step",
            {{"model_id", model}, {"seq_id", seq++}, {"adam_params", {{"learning_rate", 1e-3}}}});
        ASSERT_TRUE(opt.contains("metrics")) << "step " << step << ": " << opt.dump();
    }
    // A real gap still waits: seq 10 after 6 stays queued while 7-9 have not come.
    const std::string later = s.submit("/api/v1/forward_backward", fb_body(model, 10, data));
    const HttpResponse r = s.post("/api/v1/retrieve_future", {{"request_id", later}});
    EXPECT_EQ(json::parse(r.body).value("type", ""), "try_again") << r.body;
}

TEST(TrainingServer, TwoSessionsTrainConcurrentlyWithoutInterfering) {
    Srv s(json{{"workers", 2}});
    const std::string a = s.model(s.session()), b = s.model(s.session());
    const std::string ta = "Reverse: abc -> cba", tb = "Reverse: hello -> olleh";
    // Interleaved submissions; each model sees only its own data.
    std::vector<std::string> ids;
    int64_t seq = 1;
    for (int step = 0; step < 3; ++step) {
        ids.push_back(
            s.submit("/api/v1/forward_backward", fb_body(a, seq, json::array({sft_datum(ta)}))));
        ids.push_back(
            s.submit("/api/v1/forward_backward", fb_body(b, seq, json::array({sft_datum(tb)}))));
        ++seq;
        for (const auto &m : {a, b})
            ids.push_back(s.submit(
                "/api/v1/optim_step",
                {{"model_id", m}, {"seq_id", seq}, {"adam_params", {{"learning_rate", 1e-2}}}}));
        ++seq;
    }
    for (const auto &id : ids) EXPECT_FALSE(s.result(id).contains("error"));
    // References trained alone with the same steps.
    auto reference = [&](const std::string &text) {
        core::TrainerConfig c;
        c.gradient_clip = 0;
        core::Trainer t(core::Policy::load(tiny_dir()), c);
        train_ce_locally(t, text, 3);
        return trainer_logprobs(t, kText);
    };
    for (const auto &[model, text] : {std::pair{a, ta}, std::pair{b, tb}}) {
        const json fwd =
            s.call("/api/v1/forward",
                   {{"model_id", model},
                    {"seq_id", seq},
                    {"forward_input",
                     {{"data", json::array({sft_datum(kText)})}, {"loss_fn", "cross_entropy"}}}});
        const auto got = logprobs_of(fwd, 0);
        const auto want = reference(text);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
            EXPECT_NEAR(got[i], want[i], 2e-4) << model << " token " << i;
    }
}

TEST(TrainingServer, SamplingFromASnapshotGivesTokensAndPromptLogprobs) {
    Srv s;
    const std::string session = s.session();
    const std::string model = s.model(session);
    const json saved = s.call("/api/v1/save_weights_for_sampler",
                              {{"model_id", model}, {"sampling_session_seq_id", 0}, {"seq_id", 1}});
    ASSERT_TRUE(saved["path"].is_null()) << saved.dump();
    const std::string sampler = saved["sampling_session_id"];
    std::vector<int64_t> prompt(kText, kText + 10);
    const json body = {{"sampling_session_id", sampler},
                       {"seq_id", 0},
                       {"num_samples", 3},
                       {"prompt", {{"chunks", {{{"tokens", prompt}}}}}},
                       {"sampling_params", {{"max_tokens", 5}, {"seed", 11}}},
                       {"prompt_logprobs", true}};
    const json out = s.call("/api/v1/asample", body);
    ASSERT_EQ(out["sequences"].size(), 3u) << out.dump();
    for (const auto &seq : out["sequences"]) {
        EXPECT_LE(seq["tokens"].size(), 5u);
        EXPECT_EQ(seq["logprobs"].size(), seq["tokens"].size());
    }
    EXPECT_EQ(s.call("/api/v1/asample", body)["sequences"], out["sequences"]) << "same seed";
    ASSERT_EQ(out["prompt_logprobs"].size(), prompt.size());
    EXPECT_TRUE(out["prompt_logprobs"][0].is_null());
    core::Trainer ref(core::Policy::load(tiny_dir()), core::TrainerConfig{});
    const auto want = trainer_logprobs(ref, std::string(kText, 10));
    for (size_t i = 1; i < prompt.size(); ++i)
        EXPECT_NEAR(out["prompt_logprobs"][i].get<double>(), want[i - 1], 1e-4);
    // GET /api/v1/samplers/<id> names the base model.
    const HttpResponse info = http_request(s.server->url(), "GET", "/api/v1/samplers/" + sampler);
    EXPECT_EQ(json::parse(info.body).value("base_model", ""), "tiny") << info.body;
    expect_refused(s.post("/api/v1/asample", {{"sampling_session_id", sampler},
                                              {"prompt", {{"chunks", {{{"tokens", prompt}}}}}},
                                              {"sampling_params", {{"max_tokens", 100000}}}}),
                   400, "sampling_params.max_tokens", "");
}

TEST(TrainingServer, SaveStateAndLoadItBack) {
    Srv s;
    const std::string model = s.model(s.session());
    const json data = json::array({sft_datum(kText)});
    int64_t seq = 1;
    s.call("/api/v1/forward_backward", fb_body(model, seq++, data));
    s.call("/api/v1/optim_step",
           {{"model_id", model}, {"seq_id", seq++}, {"adam_params", {{"learning_rate", 1e-2}}}});
    const json saved =
        s.call("/api/v1/save_weights", {{"model_id", model}, {"seq_id", seq++}, {"path", "ckpt1"}});
    ASSERT_EQ(saved.value("path", ""), "tinker://" + model + "/weights/ckpt1") << saved.dump();
    auto forward = [&] {
        return logprobs_of(
            s.call("/api/v1/forward",
                   {{"model_id", model},
                    {"seq_id", seq++},
                    {"forward_input", {{"data", data}, {"loss_fn", "cross_entropy"}}}}),
            0);
    };
    const auto at_save = forward();
    s.call("/api/v1/forward_backward", fb_body(model, seq++, data));
    s.call("/api/v1/optim_step",
           {{"model_id", model}, {"seq_id", seq++}, {"adam_params", {{"learning_rate", 1e-2}}}});
    EXPECT_NE(forward(), at_save);
    const json again =
        s.call("/api/v1/save_weights", {{"model_id", model}, {"seq_id", seq++}, {"path", "ckpt1"}});
    EXPECT_EQ(again.value("category", ""), "user") << "a name is not overwritten silently";
    const json loaded = s.call(
        "/api/v1/load_weights",
        {{"model_id", model}, {"seq_id", seq++}, {"path", saved["path"]}, {"optimizer", true}});
    EXPECT_FALSE(loaded.contains("error")) << loaded.dump();
    const auto after = forward();
    for (size_t i = 0; i < after.size(); ++i) EXPECT_NEAR(after[i], at_save[i], 1e-6);
    const HttpResponse info = s.post("/api/v1/weights_info", {{"tinker_path", saved["path"]}});
    EXPECT_EQ(json::parse(info.body).value("base_model", ""), "tiny") << info.body;
    // A named sampler checkpoint opens as a sampling session.
    const json sw = s.call("/api/v1/save_weights_for_sampler",
                           {{"model_id", model}, {"seq_id", seq++}, {"path", "s1"}});
    const HttpResponse ss = s.post(
        "/api/v1/create_sampling_session",
        {{"session_id", s.session()}, {"sampling_session_seq_id", 0}, {"model_path", sw["path"]}});
    EXPECT_EQ(ss.status, 200) << ss.body;
    // The list, newest first, each with its ISO time and size (xorl-client reads
    // checkpoint_id, checkpoint_type, time, path, size_bytes).
    const HttpResponse list = s.post("/api/v1/list_checkpoints", {{"model_id", model}});
    ASSERT_EQ(list.status, 200) << list.body;
    const json cks = json::parse(list.body)["checkpoints"];
    ASSERT_EQ(cks.size(), 2u) << list.body;
    EXPECT_EQ(cks[0]["checkpoint_id"], "sampler_weights/s1") << list.body;
    EXPECT_EQ(cks[0]["checkpoint_type"], "sampler");
    EXPECT_EQ(cks[1]["checkpoint_id"], "weights/ckpt1");
    EXPECT_EQ(cks[1]["path"], saved["path"]);
    const std::regex iso(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00)");
    for (const auto &c : cks) {
        EXPECT_TRUE(std::regex_match(c["time"].get<std::string>(), iso)) << c.dump();
        EXPECT_GT(c["size_bytes"].get<int64_t>(), 10000) << c.dump();
    }
    EXPECT_GE(cks[0]["time"].get<std::string>(), cks[1]["time"].get<std::string>());
}

// The REST client's get_training_run, which tinker-cookbook asks for the renderer
// a checkpoint was trained with: the user_metadata given at create_model (or at a
// create-via-load), the base model and LoRA rank, the newest checkpoints; answered
// after the model's session is finished too.
TEST(TrainingServer, TrainingRunsCarryTheirUserMetadataAndLastCheckpoints) {
    Srv s;
    auto get = [&](const std::string &id) {
        return http_request(s.server->url(), "GET",
                            "/api/v1/training_runs/" + id + "?access_scope=owned", "", s.auth, 60);
    };
    const std::string session = s.session();
    const json created =
        s.call("/api/v1/create_model", {{"session_id", session},
                                        {"model_seq_id", 0},
                                        {"base_model", "tiny"},
                                        {"lora_config", {{"rank", 4}}},
                                        {"user_metadata", {{"renderer_name", "qwen3_instruct"}}}});
    const std::string model = created.value("model_id", "");
    ASSERT_FALSE(model.empty()) << created.dump();
    HttpResponse r = get(model);
    ASSERT_EQ(r.status, 200) << r.body;
    json run = json::parse(r.body);
    EXPECT_EQ(run["training_run_id"], model);
    EXPECT_EQ(run["base_model"], "tiny");
    EXPECT_EQ(run["model_owner"], session);
    EXPECT_EQ(run["is_lora"], true);
    EXPECT_EQ(run["lora_rank"], 4);
    EXPECT_EQ(run["corrupted"], false);
    EXPECT_EQ(run["user_metadata"], json({{"renderer_name", "qwen3_instruct"}}));
    EXPECT_TRUE(run["last_checkpoint"].is_null()) << r.body;
    EXPECT_TRUE(run["last_sampler_checkpoint"].is_null()) << r.body;
    const std::regex iso(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00)");
    EXPECT_TRUE(std::regex_match(run["last_request_time"].get<std::string>(), iso)) << r.body;

    int64_t seq = 1;
    s.call("/api/v1/forward_backward", fb_body(model, seq++, json::array({sft_datum(kText)})));
    s.call("/api/v1/optim_step",
           {{"model_id", model}, {"seq_id", seq++}, {"adam_params", {{"learning_rate", 1e-2}}}});
    const json saved =
        s.call("/api/v1/save_weights", {{"model_id", model}, {"seq_id", seq++}, {"path", "a"}});
    s.call("/api/v1/save_weights", {{"model_id", model}, {"seq_id", seq++}, {"path", "b"}});
    s.call("/api/v1/save_weights_for_sampler",
           {{"model_id", model}, {"seq_id", seq++}, {"path", "s"}});
    ASSERT_EQ(s.post("/api/v1/sessions/" + session + "/finish", json::object()).status, 200);
    r = get(model); // the run outlives its session
    ASSERT_EQ(r.status, 200) << r.body;
    run = json::parse(r.body);
    EXPECT_EQ(run["last_checkpoint"].value("tinker_path", ""), "tinker://" + model + "/weights/b")
        << r.body;
    EXPECT_EQ(run["last_checkpoint"].value("checkpoint_type", ""), "training");
    EXPECT_EQ(run["last_sampler_checkpoint"].value("tinker_path", ""),
              "tinker://" + model + "/sampler_weights/s")
        << r.body;
    EXPECT_EQ(run["user_metadata"]["renderer_name"], "qwen3_instruct");
    // A checkpoint folder without run.json (written by an older server): the
    // run as its newest checkpoint describes it, without user_metadata.
    fs::remove(fs::path(s.server->config().checkpoint_dir) / model / "run.json");
    r = get(model);
    ASSERT_EQ(r.status, 200) << r.body;
    run = json::parse(r.body);
    EXPECT_EQ(run["is_lora"], true);
    EXPECT_EQ(run["lora_rank"], 4);
    EXPECT_EQ(run["user_metadata"], json::object());
    EXPECT_EQ(run["last_checkpoint"].value("tinker_path", ""), "tinker://" + model + "/weights/b");

    // Create-via-load (newer SDKs' create_training_client_from_state): the new
    // run has the load's user_metadata and the checkpoint's LoRA rank.
    const std::string other = s.session();
    const json loaded =
        s.call("/api/v1/load_weights", {{"session_id", other},
                                        {"model_seq_id", 0},
                                        {"path", saved["path"]},
                                        {"optimizer", false},
                                        {"user_metadata", {{"renderer_name", "role_colon"}}}});
    ASSERT_FALSE(loaded.contains("error")) << loaded.dump();
    r = get(loaded.value("model_id", ""));
    ASSERT_EQ(r.status, 200) << r.body;
    run = json::parse(r.body);
    EXPECT_EQ(run["lora_rank"], 4);
    EXPECT_EQ(run["user_metadata"], json({{"renderer_name", "role_colon"}}));
    EXPECT_TRUE(run["last_checkpoint"].is_null()) << r.body;

    // Values that are not strings (the SDK types them Any) come back as their
    // JSON text.
    const json numbered = s.call(
        "/api/v1/create_model",
        {{"session_id", s.session()}, {"model_seq_id", 0}, {"user_metadata", {{"step", 3}}}});
    r = get(numbered.value("model_id", ""));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["user_metadata"], json({{"step", "3"}})) << r.body;

    // A full-weight model without user_metadata.
    const std::string full = s.model(s.session());
    r = get(full);
    ASSERT_EQ(r.status, 200) << r.body;
    run = json::parse(r.body);
    EXPECT_EQ(run["is_lora"], false);
    EXPECT_TRUE(run["lora_rank"].is_null());
    EXPECT_EQ(run["user_metadata"], json::object());

    expect_refused(get("session-nope:train:0"), 404, "training_run_id", "session-nope:train:0");
    expect_refused(get(".."), 400, "training_run_id", "'..'");
    EXPECT_EQ(get(model + "/checkpoints").status, 404);
    expect_refused(
        s.post("/api/v1/create_model",
               {{"session_id", s.session()}, {"model_seq_id", 0}, {"user_metadata", "qwen3"}}),
        400, "user_metadata", "must be an object");
}

TEST(TrainingServer, BackPressureApiKeyAndDisconnects) {
    Srv s(
        json{{"max_queued", 2}, {"workers", 1}, {"api_key", "tml-secret"}, {"poll_timeout_s", 2}});
    // No key: 401; the health check needs none.
    EXPECT_EQ(s.post("/api/v1/create_session", json::object()).status, 401);
    EXPECT_EQ(http_request(s.server->url(), "GET", "/api/v1/healthz").status, 200);
    s.auth = {{"X-API-Key", "tml-secret"}};
    const std::string model = s.model(s.session());
    // A full queue answers 429 with Retry-After.
    const json data = json::array();
    json many = json::array();
    for (int i = 0; i < 40; ++i) many.push_back(sft_datum(kText));
    int refused = 0;
    std::vector<std::string> ids;
    for (int i = 0; i < 8; ++i) {
        const HttpResponse r = s.post("/api/v1/forward_backward", fb_body(model, i + 1, many));
        if (r.status == 429) {
            ++refused;
            EXPECT_EQ(r.header("retry-after"), "1");
        } else {
            EXPECT_EQ(r.status, 200) << r.body;
            ids.push_back(json::parse(r.body)["request_id"]);
        }
    }
    EXPECT_GT(refused, 0);
    // A poller that hangs up loses nothing: the result is still there.
    try {
        http_request(s.server->url(), "POST", "/api/v1/retrieve_future",
                     json{{"request_id", ids.back()}}.dump(), s.auth, 0.05);
    } catch (const std::exception &) {
    }
    for (const auto &id : ids) EXPECT_TRUE(s.result(id).contains("loss_fn_outputs"));
    // Bearer works too (xorl-client).
    s.auth = {{"Authorization", "Bearer tml-secret"}};
    EXPECT_EQ(s.post("/api/v1/get_info", {{"model_id", model}}).status, 200);
}

TEST(TrainingServer, LoraSessionsTrainTheirOwnAdaptersOverOneSharedBase) {
    Srv s(json{{"workers", 2}});
    const std::string sa = s.session(), sb = s.session();
    auto lora_model = [&](const std::string &session, int rank, int seed) {
        const json r = s.call("/api/v1/create_model", {{"session_id", session},
                                                       {"model_seq_id", 0},
                                                       {"base_model", "tiny"},
                                                       {"lora_config",
                                                        {{"rank", rank},
                                                         {"seed", seed},
                                                         {"train_unembed", true},
                                                         {"train_mlp", true},
                                                         {"train_attn", true}}}});
        EXPECT_TRUE(r.contains("model_id")) << r.dump();
        return r.value("model_id", "");
    };
    const std::string a = lora_model(sa, 4, 1), b = lora_model(sb, 8, 2);
    const json info = json::parse(s.post("/api/v1/get_info", {{"model_id", b}}).body);
    EXPECT_TRUE(info.value("is_lora", false)) << info.dump();
    EXPECT_EQ(info.value("lora_rank", 0), 8);
    const std::string ta = "Reverse: abc -> cba", tb = "Reverse: hello -> olleh";
    std::vector<std::string> ids;
    int64_t seq = 1;
    for (int step = 0; step < 3; ++step, seq += 2) {
        ids.push_back(
            s.submit("/api/v1/forward_backward", fb_body(a, seq, json::array({sft_datum(ta)}))));
        ids.push_back(
            s.submit("/api/v1/forward_backward", fb_body(b, seq, json::array({sft_datum(tb)}))));
        for (const auto &m : {a, b})
            ids.push_back(
                s.submit("/api/v1/optim_step", {{"model_id", m},
                                                {"seq_id", seq + 1},
                                                {"adam_params", {{"learning_rate", 1e-2}}}}));
    }
    for (const auto &id : ids) EXPECT_FALSE(s.result(id).contains("error"));

    // The same adapters trained alone, locally.
    auto reference = [&](const std::string &text, int rank, int seed) {
        auto policy = core::Policy::load(tiny_dir());
        const json cfg = {
            {"rank", rank},
            {"seed", seed},
            {"target_modules",
             {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}};
        auto adapter = policy->create_adapter("ref", core::LoraConfig::from_json(cfg.dump()));
        core::TrainerConfig c;
        c.gradient_clip = 0;
        auto t = std::make_unique<core::Trainer>(policy, c, adapter);
        train_ce_locally(*t, text, 3);
        return std::make_pair(policy, adapter);
    };
    for (const auto &[model, text, rank, seed] :
         {std::tuple{a, ta, 4, 1}, std::tuple{b, tb, 8, 2}}) {
        auto [policy, adapter] = reference(text, rank, seed);
        // Parameters: the server's adapter (saved as a PEFT folder) equals the reference.
        const json saved = s.call("/api/v1/save_weights_for_sampler",
                                  {{"model_id", model}, {"seq_id", seq}, {"path", "peft"}});
        ASSERT_TRUE(saved.contains("path")) << saved.dump();
        const std::string dir =
            s.server->config().checkpoint_dir + "/" + model + "/sampler_weights/peft";
        ASSERT_TRUE(fs::exists(dir + "/adapter_config.json")) << dir;
        auto loaded = core::load_adapter(policy->model(), dir, "loaded");
        std::map<std::string, at::Tensor> want;
        for (const auto &kv : adapter->named_parameters()) want[kv.first] = kv.second;
        size_t n = 0;
        for (const auto &kv : loaded->named_parameters()) {
            ASSERT_TRUE(want.count(kv.first)) << kv.first;
            EXPECT_TRUE(at::allclose(kv.second, want[kv.first], 1e-4, 1e-5))
                << model << " " << kv.first;
            ++n;
        }
        EXPECT_EQ(n, want.size());
        EXPECT_GT(n, 0u);
        // Logprobs through the server equal the reference's.
        const json fwd =
            s.call("/api/v1/forward",
                   {{"model_id", model},
                    {"seq_id", seq + 1},
                    {"forward_input",
                     {{"data", json::array({sft_datum(kText)})}, {"loss_fn", "cross_entropy"}}}});
        const auto got = logprobs_of(fwd, 0);
        core::TrainerConfig c;
        core::Trainer scorer(policy, c, adapter);
        const auto ref = trainer_logprobs(scorer, kText);
        ASSERT_EQ(got.size(), ref.size());
        for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref[i], 2e-4) << model;
    }
    seq += 2;
    // The shared base is untouched: a base sampler scores as the fresh model does.
    const HttpResponse base_sampler =
        s.post("/api/v1/create_sampling_session",
               {{"session_id", sa}, {"sampling_session_seq_id", 9}, {"base_model", "tiny"}});
    ASSERT_EQ(base_sampler.status, 200) << base_sampler.body;
    std::vector<int64_t> prompt(kText, kText + std::strlen(kText));
    const json scored =
        s.call("/api/v1/asample",
               {{"sampling_session_id", json::parse(base_sampler.body)["sampling_session_id"]},
                {"num_samples", 1},
                {"prompt", {{"chunks", json::array({{{"tokens", prompt}}})}}},
                {"sampling_params", {{"max_tokens", 1}}},
                {"prompt_logprobs", true}});
    core::Trainer fresh(core::Policy::load(tiny_dir()), core::TrainerConfig{});
    const auto base_lp = trainer_logprobs(fresh, kText);
    for (size_t i = 1; i < prompt.size(); ++i)
        EXPECT_NEAR(scored["prompt_logprobs"][i].get<double>(), base_lp[i - 1], 1e-4);
    // The engine samples with the adapter: a snapshot's sampled-token logprobs
    // are the trainer's logprobs of those tokens under the adapter.
    const json snap = s.call("/api/v1/save_weights_for_sampler",
                             {{"model_id", a}, {"seq_id", seq}, {"sampling_session_seq_id", 0}});
    const std::string sid = snap.value("sampling_session_id", "");
    ASSERT_FALSE(sid.empty()) << snap.dump();
    std::vector<int64_t> p10(kText, kText + 10);
    const json out =
        s.call("/api/v1/asample", {{"sampling_session_id", sid},
                                   {"num_samples", 2},
                                   {"prompt", {{"chunks", json::array({{{"tokens", p10}}})}}},
                                   {"sampling_params", {{"max_tokens", 6}, {"seed", 5}}}});
    ASSERT_EQ(out["sequences"].size(), 2u) << out.dump();
    for (const auto &sq : out["sequences"]) {
        std::vector<int64_t> full = p10;
        for (const auto &t : sq["tokens"]) full.push_back(t.get<int64_t>());
        if (full.size() == p10.size()) continue;
        json d = {
            {"model_input",
             {{"chunks",
               json::array({{{"tokens", std::vector<int64_t>(full.begin(), full.end() - 1)}}})}}},
            {"loss_fn_inputs",
             {{"target_tokens",
               {{"data", std::vector<int64_t>(full.begin() + 1, full.end())},
                {"dtype", "int64"}}}}}};
        const json f =
            s.call("/api/v1/forward",
                   {{"model_id", a},
                    {"seq_id", ++seq},
                    {"forward_input", {{"data", json::array({d})}, {"loss_fn", "cross_entropy"}}}});
        const auto lp = logprobs_of(f, 0);
        const auto sampled = sq["logprobs"].get<std::vector<double>>();
        for (size_t k = 0; k < sampled.size(); ++k)
            EXPECT_NEAR(sampled[k], lp[p10.size() - 1 + k], 1e-4) << "token " << k;
    }
}

TEST(TrainingServer, XorlDialectAliases) {
    Srv s;
    // xorl names its model and sends input_ids + labels (unshifted) and loss_fn_params.
    const json created =
        s.call("/api/v1/create_model", {{"model_id", "policy"}, {"base_model", "tiny"}});
    ASSERT_EQ(created.value("model_id", ""), "policy") << created.dump();
    std::vector<int64_t> ids(kText, kText + std::strlen(kText));
    json xdatum = {{"model_input", {{"input_ids", ids}}}, {"loss_fn_inputs", {{"labels", ids}}}};
    json xfwd = {{"model_id", "policy"},
                 {"forward_input",
                  {{"data", json::array({xdatum})},
                   {"loss_fn", "cross_entropy"},
                   {"loss_fn_params", nullptr}}}};
    const json fwd = s.call("/api/v1/forward", xfwd);
    ASSERT_TRUE(fwd.contains("loss_fn_outputs")) << fwd.dump();
    const auto lp = logprobs_of(fwd, 0);
    core::Trainer ref(core::Policy::load(tiny_dir()), core::TrainerConfig{});
    const auto want = trainer_logprobs(ref, kText);
    ASSERT_EQ(lp.size(), want.size() + 1); // the first token has no prediction (0)
    for (size_t i = 1; i < lp.size(); ++i) EXPECT_NEAR(lp[i], want[i - 1], 1e-5);
    json xbody = {{"model_id", "policy"},
                  {"forward_backward_input", {{"data", json::array({xdatum})}}}};
    const json opt_fb = s.call("/api/v1/forward_backward", xbody);
    EXPECT_TRUE(opt_fb.contains("metrics")) << opt_fb.dump();
    // Top-level learning_rate / gradient_clip.
    const json opt =
        s.call("/api/v1/optim_step",
               {{"model_id", "policy"}, {"learning_rate", 1e-3}, {"gradient_clip", 1.0}});
    EXPECT_NEAR(opt["metrics"]["learning_rate"].get<double>(), 1e-3, 1e-12) << opt.dump();
    // Paths handed to xorl's models are xorl://, in the answer and the list.
    const json sw =
        s.call("/api/v1/save_weights_for_sampler", {{"model_id", "policy"}, {"name", "x1"}});
    EXPECT_EQ(sw.value("path", ""), "xorl://policy/sampler_weights/x1") << sw.dump();
    const HttpResponse listed = s.post("/api/v1/list_checkpoints", {{"model_id", "policy"}});
    ASSERT_EQ(listed.status, 200) << listed.body;
    EXPECT_EQ(json::parse(listed.body)["checkpoints"][0].value("path", ""),
              "xorl://policy/sampler_weights/x1")
        << listed.body;
    const HttpResponse h = http_request(s.server->url(), "GET", "/health");
    EXPECT_EQ(json::parse(h.body).value("status", ""), "healthy");
    const HttpResponse kill = s.post("/api/v1/kill_session", {{"model_id", "policy"}});
    EXPECT_TRUE(json::parse(kill.body).value("success", false)) << kill.body;
    expect_refused(s.post("/api/v1/get_info", {{"model_id", "policy"}}), 410, "model_id",
                   "unloaded");
}

} // namespace

namespace {

// The router logits of every MoE layer of one forward of `ids` (one sequence).
std::vector<at::Tensor> own_router_logits(core::Policy &policy, const std::vector<int64_t> &ids) {
    at::NoGradGuard ng;
    core::RouterLogitsRecorder rec;
    core::PackedBatch pb;
    pb.input_ids = at::tensor(ids, at::kLong);
    pb.cu_seqlens =
        at::tensor(std::vector<int64_t>{0, static_cast<int64_t>(ids.size())}, at::kLong);
    policy.model().logits(pb);
    return rec.logits();
}

// The routing the model chooses for `ids`: [T][L][K] expert ids.
json own_routing(core::Policy &policy, const std::vector<int64_t> &ids) {
    const at::Tensor r = core::routed_experts_of(own_router_logits(policy, ids),
                                                 policy.model().config().num_experts_per_tok);
    json out = json::array();
    for (int64_t t = 0; t < r.size(0); ++t) {
        json layers = json::array();
        for (int64_t l = 0; l < r.size(1); ++l) {
            json ks = json::array();
            for (int64_t k = 0; k < r.size(2); ++k) ks.push_back(r[t][l][k].item<int64_t>());
            layers.push_back(ks);
        }
        out.push_back(layers);
    }
    return out;
}

std::string base64_of(const std::vector<uint8_t> &bytes) {
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string s;
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const uint32_t w = static_cast<uint32_t>(bytes[i]) << 16 |
                           (i + 1 < bytes.size() ? static_cast<uint32_t>(bytes[i + 1]) << 8 : 0) |
                           (i + 2 < bytes.size() ? bytes[i + 2] : 0);
        s += a[(w >> 18) & 63];
        s += a[(w >> 12) & 63];
        s += i + 1 < bytes.size() ? a[(w >> 6) & 63] : '=';
        s += i + 2 < bytes.size() ? a[w & 63] : '=';
    }
    return s;
}

// Little-endian 32-bit values of a nested list [T][L][K], base64: int32 ids,
// or float32 weights when `as_float`.
std::string base64_of_32(const json &routing, bool as_float) {
    std::vector<uint8_t> bytes;
    for (const auto &layers : routing)
        for (const auto &ks : layers)
            for (const auto &x : ks) {
                uint32_t u = 0;
                if (as_float) {
                    const float f = x.get<float>();
                    std::memcpy(&u, &f, 4);
                } else {
                    u = static_cast<uint32_t>(x.get<int32_t>());
                }
                for (int b = 0; b < 4; ++b) bytes.push_back((u >> (8 * b)) & 0xFF);
            }
    return base64_of(bytes);
}

std::string base64_of_int32(const json &routing) {
    return base64_of_32(routing, false);
}

// [T][L][K] nested lists of a tensor.
json nested(const at::Tensor &t) {
    json out = json::array();
    for (int64_t i = 0; i < t.size(0); ++i) {
        json layers = json::array();
        for (int64_t l = 0; l < t.size(1); ++l) {
            json ks = json::array();
            for (int64_t k = 0; k < t.size(2); ++k)
                ks.push_back(t.is_floating_point() ? json(t[i][l][k].item<double>())
                                                   : json(t[i][l][k].item<int64_t>()));
            layers.push_back(ks);
        }
        out.push_back(layers);
    }
    return out;
}

// The routing weights the model mixes `ids`' experts with: [T][L][K].
json own_weights(core::Policy &policy, const std::vector<int64_t> &ids) {
    const core::ModelConfig &c = policy.model().config();
    return nested(core::routed_expert_weights_of(own_router_logits(policy, ids),
                                                 c.num_experts_per_tok, c.norm_topk_prob));
}

// A fresh tiny MoE model (seed `seed`) in tiny_dir() + `suffix`.
std::string tiny_moe_dir(const std::string &suffix, uint64_t seed) {
    const std::string dir = tiny_dir() + suffix;
    core::write_tiny_model(dir, seed, core::tiny_moe_spec());
    return dir;
}

// The datum of `ids` as xorl's client sends it: the tokens are their own labels.
json xorl_datum(const std::vector<int64_t> &ids) {
    return {{"model_input", {{"input_ids", ids}}}, {"loss_fn_inputs", {{"labels", ids}}}};
}

} // namespace

// xorl's R3: forward_backward_input.routed_experts, one routing per datum (a
// nested list, {data: base64 int32, shape} or the SGLang rows without the
// last token), reaches the trainer: the model's own routing gives the
// logprobs of routing itself, another routing changes them; bad ones and a
// dense model are refused naming the field.
TEST(TrainingServer, XorlRoutedExpertsAreReplayedByTheTrainer) {
    const std::string dir = tiny_moe_dir("-moe", 9);
    Srv s(json::object(), plugin_losses(), dir);
    const std::string model = s.model(s.session());
    const std::vector<int64_t> ids = {'r', 'o', 'u', 't', 'e', ' ', 'm', 'e'};
    const int64_t T = static_cast<int64_t>(ids.size());
    const json xdatum = xorl_datum(ids);
    const int64_t E = s.base->model().config().num_experts;
    auto forward = [&](const json &routes, int seq) {
        json in = {{"data", json::array({xdatum})}, {"loss_fn", "cross_entropy"}};
        if (!routes.is_null()) in["routed_experts"] = routes;
        return s.post("/api/v1/forward",
                      {{"model_id", model}, {"seq_id", seq}, {"forward_input", in}});
    };
    auto logprobs = [&](const json &routes, int seq) {
        const HttpResponse r = forward(routes, seq);
        EXPECT_EQ(r.status, 200) << r.body;
        const json res = s.result(json::parse(r.body).value("request_id", ""));
        return res["loss_fn_outputs"][0]["logprobs"]["data"].get<std::vector<double>>();
    };
    const json own = own_routing(*s.base, ids);
    ASSERT_EQ(own.size(), static_cast<size_t>(T));
    const std::vector<double> self = logprobs(nullptr, 1);
    const std::vector<double> replayed = logprobs(json::array({own}), 2);
    ASSERT_EQ(replayed.size(), self.size());
    for (size_t i = 0; i < self.size(); ++i) EXPECT_NEAR(replayed[i], self[i], 1e-5) << i;
    // SGLang's rows (the last token never forwarded) as {data, shape}: the same.
    json sglang = own;
    sglang.erase(sglang.size() - 1);
    const json packed = {{"data", base64_of_int32(sglang)},
                         {"shape", {T - 1, own[0].size(), own[0][0].size()}},
                         {"dtype", "int32"}};
    const std::vector<double> from_b64 = logprobs(json::array({packed}), 3);
    for (size_t i = 0; i + 1 < self.size(); ++i) EXPECT_NEAR(from_b64[i], self[i], 1e-5) << i;
    // Another routing in the last layer: other experts, other logprobs.
    json other = own;
    for (auto &layers : other) {
        json &last = layers[layers.size() - 1];
        std::vector<int64_t> mine = last.get<std::vector<int64_t>>(), pick;
        for (int64_t e = 0; e < E && pick.size() < mine.size(); ++e)
            if (std::find(mine.begin(), mine.end(), e) == mine.end()) pick.push_back(e);
        last = pick;
    }
    const std::vector<double> moved = logprobs(json::array({other}), 4);
    double diff = 0;
    for (size_t i = 1; i < self.size(); ++i) diff = std::max(diff, std::abs(moved[i] - self[i]));
    EXPECT_GT(diff, 1e-3);

    // Refusals name the field.
    json short_one = own;
    short_one.erase(0);
    short_one.erase(0);
    expect_refused(forward(json::array({short_one}), 5), 400, "forward_input.routed_experts[0]",
                   "must be [8, ");
    expect_refused(forward(json::array({own, own}), 5), 400, "forward_input.routed_experts",
                   "one routing per datum (1)");
    json bad_id = own;
    bad_id[3][1][0] = E;
    // An id out of range fails the call in its future, naming token and layer.
    const HttpResponse oor = forward(json::array({bad_id}), 5);
    ASSERT_EQ(oor.status, 200) << oor.body;
    const json failed = s.result(json::parse(oor.body).value("request_id", ""));
    EXPECT_NE(failed.dump().find("at token 3, sparse layer 1 (decoder layer 1): expert id 8 is "
                                 "outside [0, 8)"),
              std::string::npos)
        << failed.dump();
    // A dense model has nothing to replay.
    Srv dense;
    const std::string dm = dense.model(dense.session());
    json in = {{"data", json::array({xdatum})},
               {"loss_fn", "cross_entropy"},
               {"routed_experts", json::array({own})}};
    expect_refused(
        dense.post("/api/v1/forward", {{"model_id", dm}, {"seq_id", 1}, {"forward_input", in}}),
        400, "forward_input.routed_experts", "no sparse MoE layer");
    std::error_code ec;
    fs::remove_all(dir, ec);
}

// xorl's routed_expert_logits (the recorded top-k routing weights, float32
// [T, L, K]) next to routed_experts: the trainer mixes the replayed experts
// with exactly those weights. Uniform weights give the logprobs of the same
// model with its routers zeroed (whose replayed weights are then uniform): a
// direct computation; they differ from the replay without weights; the
// model's own weights (SGLang's rows, base64 float32) give its own logprobs.
// Bad weights are refused naming the field.
TEST(TrainingServer, XorlRoutedExpertLogitsWeighTheReplayedExperts) {
    const std::string dir = tiny_moe_dir("-moe-weights", 11);
    Srv s(json::object(), plugin_losses(), dir);
    const std::string model = s.model(s.session());
    const std::vector<int64_t> ids = {'w', 'e', 'i', 'g', 'h', 't', 'e', 'd'};
    const int64_t T = static_cast<int64_t>(ids.size());
    const json xdatum = xorl_datum(ids);
    const core::ModelConfig &c = s.base->model().config();
    const int64_t K = c.num_experts_per_tok;
    int seq = 1;
    auto call = [&](const char *op, const json &routes, const json &weights) {
        const std::string key = std::string(op) + "_input";
        json in = {{"data", json::array({xdatum})}, {"loss_fn", "cross_entropy"}};
        if (!routes.is_null()) in["routed_experts"] = routes;
        if (!weights.is_null()) in["routed_expert_logits"] = weights;
        return s.post(std::string("/api/v1/") + op,
                      {{"model_id", model}, {"seq_id", seq++}, {key, in}});
    };
    auto logprobs = [&](const char *op, const json &routes, const json &weights) {
        const HttpResponse r = call(op, routes, weights);
        EXPECT_EQ(r.status, 200) << r.body;
        const json res = s.result(json::parse(r.body).value("request_id", ""));
        return res["loss_fn_outputs"][0]["logprobs"]["data"].get<std::vector<double>>();
    };
    const json own = own_routing(*s.base, ids);
    const json mine = own_weights(*s.base, ids);
    ASSERT_EQ(mine.size(), static_cast<size_t>(T));
    json uniform = mine;
    const double u =
        c.norm_topk_prob ? 1.0 / static_cast<double>(K) : 1.0 / static_cast<double>(c.num_experts);
    for (auto &layers : uniform)
        for (auto &ks : layers)
            for (auto &w : ks) w = u;

    const std::vector<double> ids_only = logprobs("forward", json::array({own}), nullptr);
    const std::vector<double> weighted =
        logprobs("forward_backward", json::array({own}), json::array({uniform}));
    ASSERT_EQ(weighted.size(), ids_only.size());
    double moved = 0;
    for (size_t i = 0; i < weighted.size(); ++i)
        moved = std::max(moved, std::abs(weighted[i] - ids_only[i]));
    EXPECT_GT(moved, 1e-4) << "recorded weights were not used";
    // The model's own weights as xorl-sglang sends them (SGLang's rows, the
    // last token never forwarded; base64 float32): its own logprobs.
    json sg_ids = own, sg_w = mine;
    sg_ids.erase(sg_ids.size() - 1);
    sg_w.erase(sg_w.size() - 1);
    const json w_packed = {{"data", base64_of_32(sg_w, true)},
                           {"shape", {T - 1, sg_w[0].size(), K}},
                           {"dtype", "float32"}};
    const json id_packed = {{"data", base64_of_int32(sg_ids)},
                            {"shape", {T - 1, sg_ids[0].size(), K}}};
    const std::vector<double> as_own =
        logprobs("forward", json::array({id_packed}), json::array({w_packed}));
    for (size_t i = 0; i + 1 < ids_only.size(); ++i) EXPECT_NEAR(as_own[i], ids_only[i], 1e-5) << i;
    // Bare base64: the same.
    const std::vector<double> bare = logprobs("forward", json::array({base64_of_int32(own)}),
                                              json::array({base64_of_32(mine, true)}));
    for (size_t i = 0; i < ids_only.size(); ++i) EXPECT_NEAR(bare[i], ids_only[i], 1e-5) << i;

    // Refusals name the field.
    const std::string f = "forward_input.routed_expert_logits";
    json short_w = uniform;
    short_w.erase(0);
    short_w.erase(0);
    expect_refused(call("forward", json::array({own}), json::array({short_w})), 400, f + "[0]",
                   "must be [8, ");
    json sg_short = uniform;
    sg_short.erase(sg_short.size() - 1);
    expect_refused(call("forward", json::array({own}), json::array({sg_short})), 400, f + "[0]",
                   "has 7 tokens but routed_experts[0] 8");
    json nan_w = mine;
    nan_w[2][1][1] = std::nan("");
    expect_refused(call("forward", json::array({own}),
                        json::array({{{"data", base64_of_32(nan_w, true)},
                                      {"shape", {T, nan_w[0].size(), K}}}})),
                   400, f + "[0]", "at token 2, sparse layer 1, slot 1: nan is not a finite");
    expect_refused(call("forward", json::array({own}),
                        json::array({{{"data", base64_of_int32(own)},
                                      {"shape", {T, own[0].size(), K}},
                                      {"dtype", "int32"}}})),
                   400, f + "[0]", ".dtype must be \"float32\"");
    json text_w = uniform;
    text_w[0][0][0] = "half";
    expect_refused(call("forward", json::array({own}), json::array({text_w})), 400, f + "[0]",
                   "not one of the routing weights");
    expect_refused(call("forward", nullptr, json::array({uniform})), 400, f,
                   "needs routed_experts");
    expect_refused(call("forward", json::array({own}), json::array({uniform, uniform})), 400, f,
                   "one routing-weight array per datum (1)");
    expect_refused(call("forward", json::array({nullptr}), json::array({uniform})), 400, f + "[0]",
                   "is given but routed_experts[0] is null");

    // The direct computation: the same model with every router zeroed (a
    // second server whose session clones it) weighs the replayed experts
    // uniformly, so ids alone give what the uniform weights gave.
    Srv z(json::object(), plugin_losses(), dir);
    {
        at::NoGradGuard ng;
        for (auto &layer : z.base->model().model->layers)
            if (layer->moe) layer->moe->gate->weight.zero_();
    }
    const std::string zmodel = z.model(z.session());
    json zin = {{"data", json::array({xdatum})},
                {"loss_fn", "cross_entropy"},
                {"routed_experts", json::array({own})}};
    const HttpResponse zr =
        z.post("/api/v1/forward", {{"model_id", zmodel}, {"seq_id", 1}, {"forward_input", zin}});
    ASSERT_EQ(zr.status, 200) << zr.body;
    const std::vector<double> zeroed = z.result(json::parse(zr.body).value(
        "request_id", ""))["loss_fn_outputs"][0]["logprobs"]["data"]
                                           .get<std::vector<double>>();
    ASSERT_EQ(zeroed.size(), weighted.size());
    for (size_t i = 0; i < weighted.size(); ++i) EXPECT_NEAR(weighted[i], zeroed[i], 1e-5) << i;
    std::error_code ec;
    fs::remove_all(dir, ec);
}
