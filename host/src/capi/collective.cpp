// The host extension "rl.host.collective/1" (abi/rl/host.h): c10d's TCPStore
// and Gloo / NCCL process groups for plugins, which may not link libtorch.
// Built on core/dist's Rendezvous and UpdateGroup, the same code that carries
// weights to `rlhost serve` (host/serve/weight_update.cpp).
#include "train_common.hpp"

#include "rl/core/update_group.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

struct rl_collective_store {
    std::unique_ptr<rl::core::dist::Rendezvous> rendezvous;
    std::string address;
    int port = 0;
};

struct rl_collective_group {
    std::unique_ptr<rl::core::dist::UpdateGroup> group;
    std::string backend;
    int device_index = 0;
};

namespace rl::host::capi {
namespace {

thread_local std::string t_last_error;

bool timed_out(const std::string &m) {
    return m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos;
}

template <class F>
rl_status_t guarded(F &&f) {
    try {
        t_last_error.clear();
        f();
        return RL_OK;
    } catch (const HostError &e) {
        t_last_error = e.message;
        return e.status;
    } catch (const rl::core::Error &e) {
        t_last_error = e.what();
        if (e.kind() == rl::core::ErrorKind::InvalidArgument) return RL_ERR_INVALID_ARG;
        return timed_out(t_last_error) ? RL_ERR_TIMEOUT : RL_ERR_IO;
    } catch (const std::exception &e) {
        t_last_error = e.what();
        return timed_out(t_last_error) ? RL_ERR_TIMEOUT : RL_ERR_IO;
    }
}

rl_status_t RL_ABI store_open(const rl_host_api_t *, const char *address, int32_t port,
                              int32_t is_server, int64_t timeout_ms, rl_collective_store_t **out) {
    return guarded([&] {
        if (!out) throw HostError{RL_ERR_INVALID_ARG, "store_open: out_store is NULL"};
        *out = nullptr;
        if (!address || !*address)
            throw HostError{RL_ERR_INVALID_ARG, "store_open: address is empty"};
        if (timeout_ms <= 0)
            throw HostError{RL_ERR_INVALID_ARG, "store_open: timeout_ms must be > 0"};
        auto s = std::make_unique<rl_collective_store>();
        s->address = address;
        s->port = port;
        s->rendezvous = std::make_unique<core::dist::Rendezvous>(
            address, port, is_server != 0, std::chrono::milliseconds(timeout_ms));
        *out = s.release();
    });
}

void RL_ABI store_close(rl_collective_store_t *s) {
    delete s;
}

rl_status_t RL_ABI store_add(rl_collective_store_t *s, const char *key, int64_t delta,
                             int64_t *out) {
    return guarded([&] {
        if (!s || !key || !*key || !out)
            throw HostError{RL_ERR_INVALID_ARG, "store_add: store, key and out_value are required"};
        *out = s->rendezvous->add(key, delta);
    });
}

rl_status_t RL_ABI group_join(rl_collective_store_t *s, const char *prefix, const char *backend,
                              int32_t rank, int32_t world_size, int32_t device_index,
                              int64_t timeout_ms, rl_collective_group_t **out) {
    return guarded([&] {
        if (!out) throw HostError{RL_ERR_INVALID_ARG, "group_join: out_group is NULL"};
        *out = nullptr;
        if (!s || !prefix || !*prefix)
            throw HostError{RL_ERR_INVALID_ARG, "group_join: store and prefix are required"};
        if (timeout_ms <= 0)
            throw HostError{RL_ERR_INVALID_ARG, "group_join: timeout_ms must be > 0"};
        core::dist::UpdateGroupOptions o;
        o.master_address = s->address;
        o.master_port = s->port;
        o.rank = rank;
        o.world_size = world_size;
        o.group_name = prefix;
        o.backend = backend ? backend : "";
        o.timeout = std::chrono::milliseconds(timeout_ms);
        auto g = std::make_unique<rl_collective_group>();
        g->backend = o.backend;
        g->device_index = device_index;
        g->group = std::make_unique<core::dist::UpdateGroup>(o, *s->rendezvous);
        *out = g.release();
    });
}

void RL_ABI group_leave(rl_collective_group_t *g) {
    delete g;
}

rl_status_t RL_ABI broadcast(rl_collective_group_t *g, const rl_tensor_list_t *tensors,
                             int32_t root) {
    return guarded([&] {
        if (!g || !tensors || (tensors->count > 0 && !tensors->items))
            throw HostError{RL_ERR_INVALID_ARG, "broadcast: group and tensors are required"};
        const at::Device device = g->backend == "nccl"
                                      ? at::Device(at::kCUDA, static_cast<int8_t>(g->device_index))
                                      : at::Device(at::kCPU);
        // Views over the caller's memory; staged through the backend's device
        // when they live elsewhere.
        std::vector<at::Tensor> given, moving;
        for (uint64_t i = 0; i < tensors->count; ++i) {
            const rl_tensor_view_t &v = tensors->items[i].view;
            int64_t numel = 1;
            for (int32_t d = 0; d < v.ndim; ++d) numel *= v.shape[d];
            if (numel == 0) continue; // nothing travels (the same on every rank)
            const std::string what =
                std::string("broadcast: tensor '") +
                (tensors->items[i].name ? tensors->items[i].name : std::to_string(i)) + "'";
            if (v.strides != nullptr) {
                int64_t expect = 1;
                for (int32_t d = v.ndim - 1; d >= 0; --d) {
                    if (v.shape[d] != 1 && v.strides[d] != expect)
                        throw HostError{RL_ERR_INVALID_ARG, what + " is not contiguous"};
                    expect *= v.shape[d];
                }
            }
            const at::Device where =
                v.device.type == RL_DEVICE_CUDA
                    ? at::Device(at::kCUDA, static_cast<int8_t>(v.device.index))
                    : at::Device(at::kCPU);
            std::vector<int64_t> shape(v.shape, v.shape + v.ndim);
            at::Tensor t =
                at::from_blob(static_cast<char *>(v.data) + v.byte_offset, shape,
                              at::TensorOptions(where).dtype(scalar_type_of(v.dtype, what)));
            given.push_back(t);
            moving.push_back(where == device ? t : t.to(device));
        }
        g->group->broadcast(moving, root);
        for (size_t i = 0; i < given.size(); ++i)
            if (!moving[i].is_same(given[i])) given[i].copy_(moving[i]);
    });
}

const char *RL_ABI last_error() {
    return t_last_error.c_str();
}

const rl_host_collective_t k_collective = {sizeof(rl_host_collective_t),
                                           0,
                                           &store_open,
                                           &store_close,
                                           &store_add,
                                           &group_join,
                                           &group_leave,
                                           &broadcast,
                                           &last_error};

} // namespace
} // namespace rl::host::capi

namespace rl::host {
// Listed by host_api.cpp's extension table.
const void *collective_extension() {
    return &capi::k_collective;
}
} // namespace rl::host
