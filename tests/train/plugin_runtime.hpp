// plugin_runtime(dir): a runtime over the plugins of one folder, for the train
// tests and their helper programs (no GoogleTest here).
#pragma once

#include <rl_api.h>

namespace rl_train_test {

/// A runtime loading only the plugins in `plugin_dir` (not the default
/// path), logging warnings; NULL when it cannot be made (rl_last_error says
/// why).
inline rl_runtime_t *plugin_runtime(const char *plugin_dir) {
    rl_runtime_desc_t d = RL_RUNTIME_DESC_INIT;
    d.flags = RL_RUNTIME_NO_DEFAULT_PLUGINS;
    d.plugin_path = plugin_dir;
    d.log_level = "warn";
    rl_runtime_t *r = nullptr;
    return rl_runtime_create(&d, &r) == RL_OK ? r : nullptr;
}

} // namespace rl_train_test
