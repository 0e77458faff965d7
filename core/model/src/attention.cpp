#include "attention.hpp"

#include "rl/core/device.hpp"
#include "rl/core/error.hpp"
#include "rl/core/torch_compat.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace rl::core {
namespace {

// Upper bound on the elements of one group's score tensor [n, H, L, L]: keeps
// the padded batch of a group within a few hundred MB.
constexpr int64_t kMaxScoreElements = int64_t{64} << 20;

at::Tensor index_tensor(const std::vector<int64_t> &v, at::Device device) {
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t.to(device);
}

at::Tensor causal_mask(int64_t len, at::Device device) {
    return at::full({len, len}, -std::numeric_limits<double>::infinity(),
                    at::TensorOptions().dtype(at::kFloat).device(device))
        .triu(1);
}

} // namespace

at::Tensor grouped_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                             const at::Tensor &mask, double scale) {
    const int64_t n = q.size(0), heads = q.size(1), q_len = q.size(2), dim = q.size(3);
    const int64_t kv_heads = k.size(1), k_len = k.size(2);
    const int64_t groups = heads / kv_heads;
    // Query heads sharing a key/value head are stacked along the row axis, so
    // keys and values are never repeated.
    at::Tensor qg = q.reshape({n, kv_heads, groups * q_len, dim});
    at::Tensor scores =
        at::matmul(qg, k.transpose(-1, -2)).view({n, kv_heads, groups, q_len, k_len});
    scores = scores * scale;
    // [.., q_len, k_len] masks broadcast over the (kv head, group) axes.
    if (mask.defined()) scores = scores + (mask.dim() == 4 ? mask.unsqueeze(1) : mask);
    at::Tensor probs = q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble
                           ? at::softmax(scores, -1)
                           : at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    at::Tensor out = at::matmul(probs.view({n, kv_heads, groups * q_len, k_len}), v);
    return out.view({n, heads, q_len, dim});
}

at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const at::Tensor &mask, bool is_causal, double scale) {
    if (q.is_cuda()) return compat::sdpa(q, k, v, mask, is_causal, scale);
    return grouped_attention(q, k, v, mask, scale);
}

bool varlen_attention_available(at::Device device, at::ScalarType dtype, int64_t head_dim) {
    return compat::kHasVarlenFlash && device.is_cuda() &&
           (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 8 == 0 && head_dim <= 256 &&
           cuda_capability(device) >= 80;
}

PackedAttentionPlan plan_packed_attention(const std::vector<int64_t> &cu, int64_t heads,
                                          at::Device device, bool varlen) {
    PackedAttentionPlan plan;
    const int64_t num_seqs = static_cast<int64_t>(cu.size()) - 1;
    plan.tokens = cu.empty() ? 0 : cu.back();
    if (varlen) {
        plan.varlen = true;
        for (int64_t s = 0; s < num_seqs; ++s)
            plan.max_len = std::max(plan.max_len, cu[s + 1] - cu[s]);
        plan.cu_seqlens = index_tensor(cu, at::kCPU).to(at::kInt).to(device);
        return plan;
    }
    std::vector<int64_t> order;
    for (int64_t s = 0; s < num_seqs; ++s)
        if (cu[s + 1] > cu[s]) order.push_back(s);
    auto len_of = [&](int64_t s) { return cu[s + 1] - cu[s]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return len_of(a) > len_of(b); });

    // Greedy grouping over sequences by decreasing length: a sequence joins
    // the current group while it is at least 3/4 of the group's length.
    std::vector<std::vector<int64_t>> groups;
    int64_t group_len = 0;
    for (int64_t s : order) {
        const int64_t len = len_of(s);
        const bool fits =
            !groups.empty() && 4 * len >= 3 * group_len &&
            static_cast<int64_t>(groups.back().size() + 1) * heads * group_len * group_len <=
                kMaxScoreElements;
        if (!fits) {
            groups.emplace_back();
            group_len = len;
        }
        groups.back().push_back(s);
    }

    bool identity = groups.size() == 1 && static_cast<int64_t>(groups[0].size()) == num_seqs;
    if (identity) {
        for (int64_t s = 0; s < num_seqs; ++s)
            identity = identity && groups[0][s] == s && len_of(s) == len_of(0);
    }

    std::vector<int64_t> unpermute(static_cast<size_t>(plan.tokens));
    int64_t out_pos = 0;
    for (const auto &members : groups) {
        PackedAttentionPlan::Group g;
        g.n = static_cast<int64_t>(members.size());
        g.len = len_of(members[0]);
        if (!device.is_cuda()) g.mask = causal_mask(g.len, device);
        if (!identity) {
            std::vector<int64_t> gather(static_cast<size_t>(g.n * g.len));
            std::vector<int64_t> valid;
            bool all_full = true;
            for (int64_t r = 0; r < g.n; ++r) {
                const int64_t s = members[r];
                const int64_t len = len_of(s);
                all_full = all_full && len == g.len;
                for (int64_t i = 0; i < g.len; ++i)
                    gather[r * g.len + i] = cu[s] + std::min(i, len - 1);
                for (int64_t i = 0; i < len; ++i) {
                    valid.push_back(r * g.len + i);
                    unpermute[cu[s] + i] = out_pos++;
                }
            }
            g.gather = index_tensor(gather, device);
            if (!all_full) g.valid = index_tensor(valid, device);
        }
        plan.groups.push_back(std::move(g));
    }
    if (!identity) {
        bool trivial = true;
        for (int64_t t = 0; t < plan.tokens && trivial; ++t) trivial = unpermute[t] == t;
        if (!trivial) plan.unpermute = index_tensor(unpermute, device);
    }
    return plan;
}

