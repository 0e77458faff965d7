// rl/host/sink.hpp: what one call into a plugin produced (metrics, tensors,
// texts, scalars, the failure message). It becomes the embedder's rl_result_t.
#pragma once

#include <rl_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace rl::host {

// An owned, contiguous CPU tensor.
struct OwnedTensor {
    rl_dtype_t dtype{};
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;

    int64_t numel() const;
    rl_tensor_view_t view() const;                            // borrowed from this object
    static OwnedTensor copy_of(const rl_tensor_view_t &view); // throws on a bad view
    static OwnedTensor zeros(rl_dtype_t dtype, const std::vector<int64_t> &shape);
};

size_t dtype_size(rl_dtype_t dtype);
std::string dtype_string(rl_dtype_t dtype);

// How a metric emitted with emit_metric_reduced (ABI 0.6) combines over calls.
struct MetricReduction {
    rl_metric_reduction_t reduction = RL_METRIC_DEFAULT;
    double weight = 0;
};

struct CallSink {
    std::string who; // "loss 'policy_loss'": prefixed to failure messages
    std::map<std::string, double> scalars;
    std::map<std::string, double> metrics;
    // The declared reductions of the metrics that have one (emit_metric_reduced).
    std::map<std::string, MetricReduction> reductions;
    std::map<std::string, OwnedTensor> tensors;
    std::map<std::string, std::string> texts;
    bool failed = false;
    rl_status_t fail_status = RL_OK;
    std::string fail_message;

    std::string to_json() const;
};

} // namespace rl::host

// The embedder's result handle is a sink plus its JSON text, made once on the
// first rl_result_json (readers of one result may call it at the same time).
struct rl_result {
    rl::host::CallSink sink;
    std::once_flag json_once;
    std::string json_cache;
};
