// abi/rl/train.h: the trainer (forward, forward_backward through a loss
// plugin, optimizer steps, checkpoints).
#include "train_common.hpp"
#include "../bridge/loss_node.hpp"

#include "rl/core/checkpoint.hpp"

#include <cmath>

namespace {

// ---- batches and results ----------------------------------------------------------

core::TrainBatch batch_from(const rl_batch_t *b, const char *fn) {
    require(b != nullptr, fn_msg(fn, "batch is NULL"));
    // The first published layout ends at `tensors`; later fields are read
    // when the caller's struct holds them.
    require(b->struct_size >= RL_SIZE_THROUGH(rl_batch_t, tensors),
            fn_msg(fn, "batch->struct_size is too small (set it to sizeof(rl_batch_t))"));
    core::TrainBatch tb;
    tb.input_ids = tensor_from_view(b->input_ids, fn_msg(fn, "batch input_ids"));
    tb.cu_seqlens = int_vector(b->cu_seqlens, fn_msg(fn, "batch cu_seqlens"));
    require(
        b->tensors.count == 0 || b->tensors.items != nullptr,
        fn_msg(fn, "batch tensors.items is NULL but count is " + std::to_string(b->tensors.count)));
    for (uint64_t i = 0; i < b->tensors.count; ++i) {
        const rl_tensor_arg_t &a = b->tensors.items[i];
        require(a.name != nullptr && *a.name,
                fn_msg(fn, "batch tensor " + std::to_string(i) + " has no name"));
        const std::string name = a.name;
        const std::string what = fn_msg(fn, "batch tensor '" + name + "'");
        if (name == "global_tokens" || name == "global_seqs") {
            at::Tensor t = tensor_from_view(a.view, what);
            require(t.numel() == 1, what + " must hold one number (the count over the whole "
                                           "optimizer step)");
            (name == "global_tokens" ? tb.global_tokens : tb.global_seqs) =
                t.to(at::kDouble).item<double>();
            continue;
        }
        require(!tb.tensors.count(name), fn_msg(fn, "batch tensor '" + name + "' given twice"));
        tb.tensors[name] = tensor_from_view(a.view, what);
    }
    if (RL_HAS_FIELD(b, rl_batch_t, sampling_temperature)) {
        require((b->flags & ~static_cast<uint32_t>(RL_BATCH_HAS_SAMPLING_TEMPERATURE)) == 0,
                fn_msg(fn, "batch->flags has unknown bits " + std::to_string(b->flags)));
        if (b->flags & RL_BATCH_HAS_SAMPLING_TEMPERATURE) {
            const double t = b->sampling_temperature;
            require(std::isfinite(t) && t >= 0,
                    fn_msg(fn, "batch->sampling_temperature must be a finite number >= 0 (0: "
                               "greedy), got " +
                                   json(t).dump()));
            tb.sampling_temperature = t;
        }
    }
    return tb;
}

CallSink step_sink(const core::StepResult &r, bool with_loss) {
    CallSink sink;
    if (with_loss) {
        sink.scalars["loss"] = r.loss;
        sink.scalars["loss_tokens"] = static_cast<double>(r.loss_tokens);
    }
    sink.scalars["tokens"] = static_cast<double>(r.tokens);
    sink.scalars["seqs"] = static_cast<double>(r.seqs);
    sink.scalars["bins"] = static_cast<double>(r.bins);
    sink.scalars["micro_batches"] = static_cast<double>(r.micro_batches);
    sink.scalars["logprob_temperature"] = r.logprob_temperature;
    for (const auto &w : r.warnings) rl::host::log_warning("trainer: " + w);
    sink.metrics.insert(r.metrics.begin(), r.metrics.end());
    for (const auto &kv : r.tensors) sink.tensors[kv.first] = owned_from_tensor(kv.second);
    auto scores = r.tensors.find("scores"); // a reward model's [seqs, num_labels]
    if (scores != r.tensors.end()) sink.scalars["num_labels"] = double(scores->second.size(1));
    return sink;
}

} // namespace

