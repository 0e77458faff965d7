// abi/rl/step.h: one RL step as typed values (generate -> score -> filter ->
// buffer -> batch -> advantages -> sync), the per-token work of the loop.
#include "batch.hpp"
#include "rollouts.hpp"
#include "train_common.hpp"

#include "rl/core/dist.hpp"

#include <limits>

#include "rl/core/chat_template.hpp"
#include "rl/core/tokenizer.hpp"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>

namespace {

constexpr rl_dtype_t kF32{RL_DTYPE_FLOAT, 32, 1}, kF64{RL_DTYPE_FLOAT, 64, 1},
    kI64{RL_DTYPE_INT, 64, 1}, kU8{RL_DTYPE_UINT, 8, 1};

// Runs a C API call that fills an rl_result_t and returns its sink.
template <class F>
CallSink call_sink(F &&f) {
    rl_result_t *res = nullptr;
    const rl_status_t st = f(&res);
    if (st != RL_OK) throw HostError{st, rl_last_error()};
    CallSink sink = std::move(res->sink);
    rl_result_destroy(res);
    return sink;
}

// A scored rollout as the buffer holds it. With `turn_tokens` (episodes of
// "turn_rewards": "tokens"), extras["token_rewards"] holds each turn's reward
// on the turn's last token (0 elsewhere, and everywhere for a dropped episode).
core::Rollout buffer_rollout(const rl_rollouts::Item &it, bool turn_tokens) {
    core::Rollout r;
    r.group_id = it.group_id;
    r.policy_version = it.policy_version;
    r.reward = it.reward;
    r.task = it.task;
    r.completion = it.text;
    r.sampling_temperature = it.sampling_temperature;
    r.routed_experts = it.routed_experts;
    r.routed_layers = it.routed_layers;
    r.routed_k = it.routed_k;
    const size_t p = it.prompt_ids.size(), c = it.token_ids.size();
    r.token_ids = it.prompt_ids;
    r.token_ids.insert(r.token_ids.end(), it.token_ids.begin(), it.token_ids.end());
    r.logprobs.assign(p, 0.0f);
    r.logprobs.insert(r.logprobs.end(), it.logprobs.begin(), it.logprobs.end());
    r.loss_mask.assign(p, 0);
    if (it.completion_mask.empty() || it.masked)
        r.loss_mask.insert(r.loss_mask.end(), c, it.masked ? 0 : 1);
    else
        r.loss_mask.insert(r.loss_mask.end(), it.completion_mask.begin(), it.completion_mask.end());
    if (turn_tokens) {
        std::vector<float> tr(p + c, 0.0f);
        if (!it.masked)
            for (size_t k = 0; k < it.turn_rewards.size() && k < it.turn_ends.size(); ++k)
                if (it.turn_ends[k] > 0)
                    tr[p + static_cast<size_t>(it.turn_ends[k]) - 1] +=
                        static_cast<float>(it.turn_rewards[k]);
        r.extras["token_rewards"] = std::move(tr);
    }
    return r;
}

void require_scored(const rl_rollouts_t *rollouts, const char *fn) {
    for (size_t i = 0; i < rollouts->items.size(); ++i)
        require(rollouts->items[i].scored,
                fn_msg(fn, "rollout " + std::to_string(i) +
                               " is not scored (call rl_rollouts_score first)"));
}

// Rows [a, b) of a tensor along its first dimension (elements of a 1-D
// tensor, tokens of routed_experts [T, L, K]).
OwnedTensor slice(const OwnedTensor &t, int64_t a, int64_t b) {
    int64_t row = 1; // elements per row
    for (size_t d = 1; d < t.shape.size(); ++d) row *= t.shape[d];
    const size_t es = rl::host::dtype_size(t.dtype) * static_cast<size_t>(row);
    OwnedTensor o;
    o.dtype = t.dtype;
    o.shape = t.shape;
    o.shape[0] = b - a;
    o.bytes.assign(t.bytes.begin() + static_cast<std::ptrdiff_t>(a * es),
                   t.bytes.begin() + static_cast<std::ptrdiff_t>(b * es));
    return o;
}

} // namespace

namespace rl::host::capi {

json tasks_arg(const char *tasks_json, const char *fn) {
    json tasks = parse_json(tasks_json, fn_msg(fn, "tasks"));
    require(tasks.is_array() && !tasks.empty(),
            fn_msg(fn, "tasks must be a non-empty JSON array of task objects"));
    return tasks;
}

RolloutOptions read_rollout_options(const char *options_json, const char *fn,
                                    const std::vector<std::string> &extra) {
    const json opts = options_arg(options_json, fn);
    RolloutOptions o;
    for (const auto &kv : opts.items()) {
        if (kv.key() == "parse_special_tokens") {
            require(kv.value().is_boolean(),
                    fn_msg(fn, "options.parse_special_tokens must be true or false"));
            o.parse_special = kv.value().get<bool>();
        } else if (kv.key() == "chat_template") {
            require(kv.value().is_string(), fn_msg(fn, "options.chat_template must be a string"));
            o.chat_template = kv.value().get<std::string>();
        } else if (kv.key() == "chat_template_kwargs") {
            require(kv.value().is_object() || kv.value().is_null(),
                    fn_msg(fn, "options.chat_template_kwargs must be a JSON object"));
            o.chat_vars = kv.value();
        } else if (kv.key() == "group_offset") {
            require(kv.value().is_number_integer(),
                    fn_msg(fn, "options.group_offset must be an integer"));
            o.group_offset = kv.value().get<int64_t>();
        } else if (kv.key() == "sampling") {
            require(kv.value().is_object() || kv.value().is_null(),
                    fn_msg(fn, "options.sampling must be a JSON object"));
            if (kv.value().is_object()) o.sampling = kv.value();
        } else if (std::find(extra.begin(), extra.end(), kv.key()) != extra.end()) {
            o.rest[kv.key()] = kv.value();
        } else {
            std::string valid =
                "chat_template, chat_template_kwargs, group_offset, sampling, parse_special_tokens";
            for (const auto &e : extra) valid += ", " + e;
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "unknown option '" + kv.key() + "'; valid: " + valid)};
        }
    }
    return o;
}

