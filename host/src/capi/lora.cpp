// abi/rl/train.h: LoRA adapters over a model (docs/lora.md).
#include "train_common.hpp"

#include "rl/core/lora.hpp"

namespace {

std::string name_arg(const char *name, const char *fn) {
    require(name != nullptr && *name, fn_msg(fn, "adapter name is required"));
    return name;
}

std::string dir_arg(const char *dir, const char *fn) {
    require(dir != nullptr && *dir, fn_msg(fn, "dir is required"));
    return dir;
}

// Errors of the core keep their kind; the message gains the function's name.
template <class F>
auto named(const char *fn, F &&f) {
    try {
        return f();
    } catch (const rl::core::Error &e) {
        throw rl::core::Error(e.kind(), fn_msg(fn, e.what()));
    }
}

// An adapter verb over a folder: checks the model, the adapter name and the
// folder, then runs op(policy, name, dir) with errors named after `fn`.
template <class Op>
rl_status_t adapter_folder_verb(const char *fn, rl_model_t *model, const char *name,
                                const char *dir, Op op) {
    return train_boundary([&] {
        require(model != nullptr, fn_msg(fn, "model is NULL"));
        core::Policy &policy = policy_of(model, fn);
        const std::string n = name_arg(name, fn), d = dir_arg(dir, fn);
        named(fn, [&] {
            op(policy, n, d);
            return 0;
        });
        return RL_OK;
    });
}

} // namespace

extern "C" {

RL_API rl_status_t rl_adapter_create(rl_model_t *model, const char *name, const char *lora_json) {
    return train_boundary([&] {
        const char *fn = "rl_adapter_create";
        require(model != nullptr, fn_msg(fn, "model is NULL"));
        core::Policy &policy = policy_of(model, fn);
        const std::string n = name_arg(name, fn);
        named(fn, [&] {
            return policy.create_adapter(n,
                                         core::LoraConfig::from_json(lora_json ? lora_json : ""));
        });
        return RL_OK;
    });
}

RL_API rl_status_t rl_adapter_load(rl_model_t *model, const char *name, const char *dir) {
    return adapter_folder_verb(
        "rl_adapter_load", model, name, dir,
        [](core::Policy &policy, const std::string &n, const std::string &d) {
            policy.add_adapter(core::load_adapter(policy.model(), d, n), /*replace=*/true);
        });
}

RL_API rl_status_t rl_adapter_save(rl_model_t *model, const char *name, const char *dir) {
    return adapter_folder_verb(
        "rl_adapter_save", model, name, dir,
        [](core::Policy &policy, const std::string &n, const std::string &d) {
            core::save_adapter(*policy.adapter(n), d);
        });
}

RL_API rl_status_t rl_adapter_export_merged(rl_model_t *model, const char *name, const char *dir) {
    return adapter_folder_verb(
        "rl_adapter_export_merged", model, name, dir,
        [](core::Policy &policy, const std::string &n, const std::string &d) {
            core::save_merged(policy.model(), *policy.adapter(n), d);
        });
}

RL_API rl_status_t rl_adapter_remove(rl_model_t *model, const char *name) {
    return train_boundary([&] {
        const char *fn = "rl_adapter_remove";
        require(model != nullptr, fn_msg(fn, "model is NULL"));
        core::Policy &policy = policy_of(model, fn);
        const std::string n = name_arg(name, fn);
        if (!policy.remove_adapter(n)) named(fn, [&] { return policy.adapter(n); }); // NotFound
        return RL_OK;
    });
}

RL_API rl_status_t rl_adapter_info(rl_model_t *model, const char *name, rl_result_t **out_result) {
    return train_boundary([&] {
        const char *fn = "rl_adapter_info";
        require(model && out_result, fn_msg(fn, "model and out_result are required"));
        core::Policy &policy = policy_of(model, fn);
        CallSink sink;
        if (name == nullptr) {
            sink.texts["adapters"] = json(policy.adapter_names()).dump();
        } else {
            auto a = named(fn, [&] { return policy.adapter(name); });
            const core::LoraConfig &c = a->config();
            sink.texts["info"] = json{{"name", a->name()},
                                      {"rank", c.rank},
                                      {"alpha", c.alpha},
                                      {"dropout", c.dropout},
                                      {"use_rslora", c.use_rslora},
                                      {"target_modules", c.target_modules},
                                      {"scale", a->scale()},
                                      {"num_parameters", a->num_parameters()},
                                      {"version", a->version()},
                                      {"base_model_name_or_path", c.base_model_name_or_path}}
                                     .dump();
        }
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
