// AdamW on CUDA in a few fused kernel launches instead of about ten per
// parameter, over the state torch::optim::AdamW keeps (checkpoints, state
// sizes and the CPU path are unchanged).
#pragma once

#include <torch/optim/adamw.h>

namespace rl::core {

/// One AdamW step of every parameter of `opt` that has a gradient, through
/// at::_fused_adamw_ (the kernel of torch.optim.AdamW(fused=True)): the same
/// update as opt.step(), to float rounding. The moments and step counts stay
/// in opt's AdamWParamState. Returns false without touching anything where it
/// does not apply (a parameter or gradient that is not float32 on CUDA,
/// amsgrad): the caller then runs opt.step().
bool fused_adamw_step(torch::optim::AdamW &opt);

/// Sum of squares of every tensor (float64 on the host), in one fused
/// launch per chunk on CUDA (at::_foreach_norm); elsewhere float64 sums.
double sum_of_squares(const std::vector<at::Tensor> &ts);

} // namespace rl::core
