// abi/rl/train.h: the rollout buffer.
#include "batch.hpp"
#include "train_common.hpp"

#include "rl/core/atomic_file.hpp"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace {

// ---- the rollout buffer -----------------------------------------------------------

// rl_buffer_pop_batch's result: the training batch's tensors, with the
// sampling logprobs as "rollout_logprobs" when the rollouts carry them.
CallSink batch_sink(std::vector<core::Group> groups) {
    const char *fn = "rl_buffer_pop_batch";
    CallSink sink;
    std::vector<const core::Rollout *> rs;
    for (const auto &g : groups)
        for (const auto &r : g.rollouts) rs.push_back(&r);
    sink.scalars["groups"] = static_cast<double>(groups.size());
    sink.scalars["rollouts"] = static_cast<double>(rs.size());
    if (rs.empty()) {
        sink.scalars["tokens"] = 0;
        return sink;
    }
    const bool with_logprobs = !rs.front()->logprobs.empty();
    for (const core::Rollout *r : rs)
        if (with_logprobs != !r->logprobs.empty())
            throw HostError{RL_ERR_BAD_STATE,
                            fn_msg(fn, "some rollouts carry logprobs and others do not (group " +
                                           std::to_string(r->group_id) + ")")};
    std::unique_ptr<rl_train_batch> b = batch_of(rs, static_cast<int64_t>(groups.size()), fn);
    sink.scalars["tokens"] = static_cast<double>(b->input_ids.numel());
    if (b->sampling_temperature) sink.scalars["sampling_temperature"] = *b->sampling_temperature;
    sink.tensors["input_ids"] = std::move(b->input_ids);
    sink.tensors["cu_seqlens"] = std::move(b->cu_seqlens);
    for (auto &kv : b->tensors) {
        if (kv.first != "old_logprobs")
            sink.tensors[kv.first] = std::move(kv.second);
        else if (with_logprobs)
            sink.tensors["rollout_logprobs"] = std::move(kv.second);
    }
    sink.tensors["rewards"] = owned_from_vector(b->rewards, rl_dtype_t{RL_DTYPE_FLOAT, 64, 1});
    sink.tensors["group_ids"] = owned_from_vector(b->group_ids, rl_dtype_t{RL_DTYPE_INT, 64, 1});
    sink.tensors["policy_versions"] =
        owned_from_vector(b->policy_versions, rl_dtype_t{RL_DTYPE_INT, 64, 1});
    sink.texts["tasks"] = json(b->tasks).dump(-1, ' ', false, json::error_handler_t::replace);
    sink.texts["completions"] =
        json(b->completions).dump(-1, ' ', false, json::error_handler_t::replace);
    return sink;
}

} // namespace

