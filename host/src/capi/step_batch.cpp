// abi/rl/step.h, the batch half: buffer push/pop, rollouts to batches, supervised batches, batch
// tensors, split, advantages, info, weight sync.
#include "batch.hpp"
#include "rollouts.hpp"
#include "step.hpp"
#include "train_common.hpp"

#include "rl/core/dist.hpp"

#include <chrono>

namespace {

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
    r.routed_expert_weights = it.routed_expert_weights;
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
