// rl/core/buffer.hpp: the rollout buffer between scoring and training.
//
// Scored rollouts go in (push / push_group), complete groups come out
// (pop_groups / pop_batch / wait_batch). On the way the buffer drops
//   * rollouts whose policy version is more than max_off_policy_steps behind
//     the current version ("stale"), at push and whenever the version moves;
//   * complete groups without learning signal (online difficulty filtering):
//     too few rollouts ("too_small"), mean reward >= easy_threshold
//     ("too_easy"), mean reward <= hard_threshold ("too_hard"), or all rewards
//     equal ("zero_variance");
// and counts what it dropped per reason. docs/buffer.md has the exact rules.
//
// Torch-free C++17; every method is thread-safe (one mutex), so engine
// threads can push while the trainer pops. Bad input throws
// rl::core::Error (InvalidArgument) with a message naming the field.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace rl::core {

// One scored sample. Per-token vectors are aligned with token_ids.
struct Rollout {
    int64_t group_id = 0;           // samples of one prompt share it (assigned by the loop)
    int64_t policy_version = 0;     // version of the weights that generated it
    double reward = 0.0;            // finite
    std::vector<int64_t> token_ids; // prompt + completion, non-empty
    std::vector<float> logprobs;    // sampling logprobs [n] (prompt positions unused); may be empty
    std::vector<uint8_t> loss_mask; // 0/1 [n]; empty means all ones
    // Extra per-token vectors [n] the loop wants to carry ("advantages",
    // "ref_logprobs", ...).
    std::map<std::string, std::vector<float>> extras;
    // The sampling temperature of the completion (0: greedy), so the trainer
    // scores it with the same tempered distribution; unset: unknown.
    std::optional<double> sampling_temperature;
    std::string task;       // the task JSON, for logging; may be empty
    std::string completion; // the completion text, for logging; may be empty
    // Mixture-of-experts routing replay (R3): the experts every sparse layer
    // routed each token to when the rollout was sampled, [n, routed_layers,
    // routed_k] flattened (-1 rows: route yourself); empty: none recorded.
    std::vector<int32_t> routed_experts;
    int64_t routed_layers = 0, routed_k = 0;
    // The weights the sampler mixed those experts with (xorl's
    // routed_expert_logits), float32 in the layout of routed_experts (0 in
    // -1 rows); empty: ids only (the trainer recomputes the weights).
    std::vector<float> routed_expert_weights;
};

// A complete group that survived the filters, ready for training.
struct Group {
    int64_t group_id = 0;
    std::vector<Rollout> rollouts; // in arrival order, never empty
    double mean_reward() const;
    int64_t min_policy_version() const;
    size_t n_tokens() const;
};

enum class DropReason { Stale, TooSmall, TooEasy, TooHard, ZeroVariance };
const char *drop_reason_name(DropReason reason); // "stale", "too_small", ...

struct BufferConfig {
    // Rollouts per group that push() waits for. 0: each group's size comes
    // from expect_group(), or groups arrive whole through push_group().
    size_t group_size = 0;
    // Drop a complete group whose mean reward is >= easy_threshold / <=
    // hard_threshold (unset: no such rule). hard_threshold < easy_threshold.
    std::optional<double> easy_threshold;
    std::optional<double> hard_threshold;
    // Drop a complete group of two or more rollouts whose rewards are all
    // equal (max - min <= reward_tolerance): it has no relative signal.
    bool drop_zero_variance = true;
    double reward_tolerance = 0.0;
    // Drop a complete group holding fewer rollouts (after stale ones left).
    size_t min_group_size = 1;
    // A rollout is stale when current_version - policy_version exceeds this.
    // Unset: never stale.
    std::optional<int64_t> max_off_policy_steps = 8;
    // How many drop records take_drop_log() keeps (oldest are discarded).
    size_t drop_log_capacity = 1024;

    // A JSON object with the keys above (rl::core::buffer_params() declares
    // them, their defaults and ranges); unknown keys and bad values are errors
    // naming the key. Validates.
    static BufferConfig from_json(const std::string &json_text);
    // Throws rl::core::Error naming the bad field.
    void validate() const;
};

struct DropCount {
    int64_t groups = 0;   // groups removed entirely for this reason
    int64_t rollouts = 0; // rollouts removed for this reason
};

struct BufferStats {
    int64_t pushed_rollouts = 0;
    int64_t completed_groups = 0; // groups that completed (kept or dropped)
    int64_t ready_groups = 0;     // groups that passed the filters when they completed
                                  // (one dropped later, after a version bump, is also
                                  // counted under `dropped`)
    int64_t popped_groups = 0;
    int64_t popped_rollouts = 0;
    // Every reason name is present ("stale", "too_small", "too_easy",
    // "too_hard", "zero_variance").
    std::map<std::string, DropCount> dropped;
    int64_t dropped_rollouts() const;
    int64_t dropped_groups() const;
};