extern "C" {

// ---- rollout buffer --------------------------------------------------------------------

RL_API rl_status_t rl_buffer_create(const char *config_json, rl_buffer_t **out_buffer) {
    return train_boundary([&] {
        require(out_buffer != nullptr, "rl_buffer_create: out_buffer is NULL");
        auto b = std::make_unique<rl_buffer>();
        b->impl = std::make_unique<core::RolloutBuffer>(
            core::BufferConfig::from_json(config_json ? config_json : ""));
        *out_buffer = b.release();
        return RL_OK;
    });
}

RL_API void rl_buffer_destroy(rl_buffer_t *buffer) {
    delete buffer;
}

RL_API rl_status_t rl_buffer_set_policy_version(rl_buffer_t *buffer, int64_t version) {
    return train_boundary([&] {
        require(buffer != nullptr, "rl_buffer_set_policy_version: buffer is NULL");
        buffer->impl->set_policy_version(version);
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_push(rl_buffer_t *buffer, const char *rollout_json,
                                  const rl_tensor_list_t *tensors) {
    return train_boundary([&] {
        const char *fn = "rl_buffer_push";
        require(buffer && rollout_json && tensors,
                fn_msg(fn, "buffer, rollout_json and tensors are required"));
        const json j = parse_json(rollout_json, fn_msg(fn, "rollout"));
        require(j.is_object(), fn_msg(fn, "rollout must be a JSON object"));
        core::Rollout r;
        for (const auto &kv : j.items()) {
            const std::string &k = kv.key();
            const json &v = kv.value();
            if (k == "group_id" || k == "policy_version") {
                require(v.is_number_integer(), fn_msg(fn, k + " must be an integer"));
                (k == "group_id" ? r.group_id : r.policy_version) = v.get<int64_t>();
            } else if (k == "reward") {
                require(v.is_number(), fn_msg(fn, "reward must be a number"));
                r.reward = v.get<double>();
            } else if (k == "task" || k == "completion") {
                require(v.is_string(), fn_msg(fn, k + " must be a string"));
                (k == "task" ? r.task : r.completion) = v.get<std::string>();
            } else if (k == "sampling_temperature") {
                require(v.is_null() || (v.is_number() && std::isfinite(v.get<double>()) &&
                                        v.get<double>() >= 0),
                        fn_msg(fn, "sampling_temperature must be a number >= 0 (0: greedy) or "
                                   "null, got " +
                                       v.dump()));
                if (!v.is_null()) r.sampling_temperature = v.get<double>();
            } else {
                throw HostError{RL_ERR_INVALID_ARG,
                                fn_msg(fn, "unknown rollout key '" + k +
                                               "'; valid: group_id, policy_version, reward, "
                                               "task, completion, sampling_temperature")};
            }
        }
        require(j.contains("group_id") && j.contains("reward"),
                fn_msg(fn, "rollout needs 'group_id' and 'reward'"));
        require(tensors->count == 0 || tensors->items != nullptr,
                fn_msg(fn, "tensors.items is NULL"));
        std::set<std::string> seen;
        for (uint64_t i = 0; i < tensors->count; ++i) {
            const rl_tensor_arg_t &a = tensors->items[i];
            require(a.name && *a.name, fn_msg(fn, "tensor " + std::to_string(i) + " has no name"));
            const std::string name = a.name;
            require(seen.insert(name).second, fn_msg(fn, "tensor '" + name + "' given twice"));
            const std::string what = fn_msg(fn, "tensor '" + name + "'");
            if (name == "token_ids") {
                r.token_ids = int_vector(a.view, what);
                continue;
            }
            at::Tensor t = tensor_from_view(a.view, what);
            if (name == "routed_experts" || name == "routed_expert_weights") {
                // Routing replay (R3): [n, L_moe, K] per token; the buffer
                // checks them against token_ids and each other.
                require(t.dim() == 3,
                        what + " must be 3-D [tokens, sparse layers, experts per token], got " +
                            std::to_string(t.dim()) + "-D");
                if (name == "routed_experts") {
                    require(!at::isFloatingType(t.scalar_type()),
                            what + " must hold integer expert ids");
                    const at::Tensor ids = t.to(at::kLong).contiguous();
                    const int64_t *p = ids.data_ptr<int64_t>();
                    for (int64_t k = 0; k < ids.numel(); ++k) {
                        require(p[k] >= -1 && p[k] <= INT32_MAX,
                                what + " holds " + std::to_string(p[k]) + " at value " +
                                    std::to_string(k) + ", not an expert id (or -1)");
                        r.routed_experts.push_back(static_cast<int32_t>(p[k]));
                    }
                    r.routed_layers = t.size(1);
                    r.routed_k = t.size(2);
                } else {
                    require(at::isFloatingType(t.scalar_type()),
                            what + " must hold floating-point routing weights");
                    const at::Tensor w = t.to(at::kFloat).contiguous();
                    r.routed_expert_weights.assign(w.data_ptr<float>(),
                                                   w.data_ptr<float>() + w.numel());
                }
                continue;
            }
            require(t.dim() == 1, what + " must be 1-D (one value per token)");
            if (name == "loss_mask") {
                at::Tensor m = t.to(at::kDouble).contiguous();
                const double *p = m.data_ptr<double>();
                for (int64_t k = 0; k < m.numel(); ++k) {
                    require(p[k] == 0 || p[k] == 1, what + " must hold 0 or 1, got " +
                                                        std::to_string(p[k]) + " at token " +
                                                        std::to_string(k));
                    r.loss_mask.push_back(p[k] != 0);
                }
                continue;
            }
            at::Tensor f = t.to(at::kFloat).contiguous();
            std::vector<float> v(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
            if (name == "logprobs")
                r.logprobs = std::move(v);
            else
                r.extras[name] = std::move(v);
        }
        require(!r.token_ids.empty(), fn_msg(fn, "tensor 'token_ids' is required and non-empty"));
        require(r.routed_expert_weights.empty() || !r.routed_experts.empty(),
                fn_msg(fn, "tensor 'routed_expert_weights' weighs routed experts: it needs "
                           "'routed_experts'"));
        buffer->impl->push(std::move(r));
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_close_group(rl_buffer_t *buffer, int64_t group_id,
                                         uint32_t *out_found) {
    return train_boundary([&] {
        require(buffer != nullptr, "rl_buffer_close_group: buffer is NULL");
        const bool found = buffer->impl->close_group(group_id);
        if (out_found) *out_found = found ? 1u : 0u;
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_pop_batch(rl_buffer_t *buffer, uint64_t min_rollouts,
                                       uint64_t timeout_ms, rl_result_t **out_result) {
    return train_boundary([&] {
        require(buffer && out_result, "rl_buffer_pop_batch: buffer and out_result are required");
        require(min_rollouts >= 1, "rl_buffer_pop_batch: min_rollouts must be >= 1");
        std::vector<core::Group> groups =
            timeout_ms == 0
                ? buffer->impl->pop_batch(min_rollouts)
                : buffer->impl->wait_batch(min_rollouts, std::chrono::milliseconds(timeout_ms));
        *out_result = new_result(batch_sink(std::move(groups)));
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_save(rl_buffer_t *buffer, const char *path) {
    return train_boundary([&] {
        require(buffer && path && *path, "rl_buffer_save: buffer and path are required");
        core::atomic_write_file(path, buffer->impl->state_json());
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_load(rl_buffer_t *buffer, const char *path) {
    return train_boundary([&] {
        require(buffer && path && *path, "rl_buffer_load: buffer and path are required");
        buffer->impl->restore(core::read_file(path), path);
        return RL_OK;
    });
}

RL_API rl_status_t rl_buffer_stats(rl_buffer_t *buffer, uint32_t take, rl_result_t **out_result) {
    return train_boundary([&] {
        require(buffer && out_result, "rl_buffer_stats: buffer and out_result are required");
        core::RolloutBuffer &b = *buffer->impl;
        const core::BufferStats s = take ? b.take_stats() : b.stats();
        CallSink sink;
        sink.scalars["pushed_rollouts"] = static_cast<double>(s.pushed_rollouts);
        sink.scalars["completed_groups"] = static_cast<double>(s.completed_groups);
        sink.scalars["passed_groups"] = static_cast<double>(s.ready_groups);
        sink.scalars["popped_groups"] = static_cast<double>(s.popped_groups);
        sink.scalars["popped_rollouts"] = static_cast<double>(s.popped_rollouts);
        sink.scalars["dropped_groups"] = static_cast<double>(s.dropped_groups());
        sink.scalars["dropped_rollouts"] = static_cast<double>(s.dropped_rollouts());
        for (const auto &kv : s.dropped) {
            sink.scalars["dropped." + kv.first + ".groups"] = static_cast<double>(kv.second.groups);
            sink.scalars["dropped." + kv.first + ".rollouts"] =
                static_cast<double>(kv.second.rollouts);
        }
        sink.scalars["ready_groups"] = static_cast<double>(b.ready_groups());
        sink.scalars["ready_rollouts"] = static_cast<double>(b.ready_rollouts());
        sink.scalars["pending_groups"] = static_cast<double>(b.pending_groups());
        sink.scalars["pending_rollouts"] = static_cast<double>(b.pending_rollouts());
        sink.scalars["policy_version"] = static_cast<double>(b.policy_version());
        if (take) {
            json log = json::array();
            for (const auto &d : b.take_drop_log())
                log.push_back({{"group_id", d.group_id},
                               {"reason", core::drop_reason_name(d.reason)},
                               {"rollouts", d.rollouts},
                               {"mean_reward", d.mean_reward},
                               {"policy_version", d.policy_version},
                               {"current_version", d.current_version}});
            sink.texts["drop_log"] = log.dump();
        }
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
