#include "metric_reducer.hpp"

#include "rl/core/dist.hpp"
#include "rl/core/error.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace rl::core {

namespace {

const char *reduce_name(MetricReduce r) {
    switch (r) {
        case MetricReduce::Default:
            return "default";
        case MetricReduce::TokenMean:
            return "token_mean";
        case MetricReduce::SeqMean:
            return "seq_mean";
        case MetricReduce::Sum:
            return "sum";
        case MetricReduce::Min:
            return "min";
        case MetricReduce::Max:
            return "max";
    }
    return "?";
}

} // namespace

void MetricReducer::add(const std::string &who, const std::string &name, double value,
                        const MetricSpec &spec, double call_tokens) {
    auto [it, fresh] = acc_.try_emplace(name);
    Acc &a = it->second;
    if (fresh) {
        a.reduce = spec.reduce;
    } else if (a.reduce != spec.reduce) {
        throw Error(ErrorKind::InvalidArgument,
                    who + ": metric '" + name + "' was emitted with reduction '" +
                        reduce_name(a.reduce) + "' in one micro-batch and '" +
                        reduce_name(spec.reduce) + "' in another");
    }
    const double w = spec.reduce == MetricReduce::Default ? call_tokens : spec.weight;
    a.weighted += w * value;
    a.weight += w;
    a.plain += value;
    a.count += 1;
    if (w > 0) {
        a.hi = std::max(a.hi, value);
        a.lo = std::min(a.lo, value);
    }
}

bool MetricReducer::all_reduce(dist::Group &group) {
    // Same metrics, same reductions, same order on every rank, or no reduction.
    std::string names;
    for (const auto &kv : acc_)
        names += kv.first + '=' + std::to_string(static_cast<int>(kv.second.reduce)) + ';';
    const std::vector<std::string> all = group.all_gather_bytes(names);
    if (std::any_of(all.begin(), all.end(), [&](const std::string &s) { return s != names; }))
        return false;
    if (acc_.empty()) return true;
    const int64_t n = static_cast<int64_t>(acc_.size());
    at::Tensor sums = at::empty({n, 4}, at::kDouble), most = at::empty({n, 2}, at::kDouble);
    double *s = sums.data_ptr<double>(), *m = most.data_ptr<double>();
    for (const auto &kv : acc_) {
        const Acc &a = kv.second;
        *s++ = a.weighted;
        *s++ = a.weight;
        *s++ = a.plain;
        *s++ = a.count;
        *m++ = a.hi;
        *m++ = -a.lo;
    }
    group.all_reduce_sum(sums);
    group.all_reduce_max(most);
    s = sums.data_ptr<double>();
    m = most.data_ptr<double>();
    for (auto &kv : acc_) {
        Acc &a = kv.second;
        a.weighted = *s++;
        a.weight = *s++;
        a.plain = *s++;
        a.count = *s++;
        a.hi = *m++;
        a.lo = -*m++;
    }
    return true;
}

std::map<std::string, double> MetricReducer::values() const {
    std::map<std::string, double> out;
    for (const auto &kv : acc_) {
        const Acc &a = kv.second;
        const double plain_mean = a.count > 0 ? a.plain / a.count : 0.0;
        double v = plain_mean;
        switch (a.reduce) {
            case MetricReduce::Sum:
                v = a.plain;
                break;
            case MetricReduce::Min:
                if (a.weight > 0) v = a.lo;
                break;
            case MetricReduce::Max:
                if (a.weight > 0) v = a.hi;
                break;
            default:
                if (a.weight > 0) v = a.weighted / a.weight;
                break;
        }
        out[kv.first] = v;
    }
    return out;
}

} // namespace rl::core
