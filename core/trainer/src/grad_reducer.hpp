// dp with trainer.overlap_grad_reduce: gradients summed over ranks in buckets
// while the backward still runs (docs/distributed.md, "Strategies").
//
// Buckets hold parameters in reverse order (the order the backward produces
// their gradients). During the backward of the last micro-batch of a
// forward_backward call, a hook after each parameter's gradient accumulation
// marks it ready; a bucket whose parameters are all ready is copied into a
// float32 buffer and its sum over ranks issued at once, strictly in bucket
// order (so every rank issues the same collectives in the same order). When
// the call ends, the buckets not issued yet (parameters without a gradient in
// that micro-batch) are issued, all are awaited, and the call's sums are added
// to the step's totals; the parameters' own gradients are cleared so the next
// call starts from zero. optim_step takes the totals.
//
// Each buffer carries, after the gradients, one presence flag per parameter
// (whether any rank had a gradient for it) and two tags (the optimizer step
// and the call's index within it): ranks that make different numbers of
// forward_backward calls between optimizer steps are detected and named,
// never summed silently.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace rl::core {

namespace dist {
class Group;
}

class GradReducer {
public:
    GradReducer(std::vector<at::Tensor> params, std::shared_ptr<dist::Group> group,
                double bucket_mb);
    ~GradReducer();
    GradReducer(const GradReducer &) = delete;
    GradReducer &operator=(const GradReducer &) = delete;

    /// The next backward is the last one of a forward_backward call; `step`
    /// is the trainer's optimizer step (a tag every rank must agree on).
    void arm(int64_t step);
    /// After the call (armed or not: a call without a backward still pairs
    /// up): issues what is left, waits, adds the call's sums to the step's
    /// totals and clears the parameters' gradients.
    void finish_call(int64_t step);
    /// Leaves the hooks inert after a failed call (the step's totals stay).
    void disarm();
    /// Per parameter, its gradient summed over ranks and calls since the last
    /// take (float32, shaped as the parameter), undefined where no rank had
    /// one; then starts a new step.
    std::vector<at::Tensor> take();
    /// Drops the step's totals.
    void reset();

    /// Called by the hooks (public for them only).
    void ready(size_t param);

private:
    struct Bucket {
        std::vector<size_t> params; ///< in bucket order
        std::vector<int64_t> offset;
        int64_t grad_numel = 0;
        at::Tensor flat; ///< this call's buffer while in flight
        size_t waiting = 0;
    };
    void issue(size_t bucket);

    std::vector<at::Tensor> params_;
    std::shared_ptr<dist::Group> group_;
    std::vector<Bucket> buckets_;
    std::vector<size_t> bucket_of_;
    std::vector<at::Tensor> totals_; ///< per bucket, the step's sums so far
    bool armed_ = false;
    size_t next_ = 0;      ///< the next bucket to issue
    int64_t calls_ = 0;    ///< forward_backward calls reduced in this step
    int64_t tag_step_ = 0; ///< the step tag of this call
};

} // namespace rl::core
