// Weight updates of a serving model (the SGLang protocol of protocols.md D.2 /
// D.3 and prime-rl's /update_weights): from a Hugging Face folder on disk,
// from broadcasts over a weight-update process group, or from tensors in the
// request. Every path follows one state machine:
//
//   receive -> check (names, shapes, CRC-32C when given) -> stage (the
//   model's dtype and device, outside the pause) -> swap under
//   Scheduler::exclusive -> adopt the new version
//
// A failure before the swap leaves the weights in use untouched; requests in
// flight are re-prefilled under the new weights (scheduler.hpp), so no
// sample ever mixes two versions.
#pragma once

#include "rl/core/policy.hpp"
#include "rl/core/scheduler.hpp"
#include "rl/core/update_group.hpp"
#include "vllm_transfer.hpp"

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace rl::serve {

struct UpdateOutcome {
    int64_t tensors = 0;
    uint64_t bytes = 0;
    double seconds = 0;
    /// The label of the new weights: the weight_version given, else the new
    /// policy version as text.
    std::string weight_version;
};

/// Thrown for an update that was refused; the old weights keep serving.
/// `status` is the HTTP status a server answers with.
struct UpdateRefused : std::runtime_error {
    UpdateRefused(int status, const std::string &what) : std::runtime_error(what), status(status) {}
    int status;
};

/// One announced tensor of /update_weights_from_distributed.
struct AnnouncedTensor {
    std::string name;
    std::string dtype; ///< torch name without "torch.": float32, bfloat16, ...
    std::vector<int64_t> shape;
};

/// vLLM's init_info of /init_weight_transfer_engine (its NCCL engine, vLLM
/// 0.33.0): the store's address (or a pre-shared NCCL id) and the packing.
struct VllmInitInfo {
    std::string master_address;
    int master_port = 0;
    int rank_offset = 1;
    int world_size = 2;
    std::optional<vllm::UniqueId> unique_id; ///< nccl_unique_id_b64, instead of the store
    bool packed = false;
    int64_t packed_buffer_size_bytes = int64_t{1} << 30;
    int64_t packed_num_buffers = 2;
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class WeightUpdater {
public:
    WeightUpdater(std::shared_ptr<core::Policy> policy, core::Scheduler &scheduler);
    ~WeightUpdater();

    /// Every weight of the model from an HF folder (model.safetensors or a
    /// sharded index). CRC-32C per tensor, of its bytes as stored, from
    /// `checksums` or else from the folder's rl_checksums.json when present.
    UpdateOutcome from_disk(const std::string &dir,
                            const std::optional<std::map<std::string, uint32_t>> &checksums,
                            const std::optional<std::string> &weight_version);

    /// Joins the group as rank options.rank (blocks until formed).
    void init_group(const core::dist::UpdateGroupOptions &options);
    void destroy_group(const std::string &group_name);
    bool has_group() const;

    /// Receives the announced tensors by broadcast from rank 0 (one per
    /// tensor, or one uint8 buffer of all their bytes when `flattened`),
    /// checks them (and their CRC-32C when given) and swaps them in.
    UpdateOutcome from_distributed(const std::vector<AnnouncedTensor> &tensors,
                                   const std::string &group_name, bool flattened,
                                   const std::optional<std::vector<uint32_t>> &checksums,
                                   const std::optional<std::string> &weight_version);

    /// Tensors given in the request (CPU tensors; checksums optional).
    UpdateOutcome from_tensors(const std::vector<std::pair<std::string, at::Tensor>> &tensors,
                               const std::optional<std::vector<uint32_t>> &checksums,
                               const std::optional<std::string> &weight_version);

    /// vLLM's NCCL engine: joins the trainer's StatelessProcessGroup as rank
    /// rank_offset, reads the NCCL id, makes the communicator (CUDA only).
    void vllm_init(const VllmInitInfo &info);
    /// Opens an update: received tensors wait for vllm_finish (one swap).
    void vllm_start();
    /// Receives the announced tensors from rank 0 (empty: those of the
    /// previous call). Outside an opened update they are swapped in at once
    /// and the outcome returned; inside, they wait for vllm_finish.
    std::optional<UpdateOutcome> vllm_receive(std::vector<AnnouncedTensor> tensors);
    /// Swaps in everything received since vllm_start.
    UpdateOutcome vllm_finish(const std::optional<std::string> &weight_version);
    void vllm_shutdown();

private:
    std::vector<std::pair<std::string, at::Tensor>>
    vllm_receive_locked(const std::vector<AnnouncedTensor> &tensors);
    UpdateOutcome swap_in(std::vector<std::pair<std::string, at::Tensor>> received,
                          const std::optional<std::vector<uint32_t>> &checksums,
                          const std::optional<std::string> &weight_version, bool full,
                          double seconds_so_far);

    std::shared_ptr<core::Policy> policy_;
    core::Scheduler &scheduler_;
    mutable std::mutex mu_; // one update at a time; guards group_
    std::unique_ptr<core::dist::UpdateGroup> group_;
    std::unique_ptr<vllm::NcclComm> vllm_comm_;
    VllmInitInfo vllm_info_;
    std::vector<AnnouncedTensor> vllm_last_;
    bool vllm_open_ = false;
    std::vector<std::pair<std::string, at::Tensor>> vllm_pending_;
};

/// torch dtype name ("float32", "bfloat16", "float16", "int64", "uint8", ...)
/// to a scalar type; throws UpdateRefused(400) naming `field`.
at::ScalarType scalar_type_of(const std::string &name, const std::string &field);
/// The torch name of a scalar type.
std::string torch_dtype_name(at::ScalarType t);
/// CRC-32C of a contiguous CPU tensor's bytes.
uint32_t tensor_crc32c(const at::Tensor &t);
/// Writes rl_checksums.json for an HF folder: CRC-32C of every tensor's bytes
/// as stored in its safetensors file(s).
void write_checksums_file(const std::string &dir);

} // namespace rl::serve
