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

class UpdateGroup {
public:
    /// Joins (blocks until every rank joined or the timeout passed). Errors
    /// name the address, the rank and the option at fault.
    explicit UpdateGroup(const UpdateGroupOptions &options);
    ~UpdateGroup();
    UpdateGroup(const UpdateGroup &) = delete;
    UpdateGroup &operator=(const UpdateGroup &) = delete;

    const UpdateGroupOptions &options() const { return options_; }
    /// Broadcasts every tensor from rank 0 in order, all in flight at once;
    /// other ranks receive into theirs (allocated with the announced shapes
    /// and dtypes). Contiguous tensors; CPU under Gloo, CUDA under NCCL.
    void broadcast(std::vector<at::Tensor> &tensors);

private:
    struct Impl;
    UpdateGroupOptions options_;
    std::unique_ptr<Impl> impl_;
};

} // namespace rl::core::dist
