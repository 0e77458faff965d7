// vLLM's NCCL weight transfer (vLLM 0.33.0, docs/serving.md), both roles:
// the trainer (rank 0, hosting the store, minting the NCCL unique id) and an
// inference worker (rank rank_offset, reading the id).
//
// vLLM forms a StatelessProcessGroup: a c10d TCPStore at
// master_address:master_port, hosted by rank 0 and counting world_size
// members; rank 0 then publishes one object with broadcast_obj, the value of
// key "broadcast_from/0/<n>" (n counts rank 0's broadcasts, 0 for the first)
// being pickle.dumps of a ctypes ncclUniqueId of the module
// vllm.distributed.device_communicators.pynccl_wrapper. Everybody then calls
// ncclCommInitRank with it and runs a one-element float32 all_reduce as a
// warm-up; weights follow as ncclBroadcast from rank 0.
//
// The pickle is read and written as one fixed byte layout (no unpickler):
// anything else is refused with an error that names the store key.
#pragma once

#include <ATen/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::serve::vllm {

/// NCCL's ncclUniqueId: 128 opaque bytes.
using UniqueId = std::array<uint8_t, 128>;

/// The module and class vLLM pickles its ncclUniqueId as.
inline constexpr const char *kUniqueIdModule =
    "vllm.distributed.device_communicators.pynccl_wrapper";
inline constexpr const char *kUniqueIdClass = "ncclUniqueId";

/// pickle.dumps(ncclUniqueId) as Python (protocol 4, its default up to 3.13)
/// writes it: 247 bytes.
std::string pickle_unique_id(const UniqueId &id);
/// The id in `bytes`, the value of store key `key` (named in errors). Accepts
/// exactly the layout pickle writes for this object at protocol 4 or 5.
UniqueId unpickle_unique_id(const std::string &bytes, const std::string &key);

/// The key of rank `src`'s n-th broadcast_obj.
std::string broadcast_key(int src, int64_t n);

/// vLLM's StatelessProcessGroup: the TCPStore as vLLM's create() opens it
/// (rank 0 hosts it; every member, the host included, counts itself and the
/// host waits for world_size of them).
class StatelessGroup {
public:
    StatelessGroup(const std::string &address, int port, int rank, int world_size,
                   std::chrono::milliseconds timeout);
    ~StatelessGroup();
    StatelessGroup(const StatelessGroup &) = delete;
    StatelessGroup &operator=(const StatelessGroup &) = delete;

    int rank() const { return rank_; }
    int world_size() const { return world_size_; }
    /// broadcast_obj of an ncclUniqueId from rank 0: rank 0 passes its id
    /// and writes it; the others read (and wait for) the next key of rank 0.
    UniqueId broadcast_unique_id(const std::optional<UniqueId> &mine);
    /// The raw value of a key (waits for it until the timeout).
    std::string get(const std::string &key);
    void set(const std::string &key, const std::string &value);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int rank_;
    int world_size_;
    std::string where_;
    int64_t sent_ = 0;     // broadcast_obj calls of this rank as the source
    int64_t received_ = 0; // broadcast_obj values read from rank 0
};

/// Whether this build and machine can run NCCL communicators; otherwise
/// `why` says what is missing.
bool nccl_available(std::string *why);

/// An NCCL communicator made from an ncclUniqueId (vLLM's PyNcclCommunicator):
/// ncclCommInitRank on `device`, then the warm-up all_reduce every vLLM peer
/// runs. CUDA builds only: elsewhere every call throws naming what is missing.
class NcclComm {
public:
    NcclComm(const UniqueId &id, int rank, int world_size, at::Device device);
    ~NcclComm();
    NcclComm(const NcclComm &) = delete;
    NcclComm &operator=(const NcclComm &) = delete;

    /// ncclGetUniqueId (the trainer's side).
    static UniqueId new_unique_id();
    /// Broadcasts each tensor from `root` in order on the device's current
    /// stream, then waits for them (contiguous CUDA tensors on the device).
    void broadcast(const std::vector<at::Tensor> &tensors, int root = 0);
    at::Device device() const { return device_; }

private:
    void *comm_ = nullptr;
    at::Device device_;
};

/// vLLM's packed transfer: tensors are taken in order into one uint8 buffer
/// until its size exceeds `buffer_bytes` (the tensor that crosses it is still
/// in); returns the end index of each chunk.
std::vector<size_t> packed_chunk_ends(const std::vector<int64_t> &sizes, int64_t buffer_bytes);

} // namespace rl::serve::vllm
