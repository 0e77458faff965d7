// abi/rl/step.h: one RL step as typed values (generate -> score -> filter ->
// buffer -> batch -> advantages -> sync), the per-token work of the loop.
// Rollouts here: generate, score, set rewards, filter, info; their buffer and
// batch half is in step_batch.cpp.
#include "batch.hpp"
#include "rollouts.hpp"
#include "step.hpp"
#include "train_common.hpp"

#include "rl/core/chat_template.hpp"
#include "rl/core/tokenizer.hpp"

#include <cmath>
#include <map>
#include <optional>

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
    // sampling.return_expert_logits: the weights, in the layout of the ids.
    const bool weights = params.return_expert_logits;
    if (weights)
        require(g.routed_expert_weights.size() == g.routed_experts.size(),
                fn_msg(fn, "sampling.return_expert_logits: the generator recorded " +
                               std::to_string(g.routed_expert_weights.size()) +
                               " routing weights for " + std::to_string(g.routed_experts.size()) +
                               " routed expert ids"));
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
            if (weights)
                it.routed_expert_weights.assign(
                    g.routed_expert_weights.begin() + static_cast<std::ptrdiff_t>(route_at),
                    g.routed_expert_weights.begin() + static_cast<std::ptrdiff_t>(route_at + n));
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
            // Their recorded weights (return_expert_logits), when every
            // rollout carries them.
            if (std::all_of(items.begin(), items.end(),
                            [](const auto &it) { return !it.routed_expert_weights.empty(); })) {
                std::vector<float> w;
                w.reserve(ids.size());
                for (const auto &it : items)
                    w.insert(w.end(), it.routed_expert_weights.begin(),
                             it.routed_expert_weights.end());
                OwnedTensor wt = owned_from_vector(w, kF32);
                wt.shape = {cu.back(), layers, k};
                s.tensors["routed_expert_weights"] = std::move(wt);
            }
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

} // extern "C"
