// The step value of each loss metric from its values in every micro-batch and
// on every rank, by the reduction the loss declared (abi/rl/host.h
// rl_metric_reduction_t; docs/abi.md, "Metrics and their reductions").
// Internal to the trainer.
#pragma once

#include "rl/core/trainer.hpp"

#include <limits>
#include <map>
#include <string>

namespace rl::core {

namespace dist {
class Group;
}

class MetricReducer {
public:
    /// One call's value. A Default metric is a token mean weighted by
    /// `call_tokens` (the call's loss tokens); the others use `spec.weight`.
    /// The same name with another reduction than before is an error naming
    /// the loss (`who`) and the metric.
    void add(const std::string &who, const std::string &name, double value, const MetricSpec &spec,
             double call_tokens);
    /// Combines every rank's sums and extremes (a collective: every rank calls
    /// it, in step). Returns false, keeping this rank's own values, when the
    /// ranks emitted different metrics.
    bool all_reduce(dist::Group &group);
    std::map<std::string, double> values() const;

private:
    struct Acc {
        MetricReduce reduce = MetricReduce::Default;
        double weighted = 0, weight = 0; // sum w * v, sum w
        double plain = 0, count = 0;     // sum v, number of values
        double hi = -std::numeric_limits<double>::infinity();
        double lo = std::numeric_limits<double>::infinity();
    };
    std::map<std::string, Acc> acc_;
};

} // namespace rl::core
