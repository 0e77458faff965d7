// Multi-turn episodes on the rollout engine (engine.hpp): every episode keeps
// its KV-cache slot for its whole life; an observation is appended to the slot
// together with the turn's last sampled token (which no decode step has run
// yet), so the next turn continues from the cache. With return_routed_experts
// every forward's routing is appended to the episodes it ran for, so that an
// episode's rows follow its tokens.
#include "rl/core/engine.hpp"

#include "decode_step.hpp"
#include "routing.hpp"

#include "rl/core/error.hpp"
#include "rl/core/moe.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

namespace rl::core {

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
    const ModelConfig &mc = model.config();
    const int64_t count = end_sample - first_sample;
    const bool record = params.return_routed_experts;
    // One sequence per episode: its tokens are the episode's, observations
    // included; a turn starts at turn_start.
    std::vector<detail::Sequence> seqs =
        detail::start_samples(prompts, params, prep.stop_ids, prep.seed, first_sample, end_sample,
                              capacity, policy_->tokenizer(), mc);
    at::Tensor logits =
        prefill_wave(prompts, params.n, first_sample, end_sample, record ? &seqs : nullptr);
    // Runs one forward; with `record`, appends its routing to the episodes of
    // `slots`, counts[i] rows (one each without counts) to slots[i]'s.
    auto forward = [&](const std::vector<int64_t> &slots, const std::vector<int64_t> *counts,
                       const std::function<at::Tensor()> &run) {
        if (!record) return run();
        RouterLogitsRecorder recorder;
        at::Tensor out = run();
        std::vector<detail::Sequence *> of;
        for (int64_t k : slots) of.push_back(&seqs[static_cast<size_t>(k)]);
        detail::ForwardRouting(recorder.logits(), mc, params.return_expert_logits)
            .append_in_order(of, counts);
        return out;
    };

    std::vector<int64_t> turns(static_cast<size_t>(count), 0); // turns ended per episode
    std::vector<int64_t> active(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) active[static_cast<size_t>(k)] = k;

    while (!active.empty()) {
        std::vector<detail::Sequence *> live;
        for (int64_t k : active) live.push_back(&seqs[static_cast<size_t>(k)]);
        std::vector<std::optional<detail::End>> ends = detail::step(logits, live);
        // Slots that decode on, and slots whose next turn starts after an
        // observation (extended by their last token plus the observation).
        std::vector<int64_t> cont, cont_tokens, resumed, resumed_counts, resumed_tokens;
        for (size_t i = 0; i < active.size(); ++i) {
            const int64_t k = active[i];
            const int64_t s = first_sample + k;
            detail::Sequence &q = *live[i];
            Episode &e = outs[static_cast<size_t>(s)];
            const int64_t token = q.tokens.back();
            e.mask.push_back(1);
            const int64_t used = q.prompt_len + static_cast<int64_t>(q.tokens.size());
            if (!ends[i]) {
                cont.push_back(k);
                cont_tokens.push_back(token);
                continue;
            }
            // The turn is over: ask the environment what follows.
            TurnEnd te;
            te.episode = s;
            te.turn = turns[static_cast<size_t>(k)];
            te.tokens.assign(q.tokens.begin() + static_cast<std::ptrdiff_t>(q.turn_start),
                             q.tokens.end());
            te.text = ends[i]->text;
            te.reason = ends[i]->reason;
            // The next turn needs this token, at least one observation token
            // and one sampled token in the context.
            te.context_full = used + 2 >= capacity;
            e.turn_starts.push_back(static_cast<int64_t>(q.turn_start));
            e.turn_ends.push_back(static_cast<int64_t>(q.tokens.size()));
            e.turn_texts.push_back(std::move(ends[i]->text));
            e.turn_reasons.push_back(ends[i]->reason);
            TurnReply reply = on_turn(te);
            const int64_t turn = ++turns[static_cast<size_t>(k)];
            if (reply.error) {
                e.end = EpisodeEnd::Error;
                e.error = *reply.error;
                continue;
            }
            if (reply.done) {
                e.end = EpisodeEnd::Done;
                continue;
            }
            if (turn >= options.max_turns) {
                e.end = EpisodeEnd::MaxTurns;
                continue;
            }
            const int64_t obs = static_cast<int64_t>(reply.observation.size());
            if (te.context_full || used + obs + 1 >= capacity) {
                e.end = EpisodeEnd::Context;
                continue;
            }
            for (int64_t t : reply.observation)
                require(t >= 0 && t < mc.vocab_size, ErrorKind::InvalidArgument,
                        "generate_episodes: episode " + std::to_string(s) + " turn " +
                            std::to_string(te.turn) + ": observation token " + std::to_string(t) +
                            " is outside the vocabulary");
            q.tokens.insert(q.tokens.end(), reply.observation.begin(), reply.observation.end());
            q.logprobs.insert(q.logprobs.end(), reply.observation.size(), 0.0f);
            e.mask.insert(e.mask.end(), reply.observation.size(), 0);
            q.turn_start = q.tokens.size();
            q.text.emplace(policy_->tokenizer(), params.stop);
            resumed.push_back(k);
            resumed_counts.push_back(1 + obs);
            resumed_tokens.push_back(token);
            resumed_tokens.insert(resumed_tokens.end(), reply.observation.begin(),
                                  reply.observation.end());
        }
        std::vector<at::Tensor> parts;
        if (!cont.empty())
            parts.push_back(forward(cont, nullptr, [&] {
                return model.decode(cache, cont, detail::long_tensor(cont_tokens));
            }));
        if (!resumed.empty())
            parts.push_back(forward(resumed, &resumed_counts, [&] {
                return model.extend(cache, resumed, detail::long_tensor(resumed_tokens),
                                    resumed_counts);
            }));
        active = std::move(cont);
        active.insert(active.end(), resumed.begin(), resumed.end());
        if (active.empty()) break;
        logits = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    }
    for (int64_t k = 0; k < count; ++k) {
        detail::Sequence &q = seqs[static_cast<size_t>(k)];
        Episode &e = outs[static_cast<size_t>(first_sample + k)];
        // Every token was read but the episode's last (it ended there): route yourself.
        check(!record || q.routed.size() + static_cast<size_t>(q.routed_width) ==
                             (static_cast<size_t>(q.prompt_len) + q.tokens.size()) *
                                 static_cast<size_t>(q.routed_width),
              "generate_episodes: episode " + std::to_string(first_sample + k) +
                  "'s routing does not follow its tokens");
        detail::pad_unread_routing(q);
        e.tokens = std::move(q.tokens);
        e.logprobs = std::move(q.logprobs);
        e.routed_experts = std::move(q.routed);
        e.routed_expert_weights = std::move(q.routed_weights); // return_expert_logits
    }
}

} // namespace rl::core
