// rl/core/dist.hpp: the process group of a distributed run, on c10d.
//
// Ranks find each other torchrun's way: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (set by `rlhost launch`,
// torchrun, Slurm wrappers or Kubernetes operators). Rank 0 hosts a c10d
// TCPStore at MASTER_ADDR:MASTER_PORT; the collectives run on Gloo for CPU
// tensors and on NCCL for CUDA tensors.
//
// Failures never hang: every collective waits at most `timeout`, and a
// failed or timed-out collective is reported with the rank at fault, found
// from heartbeats each rank writes into the store (a rank whose heartbeat
// stopped died or hung; a rank behind in the collective count hangs or runs
// different code).
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core::dist {

/// Where this process sits in the run, from the environment.
struct Env {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    int local_world_size = 1;
    std::string master_addr = "127.0.0.1";
    int master_port = 29500;
    bool from_environment = false; ///< WORLD_SIZE was set
};

/// Reads the torchrun variables. Unset WORLD_SIZE: a single process. Throws
/// Error naming the variable for a malformed or inconsistent value.
Env env_from_environment();

struct Options {
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    /// "auto" (NCCL when the device is CUDA, else Gloo), "gloo" or "nccl".
    std::string backend = "auto";
};

class Group {
public:
    /// Joins the group described by `env` (rendezvous through the TCPStore of
    /// rank 0). `device` ("cpu", "cuda[:N]", "auto") picks the backend under
    /// backend "auto".
    static std::shared_ptr<Group> create(const Env &env, const Options &options,
                                         const std::string &device);
    ~Group();
    Group(const Group &) = delete;
    Group &operator=(const Group &) = delete;

    int rank() const { return env_.rank; }
    int size() const { return env_.world_size; }
    int local_rank() const { return env_.local_rank; }
    const Env &env() const { return env_; }
    const Options &options() const { return options_; }
    std::string backend_name() const;

    /// In place: the element-wise sum over ranks.
    void all_reduce_sum(at::Tensor &t);
    /// In place: the element-wise maximum over ranks.
    void all_reduce_max(at::Tensor &t);
    /// Several tensors summed, all in flight at once (gradient buckets).
    void all_reduce_sum(std::vector<at::Tensor> &ts);
    /// Starts an in-place sum over ranks of `t` and returns at once (gradient
    /// buckets issued during the backward); `t` must not be touched until
    /// finish_issued() returns. Every rank issues the same sums in the same order.
    void issue_all_reduce_sum(const at::Tensor &t);
    /// Waits for every issued sum, in issue order; a failure is reported as
    /// for the blocking collectives (naming the rank at fault), under `what`.
    void finish_issued(const char *what);
    /// out [W * n] = concatenation of every rank's `in` [n] (1-D, contiguous).
    void all_gather(at::Tensor &out, const at::Tensor &in);
    /// out [n] = this rank's slice of the sum over ranks of `in` [W * n].
    void reduce_scatter_sum(at::Tensor &out, const at::Tensor &in);
    /// `t` takes rank `root`'s value on every rank.
    void broadcast(at::Tensor &t, int root);
    /// Rows to and from every rank: `in` (dim 0 split into in_rows[r] rows
    /// for rank r, in rank order) is sent, `out` receives out_rows[r] rows
    /// from each rank r, in rank order. Both contiguous, same dtype and row
    /// shape; every rank's in_rows[me] must equal my out_rows[it].
    void all_to_all(at::Tensor &out, const at::Tensor &in, const std::vector<int64_t> &out_rows,
                    const std::vector<int64_t> &in_rows);
    /// A group of some of this group's ranks (`ranks`, in the new group's
    /// rank order), for collectives among them only; every member calls it
    /// with the same ranks and `name` (unique per subgroup), other ranks do
    /// not. Its rank() is this rank's position in `ranks`.
    std::shared_ptr<Group> subgroup(const std::vector<int> &ranks, const std::string &name);
    void barrier();

    /// Bytes: rank `root`'s `value` on every rank.
    std::string broadcast_bytes(const std::string &value, int root);
    /// Every rank's `value`, by rank, on every rank.
    std::vector<std::string> all_gather_bytes(const std::string &value);

private:
    struct Impl;
    Group(Env env, Options options);
    /// Runs a collective; on failure throws Error naming the rank at fault.
    template <typename F>
    void run(const char *what, F &&issue);

    Env env_;
    Options options_;
    std::vector<int> members_; ///< a subgroup's ranks in the whole world (empty: the world)
    std::unique_ptr<Impl> impl_;
};

/// The process group of this process: set by init(), else made on first use
/// from the environment with the default options, for `device` (a null
/// pointer for a single process).
std::shared_ptr<Group> current(const std::string &device = "cpu");
/// Joins the group of the environment with these options (idempotent: a
/// second call returns the existing group; a different backend or timeout is
/// an error). Null for a single process.
std::shared_ptr<Group> init(const Options &options, const std::string &device = "cpu");
/// Leaves the group (tests, and the end of a run).
void shutdown();

/// Whole items split over `world` ranks, balanced by cost: a contiguous range
/// [begin, end) of item indices per rank, in rank order, so that the largest
/// rank total is close to the smallest possible (every rank gets at least one
/// item when there are enough).
std::vector<std::pair<size_t, size_t>> balanced_ranges(const std::vector<int64_t> &costs,
                                                       int world);

} // namespace rl::core::dist
