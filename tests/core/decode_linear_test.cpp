// The row kernel of decoding (core/model/src/decode_linear.hpp): x W^T for a
// few rows on the CPU, against at::linear on every shape class the kernel
// splits (row groups of 3 / 2 / 1, tiles of 4 / 3 / 2 / 1 outputs, K not a
// multiple of 8, strided weight rows), the same bits at any thread count, and
// the cases that must fall back to libtorch.
#include "decode_linear.hpp" // core/model/src
#include "row_gemm.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace rl::core {
namespace {

// |got - want| within a few float32 roundings of the sum of |terms|: the
// kernel adds in another order than the BLAS, never less accurately.
void expect_close(const at::Tensor &got, const at::Tensor &x, const at::Tensor &w,
                  const std::string &what) {
    const at::Tensor want = at::linear(x.to(at::kDouble), w.to(at::kDouble));
    const at::Tensor bound = at::linear(x.abs().to(at::kDouble), w.abs().to(at::kDouble));
    const at::Tensor err = (got.to(at::kDouble) - want).abs() - bound * 1e-6;
    EXPECT_LE(err.max().item<double>(), 1e-30) << what;
}

TEST(DecodeLinear, MatchesTheProductOnEveryTileShape) {
    if (!row_gemm::available()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
    at::NoGradGuard no_grad;
    at::manual_seed(3);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 16, 17, 63, 64}) {
        for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{
                 {1, 1}, {7, 3}, {8, 4}, {9, 5}, {17, 6}, {64, 7}, {256, 259}, {513, 130}}) {
            const at::Tensor x = at::randn({M, K}), w = at::randn({N, K});
            ASSERT_TRUE(decode_linear_applies(x, w));
            const at::Tensor y = decode_linear(x, w, at::Tensor());
            ASSERT_EQ(y.sizes(), (std::vector<int64_t>{M, N}));
            expect_close(y, x, w,
                         "M=" + std::to_string(M) + " K=" + std::to_string(K) +
                             " N=" + std::to_string(N));
        }
    }
}

// Each instruction-set path of the kernel on its own (decode_linear takes the
// preferred one): every tile and row-group shape, K around both vector
// widths, against float64; and any split of the N outputs gives the same bits
// as one call over all of them.
class RowGemmPath : public ::testing::TestWithParam<row_gemm::Isa> {
protected:
    void SetUp() override {
        if (!row_gemm::available(GetParam()))
            GTEST_SKIP() << "this CPU has no "
                         << (GetParam() == row_gemm::Isa::Avx512 ? "AVX-512F" : "AVX2 + FMA");
    }
    static at::Tensor product(row_gemm::Isa isa, const at::Tensor &x, const at::Tensor &w,
                              const std::vector<int64_t> &cuts) {
        const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
        at::Tensor y = at::full({M, N}, std::numeric_limits<float>::quiet_NaN());
        for (size_t i = 0; i + 1 < cuts.size(); ++i)
            row_gemm::multiply(isa, x.data_ptr<float>(), K, w.data_ptr<float>(), K,
                               y.data_ptr<float>(), N, M, K, cuts[i], cuts[i + 1]);
        return y;
    }
};

TEST_P(RowGemmPath, MatchesTheProductOnEveryTileShapeAndAnySplit) {
    at::manual_seed(6);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 63, 64}) {
        for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{1, 1},
                                                                    {7, 3},
                                                                    {8, 4},
                                                                    {15, 5},
                                                                    {16, 6},
                                                                    {17, 7},
                                                                    {33, 9},
                                                                    {256, 259},
                                                                    {513, 130}}) {
            const std::string what =
                "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
            const at::Tensor x = at::randn({M, K}), w = at::randn({N, K});
            const at::Tensor whole = product(GetParam(), x, w, {0, N});
            expect_close(whole, x, w, what);
            const at::Tensor split = product(GetParam(), x, w, {0, N / 3, N / 2 + 1, N});
            EXPECT_TRUE(at::equal(whole, split)) << what;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Isa, RowGemmPath,
                         ::testing::Values(row_gemm::Isa::Avx2, row_gemm::Isa::Avx512),
                         [](const ::testing::TestParamInfo<row_gemm::Isa> &i) {
                             return std::string(i.param == row_gemm::Isa::Avx512 ? "Avx512"
                                                                                 : "Avx2");
                         });

TEST(DecodeLinear, KeepsLeadingDimensionsAddsTheBiasAndReadsStridedWeightRows) {
    if (!row_gemm::available()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
    at::NoGradGuard no_grad;
    at::manual_seed(4);
    // Rows of a wider matrix (row stride 100 > K = 37), as a narrowed slice.
    const at::Tensor wide = at::randn({50, 100});
    const at::Tensor w = wide.narrow(1, 10, 37);
    ASSERT_EQ(w.stride(0), 100);
    const at::Tensor x = at::randn({2, 3, 37}), b = at::randn({50});
    ASSERT_TRUE(decode_linear_applies(x, w));
    const at::Tensor y = decode_linear(x, w, b);
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 50}));
    expect_close(y - b, x, w, "strided");
    // A non-contiguous x (a transposed view) is read through a copy.
    const at::Tensor xt = at::randn({37, 4}).t();
    expect_close(decode_linear(xt, w, at::Tensor()), xt, w, "transposed x");
}

TEST(DecodeLinear, GivesTheSameBitsAtAnyThreadCount) {
    if (!row_gemm::available()) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
    at::NoGradGuard no_grad;
    at::manual_seed(5);
    // Large enough to be split across threads (>= 2^20 multiply-adds).
    const at::Tensor x = at::randn({16, 512}), w = at::randn({1030, 512});
    const int before = at::get_num_threads();
    at::set_num_threads(1);
    const at::Tensor one = decode_linear(x, w, at::Tensor());
    at::set_num_threads(2);
    const at::Tensor two = decode_linear(x, w, at::Tensor());
    at::set_num_threads(4);
    const at::Tensor four = decode_linear(x, w, at::Tensor());
    at::set_num_threads(before);
    EXPECT_TRUE(at::equal(one, two));
    EXPECT_TRUE(at::equal(one, four));
    expect_close(one, x, w, "threads");
}

TEST(DecodeLinear, FallsBackToLibtorchWhereTheKernelDoesNotApply) {
    at::manual_seed(6);
    const at::Tensor w = at::randn({8, 16});
    // Too many rows, another dtype, a column-strided weight, a gradient to record.
    EXPECT_FALSE(decode_linear_applies(at::randn({row_gemm::kMaxRows + 1, 16}), w));
    EXPECT_FALSE(decode_linear_applies(at::randn({2, 16}).to(at::kDouble), w.to(at::kDouble)));
    EXPECT_FALSE(decode_linear_applies(at::randn({2, 16}), at::randn({16, 8}).t()));
    const at::Tensor wg = w.clone().requires_grad_(true);
    EXPECT_FALSE(decode_linear_applies(at::randn({2, 16}), wg));
    {
        at::NoGradGuard no_grad;
        EXPECT_EQ(decode_linear_applies(at::randn({2, 16}), wg), row_gemm::available());
    }
    // The fallback is at::linear itself, gradient included.
    const at::Tensor x = at::randn({3, 16});
    at::Tensor y = decode_linear(x, wg, at::Tensor());
    y.sum().backward();
    EXPECT_TRUE(at::allclose(wg.grad(), x.sum(0).expand({8, 16})));
}

} // namespace
} // namespace rl::core