// The prompt ids of each task: its "prompt", wrapped as one user turn with the
// assistant prompt after it when a chat template is named: "model" (the
// model's own Jinja template, with `variables` as extra template variables such
// as enable_thinking) or a built-in format ("chatml", "llama3"); "none" encodes
// the prompt as it is. The task's text is plain text (special-token text in
// it, "<|im_end|>", stays text; only the template's own special tokens are
// control tokens) unless parse_special.
std::vector<std::vector<int64_t>> encode_prompts(const core::Tokenizer &tok, const json &tasks,
                                                 const RolloutOptions &o, const char *fn) {
    const std::string &chat_template = o.chat_template;
    const bool parse_special = o.parse_special;
    core::ChatTemplateOptions chat;
    chat.add_generation_prompt = true;
    if (!o.chat_vars.is_null()) chat.variables_json = o.chat_vars.dump();
    const bool own = chat_template == "model";
    const bool templated = chat_template != "none";
    std::optional<core::ChatFormat> format;
    if (templated && !own) {
        try {
            format = core::parse_chat_format(chat_template);
        } catch (const core::Error &) {
            throw HostError{RL_ERR_INVALID_ARG,
                            fn_msg(fn, "options.chat_template '" + chat_template +
                                           "' is unknown; valid: none, model, chatml, llama3")};
        }
    }
    const auto render = [&](const std::vector<core::ChatMessage> &m) {
        return own ? tok.apply_chat_template(m, chat) : core::apply_chat_template(*format, m, chat);
    };
    const auto tools_of = [&](size_t i) {
        const json &t = tasks[i];
        if (!t.is_object() || !t.contains("tools") || t["tools"].is_null()) return std::string();
        require(t["tools"].is_array(), fn_msg(fn, "tasks[" + std::to_string(i) +
                                                      "].tools must be a JSON array of tool "
                                                      "schemas"));
        require(own || t["tools"].empty(),
                fn_msg(fn, "tasks[" + std::to_string(i) +
                               "] has tools, which only the model's own chat template "
                               "(chat_template: model) can render"));
        return t["tools"].dump();
    };
    core::EncodeOptions plain;
    plain.parse_special = parse_special;
    std::vector<std::vector<int64_t>> prompts;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const json &t = tasks[i];
        require(t.is_object() && t.contains("prompt") && t["prompt"].is_string(),
                fn_msg(fn, "tasks[" + std::to_string(i) + "] has no string 'prompt'"));
        const std::string text = t["prompt"].get<std::string>();
        chat.tools_json = templated ? tools_of(i) : std::string();
        std::vector<int32_t> ids;
        if (!templated)
            ids = tok.encode(text, plain);
        else if (parse_special)
            ids = tok.encode(render({{"user", text}}), core::EncodeOptions{});
        else
            ids = encode_chat_plain(tok, {{"user", text}}, render, nullptr, fn);
        require(!ids.empty(), fn_msg(fn, "tasks[" + std::to_string(i) + "]: empty prompt"));
        prompts.emplace_back(ids.begin(), ids.end());
    }
    return prompts;
}

