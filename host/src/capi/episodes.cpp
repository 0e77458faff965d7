// abi/rl/step.h, rl_rollouts_generate_episodes: multi-turn episodes. The
// engine keeps each episode's KV cache across turns (core/engine); here the env
// plugin answers every assistant turn (rl_env_step) and its observation is
// turned into tokens the way the model's chat template renders such a message
// after an assistant turn.
#include "rollouts.hpp"

#include "rl/core/chat_template.hpp"
#include "rl/core/tokenizer.hpp"

#include <algorithm>
#include <cmath>

using namespace rl::host::capi;
namespace core = rl::core;
using nlohmann::json;

namespace {

// The tokens of an observation that follows an assistant turn. With a chat
// template: what the template renders after the assistant's content when a
// `role` message follows it, up to and including the next assistant header,
// less the turn-end token the model already sampled. Without one ("none"):
// the observation's text as it is.
class ObservationEncoder {
public:
    ObservationEncoder(const core::Tokenizer &tok, const RolloutOptions &o, const char *fn)
        : tok_(tok), o_(o), fn_(fn) {
        own_ = o.chat_template == "model";
        if (o.chat_template != "none" && !own_) format_ = core::parse_chat_format(o.chat_template);
    }

    std::vector<int64_t> encode(const std::string &text, const std::string &role,
                                const std::string &tools_json, std::optional<int64_t> stop_token) {
        core::EncodeOptions eo;
        if (!format_ && !own_) {
            eo.parse_special = o_.parse_special;
            const auto ids = tok_.encode(text, eo);
            return {ids.begin(), ids.end()};
        }
        const Shape &sh = shape(role, tools_json);
        std::string pre = sh.pre;
        if (stop_token) {
            // The turn ended with a stop token the model sampled (it is in the
            // sequence already): drop its text where the template closes the turn.
            const std::string stop = tok_.decode({static_cast<int32_t>(*stop_token)}, false);
            if (!stop.empty() && pre.compare(0, stop.size(), stop) == 0) pre.erase(0, stop.size());
        }
        const std::string all = pre + text + sh.post;
        if (!o_.parse_special) eo.plain_spans.emplace_back(pre.size(), pre.size() + text.size());
        const auto ids = tok_.encode(all, eo);
        return {ids.begin(), ids.end()};
    }

private:
    struct Shape {
        std::string pre, post; // around the observation's content
    };

    const Shape &shape(const std::string &role, const std::string &tools_json) {
        const std::string key = role + '\n' + tools_json;
        auto it = shapes_.find(key);
        if (it != shapes_.end()) return it->second;
        // Placeholders that no template alters.
        const std::string u = "RLEPISODEUSERX", a = "RLEPISODEASSISTANTX", ob = "RLEPISODEOBSX";
        core::ChatTemplateOptions chat;
        chat.add_generation_prompt = true;
        if (!o_.chat_vars.is_null()) chat.variables_json = o_.chat_vars.dump();
        chat.tools_json = tools_json;
        const std::vector<core::ChatMessage> msgs{{"user", u}, {"assistant", a}, {role, ob}};
        const std::string text = own_ ? tok_.apply_chat_template(msgs, chat)
                                      : core::apply_chat_template(*format_, msgs, chat);
        const size_t pa = text.find(a);
        const size_t po = pa == std::string::npos ? pa : text.find(ob, pa + a.size());
        require(pa != std::string::npos && po != std::string::npos &&
                    text.find(a, pa + 1) == std::string::npos &&
                    text.find(ob, po + 1) == std::string::npos,
                fn_msg(fn_, "the chat template does not render an assistant turn followed by a '" +
                                role +
                                "' message with each content once, in order; its observations "
                                "cannot be appended to an episode"));
        Shape sh;
        sh.pre = text.substr(pa + a.size(), po - pa - a.size());
        sh.post = text.substr(po + ob.size());
        return shapes_.emplace(key, std::move(sh)).first->second;
    }

    const core::Tokenizer &tok_;
    const RolloutOptions &o_;
    const char *fn_;
    bool own_ = false;
    std::optional<core::ChatFormat> format_;
    std::map<std::string, Shape> shapes_;
};

// An integer option of rl_rollouts_generate_episodes within [lo, hi].
int64_t int_option(const json &rest, const char *key, int64_t dflt, int64_t lo, const char *fn) {
    if (!rest.contains(key)) return dflt;
    const json &v = rest[key];
    require(v.is_number_integer() && v.get<int64_t>() >= lo,
            fn_msg(fn, std::string("options.") + key +
                           " must be an integer >= " + std::to_string(lo) + ", got " + v.dump()));
    return v.get<int64_t>();
}

// Per episode, what its env steps said.
struct EpisodeLog {
    std::string state = "null";
    std::vector<double> rewards;
    std::map<std::string, double> metrics;
};

} // namespace