at::Tensor packed_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            const PackedAttentionPlan &plan, double scale) {
    const int64_t heads = q.size(1), kv_heads = k.size(1), dim = q.size(2);
    if (plan.tokens == 0) return at::empty({0, heads * dim}, q.options());
    if (plan.varlen)
        return compat::varlen_flash_attention(q, k, v, plan.cu_seqlens, plan.max_len, scale)
            .reshape({plan.tokens, heads * dim});
    std::vector<at::Tensor> outs;
    outs.reserve(plan.groups.size());
    for (const auto &g : plan.groups) {
        auto pad = [&](const at::Tensor &x, int64_t h) {
            at::Tensor rows = g.gather.defined() ? x.index_select(0, g.gather) : x;
            return rows.view({g.n, g.len, h, dim}).permute({0, 2, 1, 3});
        };
        at::Tensor qg = pad(q, heads), kg = pad(k, kv_heads), vg = pad(v, kv_heads);
        // Padding sits after each sequence's last token, so the plain causal
        // mask never lets a real token see it.
        at::Tensor o = attend(qg, kg, vg, g.mask, /*is_causal=*/true, scale);
        o = o.transpose(1, 2).reshape({g.n * g.len, heads * dim});
        if (g.valid.defined()) o = o.index_select(0, g.valid);
        outs.push_back(std::move(o));
    }
    at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
    if (plan.unpermute.defined()) out = out.index_select(0, plan.unpermute);
    return out;
}

