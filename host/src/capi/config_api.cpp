// abi/rl/runtime.h: run configurations (load, a script's own sections, the
// schema).
#include "common.hpp"
#include "rl/host/config.hpp"
#include "rl/core/json.hpp"

using namespace rl::host::capi;
using nlohmann::json;
using rl::host::CallSink;

extern "C" {

RL_API rl_status_t rl_config_load(const char *path, const char *const *overrides,
                                  uint64_t n_overrides, rl_result_t **out_result) {
    return boundary([&] {
        require(out_result != nullptr, "rl_config_load: out_result is NULL");
        std::vector<std::string> sets;
        for (uint64_t i = 0; i < n_overrides; ++i) {
            require(overrides && overrides[i],
                    "rl_config_load: override " + std::to_string(i) + " is NULL");
            sets.emplace_back(overrides[i]);
        }
        rl::host::LoadedConfig loaded = rl::host::load_config(path ? path : "", sets);
        CallSink sink;
        sink.texts["config"] = loaded.config.dump();
        sink.texts["undeclared"] = json(loaded.undeclared).dump();
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_config_declare(const char *config_json, const char *declarations_json,
                                     rl_result_t **out_result) {
    return boundary([&] {
        require(config_json && declarations_json && out_result,
                "rl_config_declare: config_json, declarations_json and out_result are required");
        std::string error;
        json config, decl;
        require(
            rl::core::try_parse_json(config_json, config, "rl_config_declare: config_json", &error),
            error);
        require(config.is_object(), "rl_config_declare: config_json is not a JSON object");
        require(rl::core::try_parse_json(declarations_json, decl,
                                         "rl_config_declare: declarations_json", &error),
                error);
        CallSink sink;
        sink.texts["config"] =
            rl::host::declare_config(config, rl::host::parse_declarations(decl)).dump();
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

RL_API rl_status_t rl_config_schema(rl_result_t **out_result) {
    return boundary([&] {
        require(out_result != nullptr, "rl_config_schema: out_result is NULL");
        CallSink sink;
        sink.texts["schema"] = rl::host::schema_json(rl::host::config_schema()).dump();
        sink.texts["markdown"] = rl::host::schema_markdown(rl::host::config_schema());
        *out_result = new_result(std::move(sink));
        return RL_OK;
    });
}

} // extern "C"