rl_rollouts_t *
generate_rollouts(const core::Tokenizer &tok, int64_t vocab_size, const char *tasks_json,
                  const char *options_json, const char *fn,
                  const std::function<core::Generation(const std::vector<std::vector<int64_t>> &,
                                                       const core::SamplingParams &)> &generate) {
    require(tasks_json != nullptr, fn_msg(fn, "tasks_json is required"));
    const json tasks = tasks_arg(tasks_json, fn);
    const RolloutOptions o = read_rollout_options(options_json, fn);
    const int64_t group_offset = o.group_offset;
    const json &sampling = o.sampling;
    const std::vector<std::vector<int64_t>> prompts = encode_prompts(tok, tasks, o, fn);
    const core::SamplingParams params = core::SamplingParams::from_json(sampling.dump());
    const core::Generation g = generate(prompts, params);
    require(g.samples() == static_cast<int64_t>(prompts.size()) * params.n,
            fn_msg(fn, "the generator returned " + std::to_string(g.samples()) + " samples for " +
                           std::to_string(prompts.size()) +
                           " prompts x n = " + std::to_string(params.n)));
    // The temperature the logprobs belong to: greedy decoding (T = 0 or
    // top_k = 1) reports logprobs 0 and is recorded as 0.
    const double temperature = params.greedy() ? 0.0 : params.temperature;

    auto r = std::make_unique<rl_rollouts>();
    r->groups = static_cast<int64_t>(tasks.size());
    r->vocab_size = vocab_size;
    r->items.resize(static_cast<size_t>(g.samples()));
    const int64_t route_row = g.routed_layers * g.routed_k; // ids per token
    if (params.return_routed_experts)
        require(route_row > 0,
                fn_msg(fn, "sampling.return_routed_experts: the generator recorded no routing"));
    size_t route_at = 0; // the sample's first id in g.routed_experts
    for (size_t s = 0; s < r->items.size(); ++s) {
        auto &it = r->items[s];
        const int64_t p = g.prompt_index[s];
        it.prompt_index = p;
        it.group_id = group_offset + p;
        it.task = tasks[static_cast<size_t>(p)].dump();
        it.prompt_ids = prompts[static_cast<size_t>(p)];
        it.token_ids.assign(g.token_ids.begin() + g.cu_seqlens[s],
                            g.token_ids.begin() + g.cu_seqlens[s + 1]);
        it.logprobs.assign(g.logprobs.begin() + g.cu_seqlens[s],
                           g.logprobs.begin() + g.cu_seqlens[s + 1]);
        it.text = g.completions[s];
        it.finish_reason = core::finish_reason_name(g.finish_reasons[s]);
        it.policy_version = g.policy_version;
        it.sampling_temperature = temperature;
        if (route_row > 0) {
            // Prompt rows then completion rows: the trainer's routed_experts
            // rows of the sequence prompt + completion.
            const size_t n =
                (it.prompt_ids.size() + it.token_ids.size()) * static_cast<size_t>(route_row);
            require(route_at + n <= g.routed_experts.size(),
                    fn_msg(fn, "the generator's routed_experts end before sample " +
                                   std::to_string(s) + "'s"));
            it.routed_experts.assign(
                g.routed_experts.begin() + static_cast<std::ptrdiff_t>(route_at),
                g.routed_experts.begin() + static_cast<std::ptrdiff_t>(route_at + n));
            it.routed_layers = g.routed_layers;
            it.routed_k = g.routed_k;
            route_at += n;
        }
    }
    require(route_at == g.routed_experts.size(),
            fn_msg(fn, "the generator's routed_experts hold " +
                           std::to_string(g.routed_experts.size()) + " ids, its samples " +
                           std::to_string(route_at)));
    return r.release();
}

Supervised read_supervised(rl_model_t *model, const char *tasks_json, const char *options_json,
                           const char *fn) {
    Supervised sv;
    sv.tasks = tasks_arg(tasks_json, fn);
    const json opts = options_arg(options_json, fn);
    std::optional<int64_t> eos;
    for (const auto &kv : opts.items()) {
        if (kv.key() == "chat_template" && kv.value().is_string()) {
            sv.options.chat_template = kv.value().get<std::string>();
        } else if (kv.key() == "chat_template_kwargs" &&
                   (kv.value().is_object() || kv.value().is_null())) {
            sv.options.chat_vars = kv.value();
        } else if (kv.key() == "eos_token_id" && kv.value().is_number_integer()) {
            eos = kv.value().get<int64_t>();
        } else if (kv.key() == "parse_special_tokens" && kv.value().is_boolean()) {
            sv.options.parse_special = kv.value().get<bool>();
        } else {
            bad_option(fn, kv.key(),
                       "chat_template (a string), chat_template_kwargs (an object), "
                       "eos_token_id (an integer), parse_special_tokens (a boolean)");
        }
    }
    sv.tok = &tokenizer_of(model, fn);
    if (!eos) {
        std::vector<int64_t> ids;
        if (model->policy)
            ids = model->policy->eos_token_ids();
        else if (sv.tok->eos_token_id())
            ids.push_back(*sv.tok->eos_token_id());
        require(!ids.empty(),
                fn_msg(fn, "the model has no end-of-sequence token; pass eos_token_id"));
        eos = ids.front();
    }
    sv.eos = *eos;
    sv.prompts = encode_prompts(*sv.tok, sv.tasks, sv.options, fn);
    return sv;
}

std::unique_ptr<rl_train_batch> supervised_batch(const rl_model_t *model, const json &tasks,
                                                 const std::vector<int64_t> &ids,
                                                 const std::vector<int64_t> &cu,
                                                 const std::vector<float> &mask,
                                                 const std::vector<std::string> &completions) {
    auto b = std::make_unique<rl_train_batch>();
    b->groups = static_cast<int64_t>(tasks.size());
    b->input_ids = owned_from_vector(ids, kI64);
    b->cu_seqlens = owned_from_vector(cu, kI64);
    b->tensors["loss_mask"] = owned_from_vector(mask, kF32);
    for (size_t i = 0; i < tasks.size(); ++i) {
        b->rewards.push_back(0.0);
        b->group_ids.push_back(static_cast<int64_t>(i));
        b->policy_versions.push_back(model->policy ? model->policy->version() : 0);
        b->tasks.push_back(tasks[i].dump());
        b->completions.push_back(completions[i]);
    }
    b->rebuild_args();
    return b;
}

} // namespace rl::host::capi