CachedAttentionPlan plan_cached_attention(const std::vector<int64_t> &slots,
                                          const std::vector<int64_t> &starts,
                                          const std::vector<int64_t> &counts, int64_t kv_heads,
                                          int64_t capacity, at::ScalarType dtype,
                                          at::Device device) {
    CachedAttentionPlan p;
    p.slots = slots;
    p.n = static_cast<int64_t>(slots.size());
    bool consecutive = true;
    std::vector<int64_t> cu(1, 0);
    for (int64_t i = 0; i < p.n; ++i) {
        p.q_len = std::max(p.q_len, counts[i]);
        p.k_len = std::max(p.k_len, starts[i] + counts[i]);
        consecutive = consecutive && slots[i] == slots[0] + i;
        cu.push_back(cu.back() + counts[i]);
    }
    p.first_slot = consecutive && p.n > 0 ? slots[0] : -1;
    p.slot_index = index_tensor(slots, device);

    std::vector<int64_t> write;
    write.reserve(static_cast<size_t>(cu.back() * kv_heads));
    for (int64_t i = 0; i < p.n; ++i)
        for (int64_t j = 0; j < counts[i]; ++j)
            for (int64_t h = 0; h < kv_heads; ++h)
                write.push_back((slots[i] * kv_heads + h) * capacity + starts[i] + j);
    p.write_index = index_tensor(write, device);

    bool uniform = true;
    for (int64_t i = 0; i < p.n; ++i) uniform = uniform && counts[i] == p.q_len;
    if (!uniform) {
        std::vector<int64_t> gather(static_cast<size_t>(p.n * p.q_len));
        std::vector<int64_t> valid;
        for (int64_t i = 0; i < p.n; ++i) {
            for (int64_t r = 0; r < p.q_len; ++r)
                gather[i * p.q_len + r] = cu[i] + std::min(r, counts[i] - 1);
            for (int64_t j = 0; j < counts[i]; ++j) valid.push_back(i * p.q_len + j);
        }
        p.gather = index_tensor(gather, device);
        p.valid = index_tensor(valid, device);
    }

    // Query row r of chunk i sits at position starts[i] + r and sees keys up
    // to there; padded rows repeat the chunk's last position, so no row reads
    // past what the slot holds.
    // One token per slot with every slot equally long (the common decode
    // step) needs no mask, which keeps the fused kernels available.
    bool all_visible = p.q_len == 1;
    for (int64_t i = 0; i < p.n && all_visible; ++i) all_visible = starts[i] + counts[i] == p.k_len;
    if (all_visible) return p;
    at::Tensor mask = at::empty({p.n, 1, p.q_len, p.k_len}, at::kFloat);
    float *m = mask.data_ptr<float>();
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < p.n; ++i) {
        for (int64_t r = 0; r < p.q_len; ++r) {
            const int64_t last = starts[i] + std::min(r, counts[i] - 1);
            float *row = m + (i * p.q_len + r) * p.k_len;
            for (int64_t j = 0; j < p.k_len; ++j) row[j] = j <= last ? 0.0f : neg_inf;
        }
    }
    p.mask = mask.to(at::TensorOptions().dtype(dtype).device(device));
    return p;
}

at::Tensor cached_attention(const at::Tensor &q, const at::Tensor &k_new, const at::Tensor &v_new,
                            at::Tensor &cache_k, at::Tensor &cache_v,
                            const CachedAttentionPlan &plan, double scale) {
    const int64_t heads = q.size(1), dim = q.size(2);
    cache_k.view({-1, dim}).index_copy_(0, plan.write_index, k_new.reshape({-1, dim}));
    cache_v.view({-1, dim}).index_copy_(0, plan.write_index, v_new.reshape({-1, dim}));
    auto slot_rows = [&](const at::Tensor &cache) {
        at::Tensor c = cache.narrow(2, 0, plan.k_len);
        return plan.first_slot >= 0 ? c.narrow(0, plan.first_slot, plan.n)
                                    : c.index_select(0, plan.slot_index);
    };
    at::Tensor keys = slot_rows(cache_k), values = slot_rows(cache_v);
    at::Tensor rows = plan.gather.defined() ? q.index_select(0, plan.gather) : q;
    at::Tensor qp = rows.view({plan.n, plan.q_len, heads, dim}).permute({0, 2, 1, 3});
    at::Tensor o = attend(qp, keys, values, plan.mask, /*is_causal=*/false, scale);
    o = o.transpose(1, 2).reshape({plan.n * plan.q_len, heads * dim});
    if (plan.valid.defined()) o = o.index_select(0, plan.valid);
    return o;
}

} // namespace rl::core
