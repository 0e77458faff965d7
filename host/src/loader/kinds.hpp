// The plugin kinds and the ABI's minimum struct sizes, in one place. The loader
// (runtime.cpp), the C API (capi/plugins.cpp) and rl-validate's checks read them from
// here; adding a kind is one row in kinds.cpp. Internal to librl.
#pragma once

#include <rl_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rl::host {

// One plugin kind.
struct KindInfo {
    const char *name;         // RL_KIND_*: what descriptors and users name
    const char *iface_id;     // RL_IFACE_*: the interface every instance provides
    const char *iface_struct; // its C type, for messages ("rl_loss_iface_t")
    uint32_t min_iface_size;  // size of the interface table's first published layout (0.1)
    // The mandatory slots that are NULL in `iface` (which has at least
    // min_iface_size bytes), comma-separated; "" when well-formed.
    std::string (*missing_slots)(const void *iface);
    // What one call emits besides metrics (documented in the kind's header).
    const char *outputs;
};

// Every kind, in name order.
const std::vector<KindInfo> &kinds();
// The kind named `name`; nullptr when unknown.
const KindInfo *find_kind(std::string_view name);
// "advantage, env, filter, loss, transport".
std::string kind_names();

// Minimum struct_size the host accepts for each struct a plugin provides: the
// size of its first published layout (ABI 0.1). Fields added later are read
// only behind RL_HAS_FIELD.
inline constexpr uint32_t kMinEntrySize = RL_SIZE_THROUGH(rl_plugin_entry_t, get_factory);
inline constexpr uint32_t kMinFactorySize = RL_SIZE_THROUGH(rl_plugin_factory_t, create);
inline constexpr uint32_t kMinDescSize = RL_SIZE_THROUGH(rl_plugin_desc_t, features);
inline constexpr uint32_t kMinPluginSize = RL_SIZE_THROUGH(rl_plugin_t, get_interface);

// "1.2.3" from a packed version.
std::string version_string(uint32_t v);

// The message for a struct from a plugin that is smaller than its first
// published layout: names the file (unless `path` is empty: a refusal record
// carries it), the struct and both sizes and versions.
std::string too_small(const std::string &path, const std::string &what, const char *type,
                      uint32_t got, uint32_t min, uint32_t plugin_abi);

} // namespace rl::host
