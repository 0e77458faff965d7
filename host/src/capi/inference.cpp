// abi/rl/inference.h over rl::serve::InferenceClient.
#include "rollouts.hpp"
#include "train_common.hpp"

#include "serve/fields.hpp"
#include "serve/inference_client.hpp"
#include "serve/routed_experts_wire.hpp"

struct rl_inference_client {
    std::unique_ptr<rl::serve::InferenceClient> impl;
};

namespace {

// The SGLang sampling_params of our sampling params.
json sglang_sampling(const core::SamplingParams &p) {
    json s = {{"n", p.n},
              {"temperature", p.temperature},
              {"top_p", p.top_p},
              {"top_k", p.top_k > 0 ? p.top_k : -1},
              {"max_new_tokens", p.max_tokens}};
    if (!p.stop.empty()) s["stop"] = p.stop;
    if (p.stop_token_ids) s["stop_token_ids"] = *p.stop_token_ids;
    if (p.seed) s["sampling_seed"] = *p.seed;
    return s;
}

// Appends one sample's routing from its meta_info ("routed_experts", base64
// int32 [tokens - 1, L, K], and "routed_expert_meta" {"shape"}) to g, the
// never-forwarded last token as a -1 row: Generation::routed_experts' layout.
void read_routing(const json &meta, int64_t tokens, const std::string &at, const char *fn,
                  core::Generation &g) {
    const json &shape = meta.value("routed_expert_meta", json::object()).value("shape", json());
    if (!meta.contains("routed_experts") || !shape.is_array() || shape.size() != 3 ||
        !shape[1].is_number_integer() || !shape[2].is_number_integer())
        throw HostError{RL_ERR_IO,
                        fn_msg(fn, at + " has no routed_experts with routed_expert_meta.shape "
                                        "(sampling.return_routed_experts needs a server that "
                                        "returns routings: rlhost serve or xorl-sglang on a "
                                        "mixture-of-experts model)")};
    const int64_t layers = shape[1].get<int64_t>(), k = shape[2].get<int64_t>();
    if (g.routed_layers == 0) {
        g.routed_layers = layers;
        g.routed_k = k;
    } else if (layers != g.routed_layers || k != g.routed_k) {
        throw HostError{RL_ERR_IO,
                        fn_msg(fn, at + "'s routing has another layout than sample 0's")};
    }
    std::vector<int32_t> ids;
    try {
        ids = rl::serve::parse_routed_experts(
            {{"data", meta["routed_experts"]}, {"shape", shape}, {"dtype", "int32"}}, tokens,
            layers, k, at + " meta_info.routed_experts");
    } catch (const rl::serve::ApiError &e) {
        throw HostError{RL_ERR_IO, fn_msg(fn, e.what())};
    }
    g.routed_experts.insert(g.routed_experts.end(), ids.begin(), ids.end());
}

// Appends one sample's recorded routing weights from its meta_info
// ("expert_logits", base64 float32 in read_routing's layout, with
// "expert_logits_meta" {"shape"}), the last token's row 0:
// Generation::routed_expert_weights' layout. After read_routing.
void read_routing_weights(const json &meta, int64_t tokens, const std::string &at, const char *fn,
                          core::Generation &g) {
    if (!meta.contains("expert_logits"))
        throw HostError{RL_ERR_IO,
                        fn_msg(fn, at + " has no expert_logits (sampling.return_expert_logits "
                                        "needs a server that returns the routing weights: "
                                        "rlhost serve, or xorl-sglang started with "
                                        "--enable-return-expert-logits)")};
    json item = {{"data", meta["expert_logits"]}, {"dtype", "float32"}};
    const json &info = meta.value("expert_logits_meta", json::object());
    if (info.is_object() && info.contains("shape")) item["shape"] = info["shape"];
    std::vector<float> w;
    try {
        w = rl::serve::parse_expert_logits(item, tokens, g.routed_layers, g.routed_k,
                                           at + " meta_info.expert_logits");
    } catch (const rl::serve::ApiError &e) {
        throw HostError{RL_ERR_IO, fn_msg(fn, e.what())};
    }
    g.routed_expert_weights.insert(g.routed_expert_weights.end(), w.begin(), w.end());
}

// Samples `prompts` on the server (one /generate call for the batch) as a
// Generation: tokens, their logprobs, texts, finish reasons, and the oldest
// weight version the replies report.
core::Generation remote_generate(const rl::serve::InferenceClient &client,
                                 const std::vector<std::vector<int64_t>> &prompts,
                                 const core::SamplingParams &params, const char *fn) {
    json request = {{"input_ids", prompts},
                    {"sampling_params", sglang_sampling(params)},
                    {"return_logprob", true}};
    // Routing replay (R3): the server's routing of each sample, in meta_info
    // as xorl-sglang encodes it (docs/serving.md).
    if (params.return_routed_experts) request["return_routed_experts"] = true;
    if (params.return_expert_logits) request["return_expert_logits"] = true;
    const json reply = client.call("POST", "/generate", request);
    const json items = reply.is_array() ? reply : json::array({reply});
    const size_t want = prompts.size() * static_cast<size_t>(params.n);
    if (items.size() != want)
        throw HostError{RL_ERR_IO,
                        fn_msg(fn, "the server returned " + std::to_string(items.size()) +
                                       " samples, expected " + std::to_string(want))};
    core::Generation g;
    g.cu_seqlens.push_back(0);
    int64_t version = -1;
    for (size_t i = 0; i < items.size(); ++i) {
        const json &it = items[i];
        const std::string at = "sample " + std::to_string(i) + " of the reply";
        if (!it.is_object() || !it.contains("output_ids") || !it.contains("meta_info"))
            throw HostError{RL_ERR_IO, fn_msg(fn, at + " has no output_ids / meta_info")};
        const json &meta = it["meta_info"];
        const auto ids = it["output_ids"].get<std::vector<int64_t>>();
        const json &lps = meta.value("output_token_logprobs", json::array());
        if (lps.size() != ids.size())
            throw HostError{RL_ERR_IO,
                            fn_msg(fn, at + " has " + std::to_string(ids.size()) + " tokens but " +
                                           std::to_string(lps.size()) + " logprobs")};
        for (size_t t = 0; t < ids.size(); ++t) {
            g.token_ids.push_back(ids[t]);
            g.logprobs.push_back(lps[t].at(0).is_number() ? lps[t][0].get<float>() : 0.0f);
        }
        g.cu_seqlens.push_back(static_cast<int64_t>(g.token_ids.size()));
        g.prompt_index.push_back(static_cast<int64_t>(i) / params.n);
        if (params.return_routed_experts) {
            const size_t prompt = prompts[i / static_cast<size_t>(params.n)].size();
            read_routing(meta, static_cast<int64_t>(prompt + ids.size()), at, fn, g);
            if (params.return_expert_logits)
                read_routing_weights(meta, static_cast<int64_t>(prompt + ids.size()), at, fn, g);
        }
        g.completions.push_back(it.value("text", ""));
        const json &fr = meta.value("finish_reason", json());
        const std::string type = fr.is_object() ? fr.value("type", "") : "";
        if (type == "stop")
            g.finish_reasons.push_back(core::FinishReason::Stop);
        else if (type == "length")
            g.finish_reasons.push_back(core::FinishReason::Length);
        else
            throw HostError{RL_ERR_IO,
                            fn_msg(fn, at + " did not finish (finish_reason " + fr.dump() + ")")};
        const json &wv = meta.value("weight_version", json());
        int64_t v = 0;
        try {
            v = wv.is_string()           ? std::stoll(wv.get<std::string>())
                : wv.is_number_integer() ? wv.get<int64_t>()
                                         : 0;
        } catch (const std::exception &) {
            v = 0; // a label that is not a number (SGLang's "default")
        }
        version = version < 0 ? v : std::min(version, v);
    }
    g.policy_version = std::max<int64_t>(version, 0);
    return g;
}

} // namespace

