#include "rl/core/sampling.hpp"

#include "rl/core/policy.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace rl::core {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string &msg) {
    throw Error(ErrorKind::InvalidArgument, "sampling params: " + msg);
}

int64_t integer(const json &v, const std::string &key) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
        const double x = v.get<double>();
        if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15)
            return static_cast<int64_t>(x);
    }
    bad(key + " must be an integer, got " + v.dump());
}

double number(const json &v, const std::string &key) {
    if (!v.is_number()) bad(key + " must be a number, got " + v.dump());
    return v.get<double>();
}

} // namespace

SamplingParams SamplingParams::from_json(const std::string &text) {
    SamplingParams p;
    if (text.empty()) return p;
    const json j = rl::core::parse_json_or_discarded(text);
    if (j.is_discarded()) bad("not valid JSON");
    if (j.is_null()) return p;
    if (!j.is_object()) bad("must be a JSON object");
    for (const auto &kv : j.items()) {
        const std::string &k = kv.key();
        const json &v = kv.value();
        if (k == "n") {
            p.n = integer(v, k);
        } else if (k == "temperature") {
            p.temperature = number(v, k);
        } else if (k == "top_p") {
            p.top_p = number(v, k);
        } else if (k == "top_k") {
            p.top_k = integer(v, k);
        } else if (k == "seed") {
            if (v.is_null()) continue;
            const int64_t s = integer(v, k);
            if (s < 0) bad("seed must be >= 0, got " + std::to_string(s));
            p.seed = static_cast<uint64_t>(s);
        } else if (k == "max_tokens") {
            p.max_tokens = integer(v, k);
        } else if (k == "stop") {
            if (v.is_string()) {
                p.stop = {v.get<std::string>()};
            } else {
                if (!v.is_array()) bad("stop must be a list of strings");
                for (size_t i = 0; i < v.size(); ++i) {
                    if (!v[i].is_string())
                        bad("stop[" + std::to_string(i) + "] must be a string, got " + v[i].dump());
                    p.stop.push_back(v[i].get<std::string>());
                }
            }
        } else if (k == "stop_token_ids") {
            if (!v.is_array()) bad("stop_token_ids must be a list of token ids");
            std::vector<int64_t> ids;
            for (size_t i = 0; i < v.size(); ++i)
                ids.push_back(integer(v[i], "stop_token_ids[" + std::to_string(i) + "]"));
            p.stop_token_ids = ids;
        } else if (k == "adapter") {
            if (!v.is_string() && !v.is_null())
                bad("adapter must be the name of a LoRA adapter of the model, got " + v.dump());
            p.adapter = v.is_string() ? v.get<std::string>() : "";
        } else if (k == "return_routed_experts") {
            if (!v.is_boolean())
                bad("return_routed_experts must be true or false, got " + v.dump());
            p.return_routed_experts = v.get<bool>();
        } else if (k == "return_expert_logits") {
            if (!v.is_boolean()) bad("return_expert_logits must be true or false, got " + v.dump());
            p.return_expert_logits = v.get<bool>();
        } else {
            bad("unknown key '" + k +
                "'; valid: n, temperature, top_p, top_k, seed, max_tokens, stop, stop_token_ids, "
                "adapter, return_routed_experts, return_expert_logits");
        }
    }
    p.validate();
    return p;
}

void SamplingParams::validate() const {
    if (n < 1) bad("n must be >= 1, got " + std::to_string(n));
    if (!(temperature >= 0) || !std::isfinite(temperature))
        bad("temperature must be a finite number >= 0 (0: greedy), got " +
            json(temperature).dump());
    if (!(top_p > 0 && top_p <= 1)) bad("top_p must be in (0, 1], got " + json(top_p).dump());
    if (top_k < 0) bad("top_k must be >= 0 (0: off), got " + std::to_string(top_k));
    if (max_tokens < 1) bad("max_tokens must be >= 1, got " + std::to_string(max_tokens));
    for (size_t i = 0; i < stop.size(); ++i)
        if (stop[i].empty()) bad("stop[" + std::to_string(i) + "] is an empty string");
    if (return_expert_logits && !return_routed_experts)
        bad("return_expert_logits records the weights of the routed experts: it needs "
            "return_routed_experts");
}

double sampling_uniform(uint64_t seed, int64_t prompt, int64_t sample, int64_t position) {
    uint64_t x = mix64(seed);
    x = mix64(x ^ static_cast<uint64_t>(prompt));
    x = mix64(x ^ static_cast<uint64_t>(sample));
    x = mix64(x ^ static_cast<uint64_t>(position));
    return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0); // 53 bits
}