struct DropRecord {
    int64_t group_id = 0;
    DropReason reason = DropReason::Stale;
    size_t rollouts = 0;         // how many rollouts this record removed
    double mean_reward = 0.0;    // of the removed rollouts
    int64_t policy_version = 0;  // oldest version among them
    int64_t current_version = 0; // the buffer's version at the time
};

class RolloutBuffer {
public:
    explicit RolloutBuffer(BufferConfig config = {});

    const BufferConfig &config() const { return config_; }

    // The trainer's current policy version; never decreases. Moving it drops
    // every held rollout (pending or ready) that became stale.
    void set_policy_version(int64_t version);
    int64_t policy_version() const;

    // Declares how many rollouts group `group_id` will receive (overrides
    // group_size for it). If that many already arrived, the group completes.
    void expect_group(int64_t group_id, size_t size);
    // Adds one rollout to its pending group; the group completes when as many
    // rollouts arrived (stale ones included) as it expects.
    void push(Rollout rollout);
    // Adds a whole group (non-empty, one group id) and completes it.
    void push_group(std::vector<Rollout> rollouts);
    // Completes a pending group with what arrived (e.g. some samples failed).
    // Returns false when there is no pending group with that id.
    bool close_group(int64_t group_id);

    size_t ready_groups() const;
    size_t ready_rollouts() const;
    size_t pending_groups() const;
    size_t pending_rollouts() const;

    // Up to max_groups ready groups, oldest first.
    std::vector<Group> pop_groups(size_t max_groups);
    // Oldest ready groups until they hold >= min_rollouts rollouts (the last
    // group may overshoot); nothing at all when fewer are ready.
    std::vector<Group> pop_batch(size_t min_rollouts);
    // pop_batch, waiting up to `timeout` for enough rollouts; empty on timeout.
    std::vector<Group> wait_batch(size_t min_rollouts, std::chrono::milliseconds timeout);
    // Every ready group, once at least min_rollouts rollouts are ready (waiting
    // up to `timeout`, 0: not at all); empty when fewer are.
    std::vector<Group> pop_ready(size_t min_rollouts, std::chrono::milliseconds timeout);
    /// Waits up to `timeout` for `min_rollouts` ready rollouts; returns how
    /// many are ready (pops nothing).
    size_t wait_ready(size_t min_rollouts, std::chrono::milliseconds timeout);

    BufferStats stats() const; // since construction
    BufferStats take_stats();  // since the previous take_stats()
    std::vector<DropRecord> take_drop_log();

    // Everything the buffer holds and has counted (policy version, pending and
    // ready groups with every field of their rollouts, counters, drop log) as
    // one JSON text, so a process that restarts loses nothing it had taken in
    // (docs/buffer.md). Floats are written exactly (shortest round trip).
    std::string state_json() const;
    // Restores state_json() into this buffer, which must hold nothing yet;
    // its config is its own (the saved one is not read). Malformed state is an
    // Error naming `source` and the field; the buffer is unchanged then.
    void restore(const std::string &state_json, const std::string &source);

private:
    struct Pending {
        std::vector<Rollout> rollouts;
        size_t arrived = 0;  // rollouts pushed, stale ones included
        size_t expected = 0; // 0: not declared yet
    };

    void validate_rollout(const Rollout &r, const char *where) const;
    bool is_stale(const Rollout &r) const;
    void drop(int64_t group_id, DropReason reason, const std::vector<Rollout> &removed,
              bool whole_group);
    // Removes stale rollouts from `rollouts`, recording them; true when any
    // was removed.
    bool sweep_stale(int64_t group_id, std::vector<Rollout> &rollouts);
    // Judges a complete group: ready, or dropped with a reason. `arrived`
    // counts its rollouts before stale ones were removed.
    void complete(int64_t group_id, std::vector<Rollout> rollouts, size_t arrived);
    std::optional<DropReason> judge(const std::vector<Rollout> &rollouts) const;
    std::vector<Group> pop_batch_locked(size_t min_rollouts);
    size_t ready_rollouts_locked() const;

    BufferConfig config_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    int64_t version_ = 0;
    std::unordered_map<int64_t, Pending> pending_;
    std::deque<Group> ready_;
    BufferStats total_, interval_;
    std::deque<DropRecord> log_;
};

} // namespace rl::core