extern "C" {

// ---- trainer -----------------------------------------------------------------------

RL_API rl_status_t rl_trainer_create(rl_model_t *model, const char *config_json,
                                     rl_trainer_t **out_trainer) {
    return train_boundary([&] {
        require(model && out_trainer, "rl_trainer_create: model and out_trainer are required");
        policy_of(model, "rl_trainer_create");
        auto t = std::make_unique<rl_trainer>();
        t->policy = model->policy;
        // LoRA (ABI 0.5): "adapter" names the adapter to train, "lora" creates it.
        std::string cfg = config_json ? config_json : "";
        json j = cfg.empty() ? json() : parse_json(config_json, "rl_trainer_create: config");
        std::shared_ptr<core::LoraAdapter> adapter;
        bool created = false;
        if (j.is_object() && (j.contains("adapter") || j.contains("lora"))) {
            std::string name = "default";
            if (j.contains("adapter")) {
                require(j["adapter"].is_string() && !j["adapter"].get<std::string>().empty(),
                        "rl_trainer_create: adapter must be the name of a LoRA adapter, got " +
                            j["adapter"].dump());
                name = j["adapter"].get<std::string>();
            }
            try {
                if (j.contains("lora") && !j["lora"].is_null()) {
                    require(j["lora"].is_object(),
                            "rl_trainer_create: lora must be a JSON object (the LoRA config)");
                    adapter = model->policy->create_adapter(
                        name, core::LoraConfig::from_json(j["lora"].dump()));
                    created = true;
                } else {
                    adapter = model->policy->adapter(name);
                }
            } catch (const core::Error &e) {
                throw core::Error(e.kind(), std::string("rl_trainer_create: ") + e.what());
            }
            j.erase("adapter");
            j.erase("lora");
            cfg = j.dump();
        }
        try {
            t->impl = std::make_unique<core::Trainer>(model->policy,
                                                      core::TrainerConfig::from_json(cfg), adapter);
        } catch (...) {
            // A trainer that failed does not leave the adapter it created behind.
            if (created) model->policy->remove_adapter(adapter->name());
            throw;
        }
        *out_trainer = t.release();
        return RL_OK;
    });
}

RL_API void rl_trainer_destroy(rl_trainer_t *trainer) {
    delete trainer;
}

RL_API rl_status_t rl_trainer_forward_backward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                               rl_instance_t *loss, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_trainer_forward_backward";
        require(trainer && out_result, fn_msg(fn, "trainer and out_result are required"));
        Instance &inst = checked(loss, RL_KIND_LOSS, fn);
        const core::TrainBatch tb = batch_from(batch, fn);
        const core::LossFunction lf = rl::host::bridge::loss_node(inst);
        *out_result = new_result(step_sink(trainer->impl->forward_backward(tb, lf), true));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_forward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                      rl_instance_t *loss, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_trainer_forward";
        require(trainer && out_result, fn_msg(fn, "trainer and out_result are required"));
        const core::TrainBatch tb = batch_from(batch, fn);
        std::optional<core::LossFunction> lf;
        if (loss) lf = rl::host::bridge::loss_node(checked(loss, RL_KIND_LOSS, fn));
        *out_result =
            new_result(step_sink(trainer->impl->forward(tb, lf ? &*lf : nullptr), lf.has_value()));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_optim_step(rl_trainer_t *trainer, const char *params_json,
                                         rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && out_result,
                "rl_trainer_optim_step: trainer and out_result are required");
        const core::OptimResult r = trainer->impl->optim_step(
            core::OptimOverrides::from_json(params_json ? params_json : ""));
        CallSink sink;
        sink.scalars["grad_norm"] = r.grad_norm;
        sink.scalars["learning_rate"] = r.learning_rate;
        sink.scalars["step"] = static_cast<double>(r.step);
        sink.scalars["policy_version"] = static_cast<double>(r.policy_version);
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_save_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              const char *state_json, rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && dir && out_result,
                "rl_trainer_save_checkpoint: trainer, dir and out_result are required");
        CallSink sink;
        sink.texts["path"] = trainer->impl->save_checkpoint(dir, state_json ? state_json : "");
        sink.scalars["step"] = static_cast<double>(trainer->impl->step());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_trainer_load_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              rl_result_t **out_result) {
    return train_boundary([&] {
        require(trainer && dir && out_result,
                "rl_trainer_load_checkpoint: trainer, dir and out_result are required");
        const core::CheckpointInfo info = trainer->impl->load_checkpoint(dir);
        CallSink sink;
        sink.texts["state"] = info.state_json;
        sink.texts["path"] = info.path;
        sink.scalars["step"] = static_cast<double>(info.step);
        sink.scalars["policy_version"] = static_cast<double>(trainer->impl->version());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