at::Tensor sampling_logprobs(const at::Tensor &logits, const SamplingParams &p) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    at::Tensor z = logits.to(at::kFloat);
    const int64_t vocab = z.size(1);
    if (p.greedy()) {
        at::Tensor out = at::full_like(z, neg_inf);
        out.scatter_(1, z.argmax(1, /*keepdim=*/true), 0.0);
        return out;
    }
    if (p.temperature != 1.0) z = z / p.temperature;
    if (p.top_k > 0 && p.top_k < vocab) {
        auto top = z.topk(p.top_k, 1);
        at::Tensor kept = at::full_like(z, neg_inf);
        kept.scatter_(1, std::get<1>(top), std::get<0>(top));
        z = kept;
    }
    if (p.top_p < 1.0) {
        auto sorted = z.sort(1, /*descending=*/true);
        at::Tensor sz = std::get<0>(sorted), idx = std::get<1>(sorted);
        at::Tensor probs = at::softmax(sz, 1);
        at::Tensor before = probs.cumsum(1) - probs; // mass of the tokens ranked above
        sz = sz.masked_fill(before >= p.top_p, neg_inf);
        at::Tensor kept = at::full_like(z, neg_inf);
        kept.scatter_(1, idx, sz);
        z = kept;
    }
    return at::log_softmax(z, 1);
}

// The first token whose cumulative probability exceeds u * total, as the
// host loop of draw_tokens finds it.
std::vector<std::pair<int64_t, float>> draw_tokens_batched(const at::Tensor &logprobs,
                                                           const std::vector<double> &u) {
    check(static_cast<int64_t>(u.size()) == logprobs.size(0), "draw_tokens: one uniform per row");
    const int64_t rows = logprobs.size(0), vocab = logprobs.size(1);
    at::Tensor lp = logprobs.to(at::kFloat);
    at::Tensor cdf = lp.exp().to(at::kDouble).cumsum(1);
    at::Tensor total = cdf.narrow(1, vocab - 1, 1);
    at::Tensor uu = at::empty({rows, 1}, at::kDouble);
    std::copy(u.begin(), u.end(), uu.data_ptr<double>());
    at::Tensor pick = at::searchsorted(cdf, uu.to(lp.device()) * total, /*out_int32=*/false,
                                       /*right=*/true)
                          .clamp_max(vocab - 1);
    // Rounding can leave u * total at the very end: step back to the last
    // token with probability.
    at::Tensor positive = lp.gt(-std::numeric_limits<float>::infinity());
    at::Tensor last =
        (positive.to(at::kLong) * at::arange(1, vocab + 1, lp.options().dtype(at::kLong)))
            .argmax(1, /*keepdim=*/true);
    pick = at::where(positive.gather(1, pick), pick, last);
    at::Tensor picked_lp = lp.gather(1, pick);
    at::Tensor host = at::cat({pick.to(at::kDouble), picked_lp.to(at::kDouble), total}, 1)
                          .to(at::kCPU)
                          .contiguous();
    const double *h = host.data_ptr<double>();
    std::vector<std::pair<int64_t, float>> out;
    out.reserve(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        check(h[r * 3 + 2] > 0, "sampling: the distribution is empty (non-finite logits?)");
        out.emplace_back(static_cast<int64_t>(h[r * 3]), static_cast<float>(h[r * 3 + 1]));
    }
    return out;
}

std::vector<std::pair<int64_t, float>> draw_tokens(const at::Tensor &logprobs,
                                                   const std::vector<double> &u) {
    check(static_cast<int64_t>(u.size()) == logprobs.size(0), "draw_tokens: one uniform per row");
    if (!logprobs.is_cpu()) return draw_tokens_batched(logprobs, u);
    at::Tensor lp = logprobs.to(at::kFloat).contiguous();
    at::Tensor pr = lp.exp();
    const int64_t rows = lp.size(0), vocab = lp.size(1);
    check(static_cast<int64_t>(u.size()) == rows, "draw_tokens: one uniform per row");
    const float *l = lp.data_ptr<float>();
    const float *q = pr.data_ptr<float>();
    std::vector<std::pair<int64_t, float>> out;
    out.reserve(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const float *pl = l + r * vocab;
        const float *pq = q + r * vocab;
        double total = 0;
        int64_t last = -1;
        for (int64_t v = 0; v < vocab; ++v) {
            total += pq[v];
            if (pq[v] > 0) last = v;
        }
        check(last >= 0, "sampling: the distribution is empty (non-finite logits?)");
        const double target = u[static_cast<size_t>(r)] * total;
        double acc = 0;
        int64_t pick = last;
        for (int64_t v = 0; v < vocab; ++v) {
            if (pq[v] <= 0) continue;
            acc += pq[v];
            if (acc > target) {
                pick = v;
                break;
            }
        }
        out.emplace_back(pick, pl[pick]);
    }
    return out;
}

} // namespace rl::core