extern "C" {

RL_API rl_status_t rl_inference_client_rollouts(rl_inference_client_t *client, rl_model_t *model,
                                                const char *tasks_json, const char *options_json,
                                                rl_rollouts_t **out_rollouts) {
    return train_boundary([&] {
        const char *fn = "rl_inference_client_rollouts";
        if (!client || !model || !out_rollouts)
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "client, model and out_rollouts are required")};
        const core::Tokenizer &tok = tokenizer_of(model, fn);
        const int64_t vocab =
            model->policy ? model->policy->model().config().vocab_size : tok.vocab_size();
        *out_rollouts = generate_rollouts(
            tok, vocab, tasks_json, options_json, fn,
            [&](const std::vector<std::vector<int64_t>> &prompts, const core::SamplingParams &p) {
                return remote_generate(*client->impl, prompts, p, fn);
            });
        return RL_OK;
    });
}

RL_API rl_status_t rl_inference_client_create(const char *options_json,
                                              rl_inference_client_t **out_client) {
    return train_boundary([&] {
        const char *fn = "rl_inference_client_create";
        if (out_client == nullptr)
            throw HostError{RL_ERR_INVALID_ARG, fn_msg(fn, "out_client is NULL")};
        const json j = parse_json(options_json, std::string(fn) + ": options_json");
        if (!j.is_object())
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "options_json must be an object with at least \"url\"")};
        auto c = std::make_unique<rl_inference_client>();
        c->impl =
            std::make_unique<rl::serve::InferenceClient>(rl::serve::ClientOptions::from_json(j));
        *out_client = c.release();
        return RL_OK;
    });
}

RL_API void rl_inference_client_destroy(rl_inference_client_t *client) {
    delete client;
}

RL_API rl_status_t rl_inference_client_call(rl_inference_client_t *client, const char *method,
                                            const char *path, const char *body_json,
                                            rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_inference_client_call";
        if (!client || !method || !path || !out_result)
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "client, method, path and out_result are required")};
        *out_result = nullptr;
        const json body = parse_json(body_json, std::string(fn) + ": body_json");
        const json reply = client->impl->call(method, path, body);
        CallSink sink;
        sink.texts["body"] = reply.is_string() ? reply.get<std::string>() : reply.dump();
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_inference_client_sync(rl_inference_client_t *client, rl_model_t *model,
                                            int64_t version, const char *options_json,
                                            rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_inference_client_sync";
        if (!client || !model)
            throw HostError{RL_ERR_INVALID_ARG, fn_msg(fn, "client and model are required")};
        if (out_result) *out_result = nullptr;
        const json opts = parse_json(options_json, std::string(fn) + ": options_json");
        const rl::serve::SyncOutcome o = client->impl->sync(
            policy_of(model, fn), version, rl::serve::SyncOptions::from_json(opts));
        CallSink sink;
        sink.scalars["skipped"] = o.skipped ? 1.0 : 0.0;
        sink.scalars["version"] = static_cast<double>(o.version);
        sink.scalars["tensors"] = static_cast<double>(o.tensors);
        sink.metrics["sync/bytes"] = static_cast<double>(o.bytes);
        sink.metrics["sync/seconds"] = o.seconds;
        sink.metrics["sync/version"] = static_cast<double>(o.version);
        sink.texts["server_version"] = o.server_version;
        if (out_result) *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
