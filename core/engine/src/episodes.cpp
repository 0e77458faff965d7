// Multi-turn episodes on the rollout engine (engine.hpp): every episode keeps
// its KV-cache slot for its whole life; an observation is appended to the slot
// together with the turn's last sampled token (which no decode step has run
// yet), so the next turn continues from the cache. With return_routed_experts
// every forward's routing is appended to the episodes it ran for, so that an
// episode's rows follow its tokens.
#include "rl/core/engine.hpp"

#include "routing.hpp"
#include "text_tracker.hpp"

#include "rl/core/error.hpp"
#include "rl/core/moe.hpp"
#include "rl/core/moe_weights.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

namespace rl::core {

namespace {

at::Tensor long_tensor(const std::vector<int64_t> &v) {
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t;
}

// One episode while it runs.
struct Running {
    int64_t sampled = 0; // tokens sampled so far, over all turns (the randomness counter)
    int64_t turn = 0;
    size_t turn_start = 0;
    std::optional<detail::TextTracker> text;
};

} // namespace

const char *episode_end_name(EpisodeEnd e) {
    switch (e) {
        case EpisodeEnd::Done:
            return "done";
        case EpisodeEnd::MaxTurns:
            return "max_turns";
        case EpisodeEnd::Context:
            return "context";
        case EpisodeEnd::Error:
            break;
    }
    return "error";
}

Episodes Engine::generate_episodes(const std::vector<std::vector<int64_t>> &prompts,
                                   const SamplingParams &params, const EpisodeOptions &options,
                                   const std::function<TurnReply(const TurnEnd &)> &on_turn) {
    const char *fn = "generate_episodes";
    const std::string who = fn;
    require(options.max_turns >= 1, ErrorKind::InvalidArgument,
            who + ": max_turns must be >= 1, got " + std::to_string(options.max_turns));
    require(options.max_context >= 0, ErrorKind::InvalidArgument,
            who + ": max_context must be >= 0 (0: the model's context), got " +
                std::to_string(options.max_context));
    require(static_cast<bool>(on_turn), ErrorKind::InvalidArgument,
            who + ": no turn callback given");
    const ModelConfig &mc = policy_->model().config();
    const int64_t model_context =
        mc.max_position_embeddings > 0 ? mc.max_position_embeddings : int64_t{1} << 40;
    const int64_t capacity = options.max_context > 0 ? std::min(options.max_context, model_context)
                                                     : std::min<int64_t>(model_context, 4096);
    for (size_t i = 0; i < prompts.size(); ++i)
        require(static_cast<int64_t>(prompts[i].size()) < capacity, ErrorKind::InvalidArgument,
                who + ": prompt " + std::to_string(i) + " has " +
                    std::to_string(prompts[i].size()) +
                    " tokens, no room left in the episode context of " + std::to_string(capacity) +
                    " tokens (max_context)");
    const Prepared prep = prepare(prompts, params, capacity, fn);
    AdapterScope adapter_scope(prep.adapter, /*training=*/false);
    NormWeightsScope noise_scope(&noisy_norms_); // QeRL noise (empty: the clean norms)

    c10::InferenceMode inference;
    const int64_t total = static_cast<int64_t>(prompts.size()) * params.n;
    Episodes out;
    out.episodes.resize(static_cast<size_t>(total));
    for (int64_t first = 0; first < total; first += prep.wave)
        run_episode_wave(prompts, params, prep, first, std::min(total, first + prep.wave), capacity,
                         options, on_turn, out.episodes);
    out.policy_version = prep.adapter ? prep.adapter->version() : version_;
    for (int64_t i = 0; i < total; ++i) out.prompt_index.push_back(i / params.n);
    if (params.return_routed_experts) {
        out.routed_layers = detail::sparse_layers(mc);
        out.routed_k = mc.num_experts_per_tok;
    }
    return out;
}

void Engine::run_episode_wave(const std::vector<std::vector<int64_t>> &prompts,
                              const SamplingParams &params, const Prepared &prep,
                              int64_t first_sample, int64_t end_sample, int64_t capacity,
                              const EpisodeOptions &options,
                              const std::function<TurnReply(const TurnEnd &)> &on_turn,
                              std::vector<Episode> &outs) {
    CausalLM &model = policy_->model();
    KVCache &cache = *cache_;
    const int64_t count = end_sample - first_sample;
    const bool record = params.return_routed_experts;
    const bool record_weights = record && params.return_expert_logits;
    std::vector<std::vector<int64_t>> prompt_routes;
    std::vector<std::vector<float>> prompt_weights;
    at::Tensor logits =
        prefill_wave(prompts, params.n, first_sample, end_sample, record ? &prompt_routes : nullptr,
                     record_weights ? &prompt_weights : nullptr);
    for (size_t k = 0; k < prompt_routes.size(); ++k)
        outs[static_cast<size_t>(first_sample) + k].routed_experts = std::move(prompt_routes[k]);
    for (size_t k = 0; k < prompt_weights.size(); ++k)
        outs[static_cast<size_t>(first_sample) + k].routed_expert_weights =
            std::move(prompt_weights[k]);
    // Runs one forward; with `record`, appends its routing (and with
    // `record_weights` the mixing weights) to the episodes of `slots`,
    // counts[i] rows (one each without counts) to slots[i]'s.
    auto forward = [&](const std::vector<int64_t> &slots, const std::vector<int64_t> *counts,
                       const std::function<at::Tensor()> &run) {
        if (!record) return run();
        RouterLogitsRecorder recorder;
        at::Tensor out = run();
        const int64_t K = model.config().num_experts_per_tok;
        const at::Tensor ids = routed_experts_of(recorder.logits(), K);
        const at::Tensor w =
            record_weights
                ? routed_expert_weights_of(recorder.logits(), K, model.config().norm_topk_prob)
                : at::Tensor();
        const int64_t row = ids.size(1) * ids.size(2); // ids per token
        const int64_t *p = ids.data_ptr<int64_t>();
        const float *q = record_weights ? w.data_ptr<float>() : nullptr;
        for (size_t i = 0; i < slots.size(); ++i) {
            const int64_t n = counts != nullptr ? (*counts)[i] : 1;
            Episode &e = outs[static_cast<size_t>(first_sample + slots[i])];
            e.routed_experts.insert(e.routed_experts.end(), p, p + n * row);
            p += n * row;
            if (q != nullptr) {
                e.routed_expert_weights.insert(e.routed_expert_weights.end(), q, q + n * row);
                q += n * row;
            }
        }
        check(p == ids.data_ptr<int64_t>() + ids.numel(),
              "generate_episodes: a forward's routing does not cover its tokens");
        return out;
    };

    std::vector<Running> run(static_cast<size_t>(count));
    std::vector<int64_t> active(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
        active[static_cast<size_t>(k)] = k;
        run[static_cast<size_t>(k)].text.emplace(policy_->tokenizer(), params.stop);
    }
    const auto &stop_ids = prep.stop_ids;

    while (!active.empty()) {
        at::Tensor lp = sampling_logprobs(logits, params);
        std::vector<double> u;
        u.reserve(active.size());
        for (int64_t k : active) {
            const int64_t s = first_sample + k;
            u.push_back(sampling_uniform(prep.seed, s / params.n, s % params.n,
                                         run[static_cast<size_t>(k)].sampled));
        }
        const auto drawn = draw_tokens(lp, u);
        // Slots that decode on, and slots whose next turn starts after an
        // observation (extended by their last token plus the observation).
        std::vector<int64_t> cont, cont_tokens, resumed, resumed_counts, resumed_tokens;
        for (size_t i = 0; i < active.size(); ++i) {
            const int64_t k = active[i];
            const int64_t s = first_sample + k;
            Running &r = run[static_cast<size_t>(k)];
            Episode &e = outs[static_cast<size_t>(s)];
            const int64_t token = drawn[i].first;
            e.tokens.push_back(token);
            e.logprobs.push_back(drawn[i].second);
            e.mask.push_back(1);
            ++r.sampled;
            const int64_t prompt_len =
                static_cast<int64_t>(prompts[static_cast<size_t>(s / params.n)].size());
            const int64_t used = prompt_len + static_cast<int64_t>(e.tokens.size());
            const int64_t turn_len = static_cast<int64_t>(e.tokens.size() - r.turn_start);
            std::optional<FinishReason> ended;
            std::string text;
            if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
                ended = FinishReason::Stop;
                text = r.text->finish();
            } else if (r.text->push(token)) {
                ended = FinishReason::Stop;
                text = r.text->cut();
            } else if (turn_len >= params.max_tokens || used >= capacity) {
                ended = FinishReason::Length;
                text = r.text->finish();
            }
            if (!ended) {
                cont.push_back(k);
                cont_tokens.push_back(token);
                continue;
            }
            // The turn is over: ask the environment what follows.
            TurnEnd te;
            te.episode = s;
            te.turn = r.turn;
            te.tokens.assign(e.tokens.begin() + static_cast<std::ptrdiff_t>(r.turn_start),
                             e.tokens.end());
            te.text = text;
            te.reason = *ended;
            // The next turn needs this token, at least one observation token
            // and one sampled token in the context.
            te.context_full = used + 2 >= capacity;
            e.turn_starts.push_back(static_cast<int64_t>(r.turn_start));
            e.turn_ends.push_back(static_cast<int64_t>(e.tokens.size()));
            e.turn_texts.push_back(std::move(text));
            e.turn_reasons.push_back(*ended);
            TurnReply reply = on_turn(te);
            ++r.turn;
            if (reply.error) {
                e.end = EpisodeEnd::Error;
                e.error = *reply.error;
                continue;
            }
            if (reply.done) {
                e.end = EpisodeEnd::Done;
                continue;
            }
            if (r.turn >= options.max_turns) {
                e.end = EpisodeEnd::MaxTurns;
                continue;
            }
            const int64_t obs = static_cast<int64_t>(reply.observation.size());
            if (te.context_full || used + obs + 1 >= capacity) {
                e.end = EpisodeEnd::Context;
                continue;
            }
            for (int64_t t : reply.observation)
                require(t >= 0 && t < model.config().vocab_size, ErrorKind::InvalidArgument,
                        "generate_episodes: episode " + std::to_string(s) + " turn " +
                            std::to_string(te.turn) + ": observation token " + std::to_string(t) +
                            " is outside the vocabulary");
            e.tokens.insert(e.tokens.end(), reply.observation.begin(), reply.observation.end());
            e.logprobs.insert(e.logprobs.end(), reply.observation.size(), 0.0f);
            e.mask.insert(e.mask.end(), reply.observation.size(), 0);
            r.turn_start = e.tokens.size();
            r.text.emplace(policy_->tokenizer(), params.stop);
            resumed.push_back(k);
            resumed_counts.push_back(1 + obs);
            resumed_tokens.push_back(token);
            resumed_tokens.insert(resumed_tokens.end(), reply.observation.begin(),
                                  reply.observation.end());
        }
        std::vector<at::Tensor> parts;
        if (!cont.empty())
            parts.push_back(forward(cont, nullptr, [&] {
                return model.decode(cache, cont, long_tensor(cont_tokens));
            }));
        if (!resumed.empty())
            parts.push_back(forward(resumed, &resumed_counts, [&] {
                return model.extend(cache, resumed, long_tensor(resumed_tokens), resumed_counts);
            }));
        active = std::move(cont);
        active.insert(active.end(), resumed.begin(), resumed.end());
        if (active.empty()) break;
        logits = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    }
    if (record) {
        // Every token was read but the episode's last (it ended there): route yourself.
        const ModelConfig &mc = model.config();
        const int64_t layers = detail::sparse_layers(mc);
        const int64_t row = layers * mc.num_experts_per_tok;
        for (int64_t s = first_sample; s < end_sample; ++s) {
            Episode &e = outs[static_cast<size_t>(s)];
            const size_t want =
                (prompts[static_cast<size_t>(s / params.n)].size() + e.tokens.size()) *
                static_cast<size_t>(row);
            check(e.routed_experts.size() + static_cast<size_t>(row) == want,
                  "generate_episodes: episode " + std::to_string(s) +
                      "'s routing does not follow its tokens");
            e.routed_experts.resize(want, -1);
            if (record_weights) e.routed_expert_weights.resize(want, 0.0f);
        }
    }
}

} // namespace rl::core