extern "C" {

RL_API rl_status_t rl_rollouts_generate_episodes(rl_engine_t *engine, rl_instance_t *env,
                                                 const char *tasks_json, const char *options_json,
                                                 rl_rollouts_t **out_rollouts) {
    return train_boundary([&] {
        const char *fn = "rl_rollouts_generate_episodes";
        require(engine && env && tasks_json && out_rollouts,
                fn_msg(fn, "engine, env, tasks_json and out_rollouts are required"));
        Instance &env_inst = checked(env, RL_KIND_ENV, fn);
        if (static_cast<const rl_env_iface_t *>(env_inst.iface())->step == nullptr)
            throw HostError{RL_ERR_UNSUPPORTED,
                            fn_msg(fn, env_inst.who() + " is single-turn (its step() is NULL); "
                                                        "use rl_rollouts_generate and "
                                                        "rl_rollouts_score")};
        const core::Tokenizer &tok = engine->policy->require_tokenizer(fn);
        const json tasks = tasks_arg(tasks_json, fn);
        const RolloutOptions o =
            read_rollout_options(options_json, fn, {"max_turns", "max_context", "turn_rewards"});
        core::EpisodeOptions eo;
        eo.max_turns = int_option(o.rest, "max_turns", 8, 1, fn);
        eo.max_context = int_option(o.rest, "max_context", 0, 0, fn);
        bool turn_tokens = false;
        if (auto tr = o.rest.find("turn_rewards"); tr != o.rest.end()) {
            require(tr->is_string() && (*tr == "episode" || *tr == "tokens"),
                    fn_msg(fn, "options.turn_rewards must be \"episode\" (the sum on the last "
                               "token, default) or \"tokens\" (each turn's reward on its last "
                               "token), got " +
                                   tr->dump()));
            turn_tokens = *tr == "tokens";
        }
        const std::vector<std::vector<int64_t>> prompts = encode_prompts(tok, tasks, o, fn);
        const core::SamplingParams params = core::SamplingParams::from_json(o.sampling.dump());
        const std::vector<int64_t> stop_ids =
            params.stop_token_ids.value_or(engine->policy->eos_token_ids());

        std::vector<std::string> task_text, tools;
        for (const auto &t : tasks) {
            task_text.push_back(t.dump());
            tools.push_back(t.contains("tools") && t["tools"].is_array() ? t["tools"].dump()
                                                                         : std::string());
        }
        ObservationEncoder obs(tok, o, fn);
        std::vector<EpisodeLog> logs(prompts.size() * static_cast<size_t>(params.n));

        const core::Episodes eps =
            engine->impl->generate_episodes(prompts, params, eo, [&](const core::TurnEnd &te) {
                const size_t p = static_cast<size_t>(te.episode / params.n);
                EpisodeLog &log = logs[static_cast<size_t>(te.episode)];
                rl_result_t *res = nullptr;
                const rl_status_t st = rl_env_step(env, {task_text[p].data(), task_text[p].size()},
                                                   {log.state.data(), log.state.size()},
                                                   {te.text.data(), te.text.size()}, &res);
                core::TurnReply reply;
                if (st != RL_OK) {
                    reply.error = rl_last_error();
                    return reply;
                }
                CallSink s = std::move(res->sink);
                rl_result_destroy(res);
                log.rewards.push_back(s.scalars.at("reward"));
                for (const auto &kv : s.metrics) log.metrics[kv.first] = kv.second;
                log.state = s.texts.at("state");
                if (s.scalars.at("done") != 0) {
                    reply.done = true;
                    return reply;
                }
                const bool stopped =
                    te.reason == core::FinishReason::Stop && !te.tokens.empty() &&
                    std::find(stop_ids.begin(), stop_ids.end(), te.tokens.back()) != stop_ids.end();
                try {
                    reply.observation = obs.encode(
                        s.texts.at("observation"), s.texts.at("role"), tools[p],
                        stopped ? std::optional<int64_t>(te.tokens.back()) : std::nullopt);
                } catch (const core::Error &e) {
                    throw HostError{RL_ERR_INVALID_ARG, fn_msg(fn, e.what())};
                }
                return reply;
            });

        const double temperature = params.greedy() ? 0.0 : params.temperature;
        auto r = std::make_unique<rl_rollouts>();
        r->groups = static_cast<int64_t>(tasks.size());
        r->vocab_size = engine->policy->model().config().vocab_size;
        r->turn_token_rewards = turn_tokens;
        r->items.resize(eps.episodes.size());
        for (size_t s = 0; s < r->items.size(); ++s) {
            const core::Episode &e = eps.episodes[s];
            EpisodeLog &log = logs[s];
            auto &it = r->items[s];
            const int64_t p = eps.prompt_index[s];
            it.episode = true;
            it.prompt_index = p;
            it.group_id = o.group_offset + p;
            it.task = task_text[static_cast<size_t>(p)];
            it.prompt_ids = prompts[static_cast<size_t>(p)];
            it.token_ids = e.tokens;
            it.logprobs = e.logprobs;
            it.completion_mask = e.mask;
            it.text = tok.decode(std::vector<int32_t>(e.tokens.begin(), e.tokens.end()), false);
            it.finish_reason = core::episode_end_name(e.end);
            it.policy_version = eps.policy_version;
            it.sampling_temperature = temperature;
            it.turn_starts = e.turn_starts;
            it.turn_ends = e.turn_ends;
            it.turn_rewards = log.rewards;
            it.metrics = std::move(log.metrics);
            it.scored = true;
            // Routing replay (R3): the episode's routing, one row per token of
            // prompt_ids + token_ids, as a single-turn rollout's.
            it.routed_experts.assign(e.routed_experts.begin(), e.routed_experts.end());
            if (!it.routed_experts.empty()) {
                it.routed_layers = eps.routed_layers;
                it.routed_k = eps.routed_k;
            }
            it.routed_expert_weights = e.routed_expert_weights; // return_expert_logits
            if (e.end == core::EpisodeEnd::Error) {
                it.error = e.error;
                it.masked = true;
                it.flags.push_back("env_error");
                it.reward = 0;
            } else {
                double sum = 0;
                for (double x : log.rewards) sum += x;
                it.reward = sum;
            }
        }
        *out_rollouts = r.release();
        return RL_OK;
    });
}

RL_API rl_status_t rl_train_batch_supervised_episodes(rl_model_t *model, rl_instance_t *env,
                                                      const char *tasks_json,
                                                      const char *options_json,
                                                      rl_train_batch_t **out_batch) {
    return train_boundary([&] {
        const char *fn = "rl_train_batch_supervised_episodes";
        require(model && env && tasks_json && out_batch,
                fn_msg(fn, "model, env, tasks_json and out_batch are required"));
        checked(env, RL_KIND_ENV, fn);
        const Supervised sv = read_supervised(model, tasks_json, options_json, fn);
        const core::Tokenizer &tok = *sv.tok;
        ObservationEncoder obs(tok, sv.options, fn);
        core::EncodeOptions turn_opts;
        turn_opts.parse_special = sv.options.parse_special;
        std::vector<int64_t> ids, cu{0};
        std::vector<float> mask;
        std::vector<std::string> completions;
        for (size_t i = 0; i < sv.tasks.size(); ++i) {
            const json &task = sv.tasks[i];
            const std::string where = "tasks[" + std::to_string(i) + "]";
            const json *turns = nullptr;
            if (task.contains("metadata") && task["metadata"].is_object() &&
                task["metadata"].contains("reference_turns"))
                turns = &task["metadata"]["reference_turns"];
            require(turns != nullptr && turns->is_array() && !turns->empty(),
                    fn_msg(fn, where + " has no reference episode (metadata.reference_turns, a "
                                       "non-empty array of assistant turns)"));
            const std::string task_text = task.dump();
            const std::string tools =
                task.contains("tools") && task["tools"].is_array() ? task["tools"].dump() : "";
            ids.insert(ids.end(), sv.prompts[i].begin(), sv.prompts[i].end());
            mask.insert(mask.end(), sv.prompts[i].size(), 0.0f);
            std::string state = "null", transcript;
            for (size_t k = 0; k < turns->size(); ++k) {
                const json &turn = (*turns)[k];
                require(turn.is_string(), fn_msg(fn, where + ".metadata.reference_turns[" +
                                                         std::to_string(k) + "] is not a string"));
                const std::string text = turn.get<std::string>();
                const auto t = tok.encode(text + "\n", turn_opts);
                ids.insert(ids.end(), t.begin(), t.end());
                ids.push_back(sv.eos);
                mask.insert(mask.end(), t.size() + 1, 1.0f);
                transcript += text + "\n";
                if (k + 1 == turns->size()) break;
                // The env answers the reference turn as it would answer the model.
                rl_result_t *res = nullptr;
                const rl_status_t status =
                    rl_env_step(env, {task_text.data(), task_text.size()},
                                {state.data(), state.size()}, {text.data(), text.size()}, &res);
                if (status != RL_OK)
                    throw HostError{status, fn_msg(fn, where + " turn " + std::to_string(k) + ": " +
                                                           rl_last_error())};
                CallSink st = std::move(res->sink);
                rl_result_destroy(res);
                require(st.scalars.at("done") == 0,
                        fn_msg(fn, where + ": the env ended the episode after reference turn " +
                                       std::to_string(k) + " of " + std::to_string(turns->size())));
                state = st.texts.at("state");
                const std::vector<int64_t> o =
                    obs.encode(st.texts.at("observation"), st.texts.at("role"), tools, sv.eos);
                ids.insert(ids.end(), o.begin(), o.end());
                mask.insert(mask.end(), o.size(), 0.0f);
                transcript += st.texts.at("observation");
            }
            cu.push_back(static_cast<int64_t>(ids.size()));
            completions.push_back(transcript);
        }
        *out_batch = supervised_batch(model, sv.tasks, ids, cu, mask, completions).release();
        return RL_OK;
    });
}

} // extern "C"
