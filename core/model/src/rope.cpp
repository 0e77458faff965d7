#include "rope.hpp"

#include "fused_ops.hpp"

#include <ATen/ATen.h>

#include <cmath>

namespace rl::core {

RotaryEmbedding::RotaryEmbedding(const ModelConfig &c) {
    const int64_t dim = c.head_dim;
    // inv_freq = 1 / theta^(2i / dim), in fp32 like transformers.
    at::Tensor exponent =
        at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
    at::Tensor inv = 1.0 / at::pow(c.rope_theta, exponent);
    switch (c.rope_scaling) {
        case RopeScaling::None:
            break;
        case RopeScaling::Linear:
            inv = inv / c.rope_factor;
            break;
        case RopeScaling::Llama3: {
            const double old_ctx = static_cast<double>(c.rope_original_max_position_embeddings);
            const double low_wavelen = old_ctx / c.rope_low_freq_factor;
            const double high_wavelen = old_ctx / c.rope_high_freq_factor;
            at::Tensor wavelen = 2 * M_PI / inv;
            // Long wavelengths (low frequencies) are divided by the factor,
            // short ones kept, and the band between interpolates smoothly.
            at::Tensor scaled = at::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
            at::Tensor smooth = (old_ctx / wavelen - c.rope_low_freq_factor) /
                                (c.rope_high_freq_factor - c.rope_low_freq_factor);
            at::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
            at::Tensor medium = at::logical_not(wavelen < high_wavelen)
                                    .logical_and(at::logical_not(wavelen > low_wavelen));
            inv = at::where(medium, smoothed, scaled);
            break;
        }
    }
    inv_freq_ = inv.contiguous();
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor &position_ids,
                                                           at::ScalarType dtype) const {
    at::Tensor inv = inv_freq_.to(position_ids.device());
    at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(1) * inv.unsqueeze(0);
    at::Tensor cos = freqs.cos(), sin = freqs.sin();
    if (position_ids.is_cuda())
        return {at::cat({cos, cos}, -1).to(dtype), at::cat({-sin, sin}, -1).to(dtype)};
    return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor RotaryEmbedding::apply(const at::Tensor &x, const at::Tensor &cos,
                                  const at::Tensor &sin) {
    const int64_t half = x.size(-1) / 2;
    at::Tensor x1 = x.narrow(-1, 0, half);
    at::Tensor x2 = x.narrow(-1, half, half);
    at::Tensor c = cos.unsqueeze(1);
    at::Tensor s = sin.unsqueeze(1);
    // Full-width tables: [x1 | x2] * [cos | cos] + [x2 | x1] * [-sin | sin]
    // is the same rotation (x1 cos - x2 sin | x2 cos + x1 sin).
    if (cos.size(-1) == x.size(-1)) return at::addcmul(x * c, at::cat({x2, x1}, -1), s);
    return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::apply(const at::Tensor &q, const at::Tensor &k,
                                                         const at::Tensor &cos,
                                                         const at::Tensor &sin) {
    if (fused::applies(q) && cos.size(-1) == q.size(-1) && k.scalar_type() == q.scalar_type())
        return fused::rope(q, k, cos, sin);
    return {apply(q, cos, sin), apply(k, cos, sin)};
}

} // namespace rl::core