extern "C" {

RL_API rl_status_t rl_rollouts_generate(rl_engine_t *engine, const char *tasks_json,
                                        const char *options_json, rl_rollouts_t **out_rollouts) {
    return train_boundary([&] {
        const char *fn = "rl_rollouts_generate";
        require(engine && tasks_json && out_rollouts,
                fn_msg(fn, "engine, tasks_json and out_rollouts are required"));
        *out_rollouts = rl::host::capi::generate_rollouts(
            engine->policy->require_tokenizer(fn), engine->policy->model().config().vocab_size,
            tasks_json, options_json, fn,
            [&](const std::vector<std::vector<int64_t>> &prompts, const core::SamplingParams &p) {
                return engine->impl->generate(prompts, p);
            });
        return RL_OK;
    });
}

RL_API void rl_rollouts_destroy(rl_rollouts_t *rollouts) {
    delete rollouts;
}

RL_API rl_status_t rl_rollouts_score(rl_rollouts_t *rollouts, rl_instance_t *env) {
    return train_boundary([&] {
        require(rollouts && env, "rl_rollouts_score: rollouts and env are required");
        for (const auto &it : rollouts->items)
            require(!it.episode, "rl_rollouts_score: these rollouts are multi-turn episodes, "
                                 "scored by their env's steps (rl_rollouts_generate_episodes); "
                                 "use rl_rollouts_set_rewards to change their rewards");
        for (size_t i = 0; i < rollouts->items.size(); ++i) {
            auto &it = rollouts->items[i];
            CallSink s = call_sink([&](rl_result_t **res) {
                return rl_env_score(env, {it.task.data(), it.task.size()},
                                    {it.text.data(), it.text.size()}, res);
            });
            it.reward = s.scalars.at("reward");
            it.metrics = std::move(s.metrics);
            it.scored = true;
        }
        return RL_OK;
    });
}

RL_API rl_status_t rl_rollouts_set_rewards(rl_rollouts_t *rollouts, const double *rewards,
                                           uint64_t n) {
    return train_boundary([&] {
        const char *fn = "rl_rollouts_set_rewards";
        require(rollouts != nullptr, fn_msg(fn, "rollouts is NULL"));
        require(n == rollouts->items.size(),
                fn_msg(fn, "got " + std::to_string(n) + " rewards for " +
                               std::to_string(rollouts->items.size()) + " rollouts"));
        require(n == 0 || rewards != nullptr, fn_msg(fn, "rewards is NULL"));
        for (uint64_t i = 0; i < n; ++i)
            require(std::isfinite(rewards[i]),
                    fn_msg(fn, "rewards[" + std::to_string(i) + "] is not finite"));
        for (uint64_t i = 0; i < n; ++i) {
            rollouts->items[i].reward = rewards[i];
            rollouts->items[i].scored = true;
        }
        return RL_OK;
    });
}

RL_API rl_status_t rl_rollouts_filter(rl_rollouts_t *rollouts, rl_instance_t *const *filters,
                                      uint64_t n_filters, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_rollouts_filter";
        require(rollouts && out_result, fn_msg(fn, "rollouts and out_result are required"));
        require(n_filters == 0 || filters != nullptr,
                fn_msg(fn, "filters is NULL but n_filters is " + std::to_string(n_filters)));
        for (uint64_t f = 0; f < n_filters; ++f) checked(filters[f], RL_KIND_FILTER, fn);
        CallSink out;
        double flagged = 0, masked = 0;
        for (auto &it : rollouts->items) {
            bool any = false;
            for (uint64_t f = 0; f < n_filters; ++f) {
                std::vector<int64_t> shape_ids{static_cast<int64_t>(it.token_ids.size())};
                rl_rollout_view_t v{};
                v.struct_size = sizeof(v);
                v.token_ids = rl_tensor_view_t{it.token_ids.empty() ? nullptr : it.token_ids.data(),
                                               {RL_DEVICE_CPU, 0},
                                               1,
                                               kI64,
                                               shape_ids.data(),
                                               nullptr,
                                               0};
                v.logprobs = rl_tensor_view_t{it.logprobs.empty() ? nullptr : it.logprobs.data(),
                                              {RL_DEVICE_CPU, 0},
                                              1,
                                              kF32,
                                              shape_ids.data(),
                                              nullptr,
                                              0};
                v.vocab_size = rollouts->vocab_size;
                CallSink s = call_sink(
                    [&](rl_result_t **res) { return rl_filter_check(filters[f], &v, res); });
                if (s.scalars.at("flagged") == 0) continue;
                any = true;
                const std::string reason = s.texts["reason"];
                it.flags.push_back(reason);
                out.scalars["flagged." + reason] += 1;
                if (s.scalars.at("enforce") != 0) it.masked = true;
            }
            if (any) flagged += 1;
            if (it.masked) masked += 1;
        }
        out.scalars["flagged"] = flagged;
        out.scalars["masked"] = masked;
        *out_result = new_result(std::move(out));
        return RL_OK;
    });
}

