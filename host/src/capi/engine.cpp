// abi/rl/train.h: the co-located rollout engine.
#include "handle_verbs.hpp"

extern "C" {

// ---- engine -------------------------------------------------------------------------

RL_API rl_status_t rl_engine_create(rl_model_t *model, const char *config_json,
                                    rl_engine_t **out_engine) {
    return create_over_policy<core::EngineConfig>(model, config_json, out_engine,
                                                  "rl_engine_create", "out_engine");
}

RL_API void rl_engine_destroy(rl_engine_t *engine) {
    delete engine;
}

RL_API rl_status_t rl_engine_generate(rl_engine_t *engine, const rl_tensor_view_t *prompt_ids,
                                      const rl_tensor_view_t *prompt_cu_seqlens,
                                      const char *params_json, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_engine_generate";
        require(engine && prompt_ids && prompt_cu_seqlens && out_result,
                fn_msg(fn, "engine, prompt_ids, prompt_cu_seqlens and out_result are required"));
        const auto ids = int_vector(*prompt_ids, fn_msg(fn, "prompt_ids"));
        const auto cu = int_vector(*prompt_cu_seqlens, fn_msg(fn, "prompt_cu_seqlens"));
        require(cu.size() >= 2, fn_msg(fn, "prompt_cu_seqlens must hold n_prompts + 1 >= 2 "
                                           "entries"));
        require(cu.front() == 0, fn_msg(fn, "prompt_cu_seqlens[0] must be 0"));
        require(cu.back() == static_cast<int64_t>(ids.size()),
                fn_msg(fn, "prompt_cu_seqlens ends at " + std::to_string(cu.back()) +
                               " but prompt_ids has " + std::to_string(ids.size()) + " tokens"));
        std::vector<std::vector<int64_t>> prompts;
        for (size_t i = 0; i + 1 < cu.size(); ++i) {
            require(cu[i + 1] > cu[i], fn_msg(fn, "prompt " + std::to_string(i) +
                                                      " is empty or prompt_cu_seqlens decreases"));
            prompts.emplace_back(ids.begin() + cu[i], ids.begin() + cu[i + 1]);
        }
        const core::Generation g = engine->impl->generate(
            prompts, core::SamplingParams::from_json(params_json ? params_json : ""));
        const rl_dtype_t i64{RL_DTYPE_INT, 64, 1}, f32{RL_DTYPE_FLOAT, 32, 1};
        CallSink sink;
        sink.tensors["token_ids"] = owned_from_vector(g.token_ids, i64);
        sink.tensors["logprobs"] = owned_from_vector(g.logprobs, f32);
        sink.tensors["cu_seqlens"] = owned_from_vector(g.cu_seqlens, i64);
        sink.tensors["prompt_index"] = owned_from_vector(g.prompt_index, i64);
        if (g.routed_layers > 0 && g.routed_k > 0) {
            // Routing replay (R3): per sample its prompt then its completion
            // rows, sample s at rows routed_cu_seqlens[s] .. [s + 1].
            std::vector<int64_t> cu{0};
            for (int64_t s = 0; s < g.samples(); ++s)
                cu.push_back(
                    cu.back() +
                    static_cast<int64_t>(
                        prompts[static_cast<size_t>(g.prompt_index[static_cast<size_t>(s)])]
                            .size()) +
                    g.cu_seqlens[static_cast<size_t>(s) + 1] -
                    g.cu_seqlens[static_cast<size_t>(s)]);
            const std::vector<int32_t> ids(g.routed_experts.begin(), g.routed_experts.end());
            OwnedTensor t = owned_from_vector(ids, rl_dtype_t{RL_DTYPE_INT, 32, 1});
            t.shape = {cu.back(), g.routed_layers, g.routed_k};
            require(t.numel() == static_cast<int64_t>(ids.size()),
                    fn_msg(fn, "the engine recorded " + std::to_string(ids.size()) +
                                   " routed expert ids for " + std::to_string(cu.back()) +
                                   " tokens"));
            sink.tensors["routed_experts"] = std::move(t);
            sink.tensors["routed_cu_seqlens"] = owned_from_vector(cu, i64);
            if (!g.routed_expert_weights.empty()) { // return_expert_logits
                OwnedTensor w = owned_from_vector(g.routed_expert_weights, f32);
                w.shape = {cu.back(), g.routed_layers, g.routed_k};
                require(w.numel() == static_cast<int64_t>(g.routed_expert_weights.size()),
                        fn_msg(fn, "the engine recorded " +
                                       std::to_string(g.routed_expert_weights.size()) +
                                       " routing weights for " + std::to_string(cu.back()) +
                                       " tokens"));
                sink.tensors["routed_expert_weights"] = std::move(w);
            }
        }
        json completions = json::array(), reasons = json::array();
        for (size_t i = 0; i < g.completions.size(); ++i) {
            // Invalid UTF-8 never reaches here (the decoder emits U+FFFD), but
            // be strict: replace rather than throw.
            completions.push_back(g.completions[i]);
            reasons.push_back(core::finish_reason_name(g.finish_reasons[i]));
        }
        sink.texts["completions"] =
            completions.dump(-1, ' ', false, json::error_handler_t::replace);
        sink.texts["finish_reasons"] = reasons.dump();
        sink.scalars["policy_version"] = static_cast<double>(g.policy_version);
        sink.scalars["samples"] = static_cast<double>(g.samples());
        sink.scalars["tokens"] = static_cast<double>(g.token_ids.size());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_engine_sync_weights(rl_engine_t *engine, rl_result_t **out_result) {
    return train_boundary([&] {
        require(engine && out_result, "rl_engine_sync_weights: engine and out_result are required");
        CallSink sink;
        sink.scalars["policy_version"] = static_cast<double>(engine->impl->sync_weights());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_engine_sleep(rl_engine_t *engine) {
    return on_handle("rl_engine_sleep", "engine", engine, [](rl_engine &e) { e.impl->sleep(); });
}

RL_API rl_status_t rl_engine_wake_up(rl_engine_t *engine) {
    return on_handle("rl_engine_wake_up", "engine", engine,
                     [](rl_engine &e) { e.impl->wake_up(); });
}

} // extern "C"
