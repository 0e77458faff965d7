// The kinds table: name, interface id, minimum interface size, validation.
#include "kinds.hpp"

#include <algorithm>
#include <initializer_list>

namespace rl::host {
namespace {

// A required function of an interface table, by name.
struct Slot {
    const void *fn;
    const char *name;
};

template <class F>
Slot slot(F fn, const char *name) {
    return {reinterpret_cast<const void *>(fn), name};
}

// The names of the NULL slots, comma-separated ("" when none is).
std::string missing(std::initializer_list<Slot> slots) {
    std::string out;
    for (const Slot &s : slots)
        if (!s.fn) out += (out.empty() ? "" : ", ") + std::string(s.name);
    return out;
}

std::string loss_missing(const void *p) {
    auto *t = static_cast<const rl_loss_iface_t *>(p);
    return missing({slot(t->get_signature, "get_signature"), slot(t->compute, "compute")});
}

std::string advantage_missing(const void *p) {
    return missing({slot(static_cast<const rl_advantage_iface_t *>(p)->compute, "compute")});
}

std::string filter_missing(const void *p) {
    return missing({slot(static_cast<const rl_filter_iface_t *>(p)->check, "check")});
}

std::string env_missing(const void *p) {
    auto *t = static_cast<const rl_env_iface_t *>(p); // step is optional
    return missing({slot(t->sample, "sample"), slot(t->score, "score")});
}

std::string transport_missing(const void *p) {
    auto *t = static_cast<const rl_transport_iface_t *>(p); // broadcast is optional
    return missing({slot(t->send, "send"), slot(t->recv, "recv")});
}

} // namespace

const std::vector<KindInfo> &kinds() {
    static const std::vector<KindInfo> table = {
        {RL_KIND_ADVANTAGE, RL_IFACE_ADVANTAGE, "rl_advantage_iface_t",
         RL_SIZE_THROUGH(rl_advantage_iface_t, compute), &advantage_missing,
         "tensor \"advantages\" (and \"returns\")"},
        {RL_KIND_ENV, RL_IFACE_ENV, "rl_env_iface_t", RL_SIZE_THROUGH(rl_env_iface_t, step),
         &env_missing, "sample: text \"tasks\"; score: *out_reward; step: text \"state\""},
        {RL_KIND_FILTER, RL_IFACE_FILTER, "rl_filter_iface_t",
         RL_SIZE_THROUGH(rl_filter_iface_t, check), &filter_missing, "rl_filter_verdict_t"},
        {RL_KIND_LOSS, RL_IFACE_LOSS, "rl_loss_iface_t", RL_SIZE_THROUGH(rl_loss_iface_t, compute),
         &loss_missing, "rl_loss_outputs_t (loss, gradients), extra tensors"},
        {RL_KIND_TRANSPORT, RL_IFACE_TRANSPORT, "rl_transport_iface_t",
         RL_SIZE_THROUGH(rl_transport_iface_t, broadcast), &transport_missing,
         "recv: text \"header\" and the message's tensors"},
    };
    return table;
}

const KindInfo *find_kind(std::string_view name) {
    for (const auto &k : kinds())
        if (name == k.name) return &k;
    return nullptr;
}

std::string kind_names() {
    std::string s;
    for (const auto &k : kinds()) s += (s.empty() ? "" : ", ") + std::string(k.name);
    return s;
}

std::string version_string(uint32_t v) {
    return std::to_string(RL_VERSION_MAJOR(v)) + "." + std::to_string(RL_VERSION_MINOR(v)) + "." +
           std::to_string(RL_VERSION_PATCH(v));
}

std::string too_small(const std::string &path, const std::string &what, const char *type,
                      uint32_t got, uint32_t min, uint32_t plugin_abi) {
    return (path.empty() ? std::string() : path + ": ") + what + ": " + type + " has struct_size " +
           std::to_string(got) + ", smaller than " + std::to_string(min) +
           " bytes, the size of its first published layout (ABI 0.1); the plugin declares ABI " +
           version_string(plugin_abi) + ", the host is ABI " + version_string(RL_ABI_VERSION);
}

} // namespace rl::host
