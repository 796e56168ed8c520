// small_gemm against a double-precision triple loop, for every causal part, both ways of
// reading A (row-major and transposed), and shapes that leave partial row blocks (of 6) and
// column chunks (of 16, and the AVX-512 blocks' 12 rows and pairs of chunks). Entries the causal
// part must not read are NaN, so reading one shows. Every C(i, j) must also have the bits of its
// terms added by one FMA each in increasing l, the order the header promises, whichever
// instruction set the build targets.
#include "dtrain/ops/small_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dtrain/core/random.h"

namespace dtrain::ops {
namespace {

void check(int64_t m, int64_t n, int64_t k, bool transpose_a, CausalPart part,
           bool accumulate = false) {
  SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k << " transposed "
                                  << transpose_a << " part " << static_cast<int>(part)
                                  << " accumulate " << accumulate);
  Philox rng(static_cast<uint64_t>(m * 10007 + n * 101 + k));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A with a padded leading dimension (stored [m, k] or, transposed, [k, m]).
  const int64_t lda = (transpose_a ? m : k) + 3, ldb = n + 5, ldc = n + 2;
  std::vector<float> a((transpose_a ? k : m) * lda, nan), b(k * ldb, nan), c(m * ldc, -7.0f);
  auto a_at = [&](int64_t i, int64_t l) -> float& {
    return transpose_a ? a[l * lda + i] : a[i * lda + l];
  };
  auto read = [&](int64_t i, int64_t l) {
    if (part == CausalPart::kInnerUpToRow) return l <= i;
    if (part == CausalPart::kInnerFromRow) return l >= i;
    return true;
  };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      if (read(i, l)) a_at(i, l) = static_cast<float>(rng.uniform() * 2 - 1);
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j) b[l * ldb + j] = static_cast<float>(rng.uniform() * 2 - 1);
  small_gemm({.m = m,
              .n = n,
              .k = k,
              .a = a.data(),
              .a_row_stride = transpose_a ? 1 : lda,
              .a_inner_stride = transpose_a ? lda : 1,
              .b = b.data(),
              .ldb = ldb,
              .c = c.data(),
              .ldc = ldc,
              .causal = part,
              .accumulate = accumulate});
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = accumulate ? -7.0 : 0.0;  // C's initial value, added to
      if (part != CausalPart::kColumnsUpToRow || j <= i) {
        for (int64_t l = 0; l < k; ++l)
          if (read(i, l)) want += static_cast<double>(a_at(i, l)) * b[l * ldb + j];
      }
      ASSERT_NEAR(c[i * ldc + j], want, 1e-5 * (1 + std::sqrt(static_cast<double>(k))))
          << "C(" << i << ", " << j << ")";
      float exact = accumulate ? -7.0f : 0.0f;
      if (part != CausalPart::kColumnsUpToRow || j <= i) {
        for (int64_t l = 0; l < k; ++l)
          if (read(i, l)) exact = std::fma(a_at(i, l), b[l * ldb + j], exact);
      }
      ASSERT_EQ(c[i * ldc + j], exact) << "C(" << i << ", " << j << ") not in the promised order";
    }
    for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], -7.0f) << "wrote past n";
  }
}

TEST(SmallGemm, MatchesATripleLoopForEveryCausalPart) {
  for (CausalPart part : {CausalPart::kNone, CausalPart::kColumnsUpToRow, CausalPart::kInnerUpToRow,
                          CausalPart::kInnerFromRow}) {
    for (bool transpose_a : {false, true}) {
      for (int64_t size : {1, 5, 6, 7, 16, 17, 33, 40}) {
        check(size, size, size, transpose_a, part);  // square: positions of one sequence
      }
      check(37, 32, 37, transpose_a, part);  // the attention shapes: T × H over T ...
      check(37, 37, 32, transpose_a, part);  // ... and T × T over H
      check(9, 20, 3, transpose_a, part);    // non-square (the causal part by index)
      check(48, 48, 48, transpose_a, part);  // the fused attention's blocks
      check(30, 50, 25, transpose_a, part);  // 12-row blocks and a partial one, 3 chunks + tail
      if (part != CausalPart::kColumnsUpToRow) {
        for (int64_t size : {1, 7, 17, 40}) check(size, size, size, transpose_a, part, true);
        check(37, 32, 37, transpose_a, part, true);
      }
    }
  }
}

TEST(SmallGemm, EmptyProductsWriteZerosOrNothing) {
  std::vector<float> c(6, 5.0f);
  std::vector<float> a(1, 1.0f), b(1, 1.0f);
  small_gemm({.m = 2,
              .n = 3,
              .k = 0,
              .a = a.data(),
              .a_row_stride = 0,
              .b = b.data(),
              .ldb = 3,
              .c = c.data(),
              .ldc = 3});
  for (float v : c) EXPECT_EQ(v, 0.0f);
  small_gemm({.m = 0, .n = 3, .k = 4, .a = nullptr, .b = nullptr, .ldb = 3, .c = nullptr});
}

}  // namespace
}  // namespace dtrain::ops
