// rl/core/update_group.hpp: the process group that carries weights from a
// trainer to inference servers, formed the way SGLang's
// /init_weights_update_group forms it (protocols.md D.3): a c10d TCPStore at
// master_address:master_port hosted by the trainer (rank 0), a PrefixStore
// named after the group, and a Gloo (CPU tensors) or NCCL (CUDA tensors)
// process group of `world_size` ranks; each server joins as rank_offset +
// its rank. Weights then travel as broadcasts from rank 0, in the order both
// sides agreed on in the request that announced them.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rl::core::dist {

struct UpdateGroupOptions {
    std::string master_address = "127.0.0.1";
    int master_port = 0;
    int rank = 0; ///< 0: the trainer, which hosts the store
    int world_size = 2;
    std::string group_name = "weight_update_group";
    std::string backend = "gloo"; ///< "gloo" or "nccl"
    std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

/// A c10d TCPStore at address:port: hosted by one process (server), reached
/// by the others. Shared by the groups formed on it (each under its own key
/// prefix), so one rendezvous serves a sequence of groups.
class Rendezvous {
public:
    /// Hosts or reaches the store, waiting at most `timeout` to reach it.
    Rendezvous(const std::string &address, int port, bool server,
               std::chrono::milliseconds timeout);
    ~Rendezvous();
    Rendezvous(const Rendezvous &) = delete;
    Rendezvous &operator=(const Rendezvous &) = delete;
    /// Adds `delta` to the integer at `key` (a new key starts at 0); returns the sum.
    int64_t add(const std::string &key, int64_t delta);
    const std::string &where() const { return where_; }

private:
    friend class UpdateGroup;
    struct Impl;
    std::string where_;
    std::unique_ptr<Impl> impl_;
};

class UpdateGroup {
public:
    /// Joins (blocks until every rank joined or the timeout passed). Errors
    /// name the address, the rank and the option at fault.
    explicit UpdateGroup(const UpdateGroupOptions &options);
    /// Joins on an existing rendezvous (its address and port are the
    /// options'); the group's keys live under options.group_name there.
    UpdateGroup(const UpdateGroupOptions &options, Rendezvous &store);
    ~UpdateGroup();
    UpdateGroup(const UpdateGroup &) = delete;
    UpdateGroup &operator=(const UpdateGroup &) = delete;

    const UpdateGroupOptions &options() const { return options_; }
    /// Broadcasts every tensor from rank 0 in order, all in flight at once;
    /// other ranks receive into theirs (allocated with the announced shapes
    /// and dtypes). Contiguous tensors; CPU under Gloo, CUDA under NCCL.
    void broadcast(std::vector<at::Tensor> &tensors, int root = 0);

private:
    void form(const UpdateGroupOptions &o, bool own_store);
    struct Impl;
    UpdateGroupOptions options_;
    std::unique_ptr<Impl> impl_;
};

} // namespace rl::core::dist