RL_API rl_status_t rl_rollouts_info(const rl_rollouts_t *rollouts, rl_result_t **out_result) {
    return train_boundary([&] {
        require(rollouts && out_result, "rl_rollouts_info: rollouts and out_result are required");
        const auto &items = rollouts->items;
        CallSink s;
        const double n = static_cast<double>(items.size());
        std::vector<double> rewards;
        std::vector<int64_t> groups, prompt_index, versions, lengths;
        std::vector<uint8_t> masked;
        json completions = json::array(), reasons = json::array(), tasks = json::array(),
             flags = json::array();
        double tokens = 0, flagged = 0, n_masked = 0;
        bool scored = !items.empty();
        for (const auto &it : items) {
            rewards.push_back(it.reward);
            groups.push_back(it.group_id);
            prompt_index.push_back(it.prompt_index);
            versions.push_back(it.policy_version);
            lengths.push_back(static_cast<int64_t>(it.token_ids.size()));
            masked.push_back(it.masked ? 1 : 0);
            completions.push_back(it.text);
            reasons.push_back(it.finish_reason);
            tasks.push_back(it.task);
            flags.push_back(it.flags);
            tokens += static_cast<double>(it.token_ids.size());
            flagged += it.flags.empty() ? 0 : 1;
            n_masked += it.masked ? 1 : 0;
            scored = scored && it.scored;
        }
        s.scalars["rollouts"] = n;
        s.scalars["groups"] = static_cast<double>(rollouts->groups);
        s.scalars["tokens"] = tokens;
        s.scalars["flagged"] = flagged;
        s.scalars["masked"] = n_masked;
        if (!items.empty() && items.front().sampling_temperature)
            s.scalars["sampling_temperature"] = *items.front().sampling_temperature;
        if (scored) {
            // Population statistics, summed in rollout order.
            double sum = 0, sq = 0, lo = HUGE_VAL, hi = -HUGE_VAL;
            std::map<std::string, double> msum;
            for (const auto &it : items) {
                sum += it.reward;
                sq += it.reward * it.reward;
                lo = std::min(lo, it.reward);
                hi = std::max(hi, it.reward);
                for (const auto &kv : it.metrics) msum[kv.first] += kv.second;
            }
            const double mean = sum / n;
            s.scalars["reward_mean"] = mean;
            s.scalars["reward_std"] = std::sqrt(std::max(sq / n - mean * mean, 0.0));
            s.scalars["reward_min"] = lo;
            s.scalars["reward_max"] = hi;
            for (const auto &kv : msum) s.scalars["env/" + kv.first] = kv.second / n;
        }
        s.tensors["rewards"] = owned_from_vector(rewards, kF64);
        s.tensors["group_ids"] = owned_from_vector(groups, kI64);
        s.tensors["prompt_index"] = owned_from_vector(prompt_index, kI64);
        s.tensors["policy_versions"] = owned_from_vector(versions, kI64);
        s.tensors["completion_lengths"] = owned_from_vector(lengths, kI64);
        s.tensors["masked"] = owned_from_vector(masked, kU8);
        if (!items.empty() && !items.front().routed_experts.empty()) {
            // Routing replay (R3): every rollout's [prompt + completion, L, K]
            // back to back, rollout i's rows routed_cu_seqlens[i] .. [i + 1].
            const int64_t layers = items.front().routed_layers, k = items.front().routed_k;
            std::vector<int32_t> ids;
            std::vector<int64_t> cu{0};
            for (size_t i = 0; i < items.size(); ++i) {
                const auto &it = items[i];
                require(it.routed_layers == layers && it.routed_k == k &&
                            !it.routed_experts.empty(),
                        "rl_rollouts_info: rollout " + std::to_string(i) +
                            " carries a different routed_experts layout than rollout 0");
                ids.insert(ids.end(), it.routed_experts.begin(), it.routed_experts.end());
                cu.push_back(cu.back() +
                             static_cast<int64_t>(it.prompt_ids.size() + it.token_ids.size()));
            }
            OwnedTensor t = owned_from_vector(ids, rl_dtype_t{RL_DTYPE_INT, 32, 1});
            t.shape = {cu.back(), layers, k};
            s.tensors["routed_experts"] = std::move(t);
            s.tensors["routed_cu_seqlens"] = owned_from_vector(cu, kI64);
            s.scalars["routed_layers"] = static_cast<double>(layers);
            s.scalars["routed_k"] = static_cast<double>(k);
        }
        if (std::any_of(items.begin(), items.end(), [](const auto &it) { return it.episode; })) {
            // Multi-turn episodes: turns per rollout, each turn's reward, errors.
            std::vector<int64_t> turns;
            json turn_rewards = json::array(), errors = json::array(), spans = json::array();
            double sum_turns = 0, n_errors = 0;
            for (const auto &it : items) {
                turns.push_back(static_cast<int64_t>(it.turn_starts.size()));
                sum_turns += static_cast<double>(it.turn_starts.size());
                turn_rewards.push_back(it.turn_rewards);
                json sp = json::array();
                for (size_t k = 0; k < it.turn_starts.size(); ++k)
                    sp.push_back({it.turn_starts[k], it.turn_ends[k]});
                spans.push_back(std::move(sp));
                errors.push_back(it.error);
                n_errors += it.error.empty() ? 0 : 1;
            }
            s.tensors["turns"] = owned_from_vector(turns, kI64);
            s.scalars["turns_mean"] = sum_turns / n;
            s.scalars["episode_errors"] = n_errors;
            s.texts["turn_rewards"] = turn_rewards.dump();
            s.texts["turn_spans"] = spans.dump();
            s.texts["errors"] = errors.dump();
        }
        s.texts["completions"] = completions.dump(-1, ' ', false, json::error_handler_t::replace);
        s.texts["finish_reasons"] = reasons.dump();
        s.texts["tasks"] = tasks.dump(-1, ' ', false, json::error_handler_t::replace);
        s.texts["flags"] = flags.dump();
        *out_result = new_result(std::move(s));
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_push_rollouts(rl_buffer_t *buffer, const rl_rollouts_t *rollouts,
                                           rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_buffer_push_rollouts";
        require(buffer && rollouts, fn_msg(fn, "buffer and rollouts are required"));
        require_scored(rollouts, fn);
        for (const auto &it : rollouts->items)
            buffer->impl->push(buffer_rollout(it, rollouts->turn_token_rewards));
        if (out_result) {
            CallSink s;
            s.scalars["pushed"] = static_cast<double>(rollouts->items.size());
            *out_result = new_result(std::move(s));
        }
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_pop_train_batch(rl_buffer_t *buffer, uint64_t min_rollouts,
                                             uint64_t timeout_ms, rl_train_batch_t **out_batch) {
    return train_boundary([&] {
        const char *fn = "rl_buffer_pop_train_batch";
        require(buffer && out_batch, fn_msg(fn, "buffer and out_batch are required"));
        require(min_rollouts >= 1, fn_msg(fn, "min_rollouts must be >= 1"));
        *out_batch = nullptr;
        std::vector<core::Group> groups;
        if (auto g = core::dist::current(); g && g->size() > 1) {
            // Distributed: each rank holds its own groups and min_rollouts
            // counts all ranks'; every rank pops (its ready groups) or none
            // does, so the ranks train in step.
            const size_t ready = buffer->impl->wait_ready(1, std::chrono::milliseconds(timeout_ms));
            at::Tensor counts =
                at::tensor({static_cast<double>(ready), ready == 0 ? 1.0 : 0.0}, at::kDouble);
            g->all_reduce_sum(counts);
            if (counts[0].item<double>() < static_cast<double>(min_rollouts) ||
                counts[1].item<double>() > 0)
                return RL_OK;
            groups = buffer->impl->pop_ready(1, std::chrono::milliseconds(0));
            require(!groups.empty(), fn_msg(fn, "the ready groups vanished (a second consumer "
                                                "of the buffer?)"));
        } else {
            groups = buffer->impl->pop_ready(min_rollouts, std::chrono::milliseconds(timeout_ms));
        }
        if (groups.empty()) return RL_OK;
        std::vector<const core::Rollout *> rs;
        for (const auto &g : groups)
            for (const auto &r : g.rollouts) rs.push_back(&r);
        auto b = batch_of(rs, static_cast<int64_t>(groups.size()), fn);
        *out_batch = b.release();
        return RL_OK;
    });
}

RL_API rl_status_t rl_rollouts_to_batch(const rl_rollouts_t *rollouts,
                                        rl_train_batch_t **out_batch) {
    return train_boundary([&] {
        const char *fn = "rl_rollouts_to_batch";
        require(rollouts && out_batch, fn_msg(fn, "rollouts and out_batch are required"));
        require(!rollouts->items.empty(), fn_msg(fn, "there are no rollouts"));
        require_scored(rollouts, fn);
        std::vector<core::Rollout> store;
        store.reserve(rollouts->items.size());
        std::vector<const core::Rollout *> rs;
        for (const auto &it : rollouts->items) {
            store.push_back(buffer_rollout(it, rollouts->turn_token_rewards));
            rs.push_back(&store.back());
        }
        *out_batch = batch_of(rs, rollouts->groups, fn).release();
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_supervised(rl_model_t *model, const char *tasks_json,
                                             const char *options_json,
                                             rl_train_batch_t **out_batch) {
    return train_boundary([&] {
        const char *fn = "rl_train_batch_supervised";
        require(model && tasks_json && out_batch,
                fn_msg(fn, "model, tasks_json and out_batch are required"));
        const rl::host::capi::Supervised sv =
            rl::host::capi::read_supervised(model, tasks_json, options_json, fn);
        const json &tasks = sv.tasks;
        core::EncodeOptions answer_opts;
        answer_opts.parse_special = sv.options.parse_special;
        std::vector<int64_t> ids, cu{0};
        std::vector<float> mask;
        std::vector<std::string> completions;
        for (size_t i = 0; i < tasks.size(); ++i) {
            require(tasks[i].contains("answer") && tasks[i]["answer"].is_string(),
                    fn_msg(fn, "tasks[" + std::to_string(i) +
                                   "] has no reference answer (a string 'answer')"));
            const auto answer =
                sv.tok->encode(tasks[i]["answer"].get<std::string>() + "\n", answer_opts);
            ids.insert(ids.end(), sv.prompts[i].begin(), sv.prompts[i].end());
            mask.insert(mask.end(), sv.prompts[i].size(), 0.0f);
            ids.insert(ids.end(), answer.begin(), answer.end());
            mask.insert(mask.end(), answer.size(), 1.0f);
            ids.push_back(sv.eos);
            mask.push_back(1.0f);
            cu.push_back(static_cast<int64_t>(ids.size()));
            completions.push_back(tasks[i]["answer"].get<std::string>());
        }
        *out_batch =
            rl::host::capi::supervised_batch(model, tasks, ids, cu, mask, completions).release();
        return RL_OK;
    });
}

RL_API void rl_train_batch_destroy(rl_train_batch_t *batch) {
    delete batch;
}

RL_API rl_status_t rl_train_batch_set_tensor(rl_train_batch_t *batch, const char *name,
                                             const rl_tensor_view_t *tensor) {
    return train_boundary([&] {
        const char *fn = "rl_train_batch_set_tensor";
        require(batch && name && *name && tensor,
                fn_msg(fn, "batch, name and tensor are required"));
        const std::string n = name;
        require(n != "input_ids" && n != "cu_seqlens",
                fn_msg(fn, "'" + n + "' is the batch's own layout and cannot be replaced"));
        OwnedTensor t;
        try {
            t = OwnedTensor::copy_of(*tensor);
        } catch (const HostError &e) {
            throw HostError{e.status, fn_msg(fn, "tensor '" + n + "': " + e.message)};
        }
        require(t.dtype.code == RL_DTYPE_FLOAT && (t.dtype.bits == 32 || t.dtype.bits == 64),
                fn_msg(fn, "tensor '" + n + "' must be float32 or float64, got " +
                               rl::host::dtype_string(t.dtype)));
        require(t.shape.size() == 1 && t.numel() == batch->input_ids.numel(),
                fn_msg(fn, "tensor '" + n + "' must hold one value per token (" +
                               std::to_string(batch->input_ids.numel()) + "), got " +
                               std::to_string(t.numel())));
        batch->tensors[n] = std::move(t);
        batch->rebuild_args();
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_split(const rl_train_batch_t *batch, uint64_t k,
                                        rl_train_batch_t **out_parts, uint64_t *out_count) {
    return train_boundary([&] {
        const char *fn = "rl_train_batch_split";
        require(batch && out_parts && out_count,
                fn_msg(fn, "batch, out_parts and out_count are required"));
        require(k >= 1, fn_msg(fn, "k must be >= 1"));
        *out_count = 0;
        const auto *cu = reinterpret_cast<const int64_t *>(batch->cu_seqlens.bytes.data());
        const int64_t n_seqs = batch->cu_seqlens.numel() - 1;
        // Part starts: sequence indices where the group changes, about every
        // n_seqs / k sequences.
        std::vector<int64_t> starts{0};
        const double target = static_cast<double>(n_seqs) / static_cast<double>(k);
        for (int64_t s = 1; s < n_seqs; ++s) {
            const bool boundary = batch->group_ids[static_cast<size_t>(s)] !=
                                  batch->group_ids[static_cast<size_t>(s - 1)];
            if (boundary && starts.size() < k &&
                static_cast<double>(s) >= target * static_cast<double>(starts.size()))
                starts.push_back(s);
        }
        starts.push_back(n_seqs);
        std::vector<std::unique_ptr<rl_train_batch>> parts;
        for (size_t p = 0; p + 1 < starts.size(); ++p) {
            const int64_t a = starts[p], b = starts[p + 1]; // sequences [a, b)
            const int64_t t0 = cu[a], t1 = cu[b];           // tokens [t0, t1)
            auto part = std::make_unique<rl_train_batch>();
            part->input_ids = slice(batch->input_ids, t0, t1);
            std::vector<int64_t> offs;
            for (int64_t s = a; s <= b; ++s) offs.push_back(cu[s] - t0);
            part->cu_seqlens = owned_from_vector(offs, kI64);
            for (const auto &kv : batch->tensors)
                part->tensors[kv.first] = slice(kv.second, t0, t1);
            auto range = [&](const auto &v) {
                return std::decay_t<decltype(v)>(v.begin() + a, v.begin() + b);
            };
            part->rewards = range(batch->rewards);
            part->group_ids = range(batch->group_ids);
            part->policy_versions = range(batch->policy_versions);
            part->tasks = range(batch->tasks);
            part->completions = range(batch->completions);
            int64_t groups = b > a ? 1 : 0;
            for (int64_t s = a + 1; s < b; ++s)
                groups += part->group_ids[static_cast<size_t>(s - a)] !=
                          part->group_ids[static_cast<size_t>(s - a - 1)];
            part->groups = groups;
            part->sampling_temperature = batch->sampling_temperature;
            part->rebuild_args();
            parts.push_back(std::move(part));
        }
        for (size_t p = 0; p < parts.size(); ++p) out_parts[p] = parts[p].release();
        *out_count = parts.size();
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_compute_advantages(rl_train_batch_t *batch,
                                                     rl_instance_t *advantage,
                                                     rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_train_batch_compute_advantages";
        require(batch && advantage, fn_msg(fn, "batch and advantage are required"));
        // Per-turn rewards on the turns' last tokens (episodes of "turn_rewards":
        // "tokens"): the estimator adds them where they fall, so the sequence
        // reward it gets is what the turns do not account for (0, or what
        // rl_rollouts_set_rewards added), counted once.
        std::vector<double> seq_rewards = batch->rewards;
        std::vector<rl_tensor_arg_t> args{{"loss_mask", batch->tensors.at("loss_mask").view()}};
        auto tr = batch->tensors.find("token_rewards");
        if (tr != batch->tensors.end()) {
            const at::Tensor x = tensor_from_owned(tr->second, "batch tensor 'token_rewards'")
                                     .to(at::kDouble)
                                     .contiguous();
            const auto cu = int_vector(batch->cu_seqlens.view(), "cu_seqlens");
            require(x.dim() == 1 && x.size(0) == cu.back(),
                    fn_msg(fn, "batch tensor 'token_rewards' must hold one value per token (" +
                                   std::to_string(cu.back()) + ")"));
            const double *v = x.data_ptr<double>();
            for (size_t s = 0; s + 1 < cu.size(); ++s)
                for (int64_t t = cu[s]; t < cu[s + 1]; ++t) seq_rewards[s] -= v[t];
            args.push_back({"token_rewards", tr->second.view()});
        }
        const OwnedTensor rewards = owned_from_vector(seq_rewards, kF64);
        const OwnedTensor group_ids = owned_from_vector(batch->group_ids, kI64);
        rl_advantage_inputs_t in{};
        in.struct_size = sizeof(in);
        in.rewards = rewards.view();
        in.group_ids = group_ids.view();
        in.cu_seqlens = batch->cu_seqlens.view();
        in.tensors = rl_tensor_list_t{args.data(), args.size()};
        CallSink s =
            call_sink([&](rl_result_t **res) { return rl_advantage_compute(advantage, &in, res); });
        const OwnedTensor &adv = s.tensors.at("advantages");
        require(adv.numel() == batch->input_ids.numel(),
                fn_msg(fn, "the advantage plugin emitted " + std::to_string(adv.numel()) +
                               " advantages for " + std::to_string(batch->input_ids.numel()) +
                               " tokens"));
        batch->tensors["advantages"] = adv;
        batch->tensors.erase("token_rewards"); // consumed by the estimator: no loss reads it
        batch->rebuild_args();
        if (out_result) *out_result = new_result(std::move(s));
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_view(const rl_train_batch_t *batch, rl_batch_t *out_batch) {
    return train_boundary([&] {
        require(batch && out_batch, "rl_train_batch_view: batch and out_batch are required");
        require(out_batch->struct_size >= RL_SIZE_THROUGH(rl_batch_t, tensors),
                "rl_train_batch_view: out_batch->struct_size is too small (set it to "
                "sizeof(rl_batch_t))");
        out_batch->input_ids = batch->input_ids.view();
        out_batch->cu_seqlens = batch->cu_seqlens.view();
        out_batch->tensors = rl_tensor_list_t{batch->args.data(), batch->args.size()};
        if (RL_HAS_FIELD(out_batch, rl_batch_t, sampling_temperature)) {
            out_batch->flags = batch->sampling_temperature
                                   ? static_cast<uint32_t>(RL_BATCH_HAS_SAMPLING_TEMPERATURE)
                                   : 0u;
            out_batch->reserved1 = 0;
            out_batch->sampling_temperature = batch->sampling_temperature.value_or(0.0);
        }
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_info(const rl_train_batch_t *batch, rl_result_t **out_result) {
    return train_boundary([&] {
        require(batch && out_result, "rl_train_batch_info: batch and out_result are required");
        CallSink s;
        const auto &mask = batch->tensors.at("loss_mask");
        const auto *m = reinterpret_cast<const float *>(mask.bytes.data());
        double loss_tokens = 0;
        for (int64_t i = 0; i < mask.numel(); ++i) loss_tokens += m[i] != 0 ? 1 : 0;
        int64_t min_version = batch->policy_versions.empty() ? 0 : batch->policy_versions[0];
        for (int64_t v : batch->policy_versions) min_version = std::min(min_version, v);
        s.scalars["groups"] = static_cast<double>(batch->groups);
        s.scalars["rollouts"] = static_cast<double>(batch->rewards.size());
        s.scalars["tokens"] = static_cast<double>(batch->input_ids.numel());
        s.scalars["loss_tokens"] = loss_tokens;
        s.scalars["min_policy_version"] = static_cast<double>(min_version);
        if (batch->sampling_temperature)
            s.scalars["sampling_temperature"] = *batch->sampling_temperature;
        s.tensors["rewards"] = owned_from_vector(batch->rewards, kF64);
        s.tensors["group_ids"] = owned_from_vector(batch->group_ids, kI64);
        s.tensors["policy_versions"] = owned_from_vector(batch->policy_versions, kI64);
        s.tensors["input_ids"] = batch->input_ids;
        s.tensors["cu_seqlens"] = batch->cu_seqlens;
        for (const auto &kv : batch->tensors) s.tensors[kv.first] = kv.second;
        s.texts["tasks"] = json(batch->tasks).dump(-1, ' ', false, json::error_handler_t::replace);
        s.texts["completions"] =
            json(batch->completions).dump(-1, ' ', false, json::error_handler_t::replace);
        *out_result = new_result(std::move(s));
        return RL_OK;
    });
}

RL_API rl_status_t rl_sync_weights(rl_engine_t *engine, rl_buffer_t *buffer,
                                   rl_result_t **out_result) {
    return train_boundary([&] {
        require(engine != nullptr, "rl_sync_weights: engine is NULL");
        const int64_t version = engine->impl->sync_weights();
        if (buffer) buffer->impl->set_policy_version(version);
        if (out_result) {
            CallSink s;
            s.scalars["policy_version"] = static_cast<double>(version);
            *out_result = new_result(std::move(s));
        }
        return RL_OK;
    });
}

} // extern "C"
