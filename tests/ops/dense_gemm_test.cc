// dense_gemm against a double-precision triple loop for every transpose combination the dense
// layers use, with a bias and without, padded leading dimensions (padding is NaN, so reading it
// shows; C's padding must stay untouched), shapes that leave partial row tiles (of 6) and column
// panels (of 16), an inner dimension long enough to run in slices, a B large enough to be packed
// slice by slice (the column sums carried over the slices), and shapes below the size at
// which dense_gemm hands the product to OpenBLAS; B's column sums bitwise equal to
// ops::column_sum's. Then: the same bits for one thread and two, and, above the hand-off, the
// bits of the order the header promises (each slice's terms by one FMA each in increasing l, the
// bias after the first slice, each later slice's sum added to C), which the AVX2 and the AVX-512
// tiles must both reproduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::ops {
namespace {

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  bool bias;
};

struct Result {
  std::vector<float> c, sums;
  int64_t ldc;
  std::vector<float> exact;  // C in the promised order of operations (m · n), above the hand-off
};

// dense_gemm's hand-off to OpenBLAS and its inner slice (src/ops/panel_gemm.cc).
constexpr int64_t kMinWork = int64_t{1} << 20;
int64_t slice_of(int64_t k) { return k <= 512 ? std::max<int64_t>(k, 1) : 256; }

Result run(const Case& t, bool check) {
  SCOPED_TRACE(testing::Message() << "ta " << t.ta << " tb " << t.tb << " m " << t.m << " n " << t.n
                                  << " k " << t.k << " bias " << t.bias);
  Philox rng(
      static_cast<uint64_t>(t.m * 10007 + t.n * 101 + t.k + (t.ta ? 7 : 0) + (t.tb ? 13 : 0)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t lda = (t.ta ? t.m : t.k) + 3, ldb = (t.tb ? t.k : t.n) + 5, ldc = t.n + 2;
  std::vector<float> a((t.ta ? t.k : t.m) * lda, nan), b((t.tb ? t.n : t.k) * ldb, nan);
  std::vector<float> bias(t.n), c(t.m * ldc, -7.0f);
  auto a_at = [&](int64_t i, int64_t l) -> float& {
    return t.ta ? a[l * lda + i] : a[i * lda + l];
  };
  auto b_at = [&](int64_t l, int64_t j) -> float& {
    return t.tb ? b[j * ldb + l] : b[l * ldb + j];
  };
  for (int64_t i = 0; i < t.m; ++i) {
    for (int64_t l = 0; l < t.k; ++l) a_at(i, l) = rng.uniform() - 0.5f;
  }
  for (int64_t l = 0; l < t.k; ++l) {
    for (int64_t j = 0; j < t.n; ++j) b_at(l, j) = rng.uniform() - 0.5f;
  }
  for (float& v : bias) v = rng.uniform() - 0.5f;
  // Without trans_b, B's column sums too (a dense layer's bias gradient), NaN until written.
  std::vector<float> sums(t.tb ? 0 : t.n, nan);
  dense_gemm(t.ta, t.tb, t.m, t.n, t.k, a.data(), lda, b.data(), ldb,
             t.bias ? bias.data() : nullptr, c.data(), ldc, t.tb ? nullptr : sums.data());
  if (check && !t.tb) {
    // The same float sums, in the same order, as ops::column_sum: bitwise.
    for (int64_t j = 0; j < t.n; ++j) {
      float want = 0.0f;
      for (int64_t l = 0; l < t.k; ++l) want += b_at(l, j);
      EXPECT_EQ(std::memcmp(&sums[j], &want, sizeof(float)), 0)
          << "column sum " << j << " = " << sums[j] << ", want " << want;
    }
  }
  if (check) {
    // A float sum of k products (plus the bias) is within (k + 2)·2⁻²⁴·Σ|terms| of the exact
    // one, whatever the order (a worst-case bound, so it cannot fail on rounding alone).
    const double eps = std::ldexp(1.0, -24);
    int64_t bad = 0;
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        double want = t.bias ? bias[j] : 0.0, mass = std::fabs(want);
        for (int64_t l = 0; l < t.k; ++l) {
          const double term = static_cast<double>(a_at(i, l)) * b_at(l, j);
          want += term;
          mass += std::fabs(term);
        }
        const double got = c[i * ldc + j];
        if (!(std::fabs(got - want) <= static_cast<double>(t.k + 2) * eps * mass) && bad++ < 5) {
          ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got << ", want " << want;
        }
      }
      for (int64_t j = t.n; j < ldc; ++j) {
        if (c[i * ldc + j] != -7.0f && bad++ < 5) {
          ADD_FAILURE() << "padding C(" << i << ", " << j << ") was written";
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
  std::vector<float> exact;
  if (t.m * t.n * std::max<int64_t>(t.k, 1) >= kMinWork) {
    exact.resize(t.m * t.n);
    const int64_t slice = slice_of(t.k);
    for (int64_t i = 0; i < t.m; ++i) {
      for (int64_t j = 0; j < t.n; ++j) {
        float ci = 0.0f;
        for (int64_t l0 = 0; l0 < std::max<int64_t>(t.k, 1); l0 += slice) {
          float acc = 0.0f;
          for (int64_t l = l0; l < std::min(t.k, l0 + slice); ++l) {
            acc = std::fma(a_at(i, l), b_at(l, j), acc);
          }
          ci = l0 == 0 ? (t.bias ? acc + bias[j] : acc) : ci + acc;
        }
        exact[i * t.n + j] = ci;
      }
    }
  }
  return {std::move(c), std::move(sums), ldc, std::move(exact)};
}

const Case kCases[] = {
    // The GPT's shapes in miniature (above the OpenBLAS hand-off), partial tiles and panels.
    {false, false, 1030, 113, 128, true},
    {false, false, 1027, 64, 100, false},
    {false, true, 1031, 37, 512, false},
    {false, true, 700, 128, 113, true},
    {true, false, 128, 113, 1100, false},  // k in slices, the last one partial
    {true, false, 61, 16, 2048, false},
    // op(B) large enough to be packed one inner slice at a time (dW = xᵀ·dz), the column sums
    // continued over the slices; a partial last panel and slice; with a bias and Aᵀ stored.
    {true, false, 61, 300, 1100, false},
    {false, false, 40, 130, 2100, true},
    {true, true, 30, 520, 600, false},
    {true, false, 70, 400, 1300, false},  // enough panels that two threads split them
    {false, false, 5, 300, 1200, true},   // fewer rows than a tile
    {true, true, 200, 50, 300, true},
    {false, false, 4, 7, 0, true},  // k = 0: the bias alone
    // Below the hand-off: OpenBLAS (with the bias broadcast first).
    {false, false, 9, 17, 5, true},
    {true, false, 16, 16, 32, false},
};

TEST(DenseGemm, MatchesADoubleReferenceAndLeavesPaddingAlone) {
  for (const Case& t : kCases) run(t, true);
}

TEST(DenseGemm, EveryElementInThePromisedOrderOfOperations) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Case& t : kCases) {
      const Result r = run(t, false);
      if (r.exact.empty()) continue;  // OpenBLAS's product
      int64_t bad = 0;
      for (int64_t i = 0; i < t.m; ++i) {
        for (int64_t j = 0; j < t.n; ++j) {
          const float got = r.c[i * r.ldc + j], want = r.exact[i * t.n + j];
          if (std::memcmp(&got, &want, sizeof(float)) != 0 && bad++ < 5) {
            ADD_FAILURE() << "ta " << t.ta << " tb " << t.tb << " m " << t.m << " n " << t.n
                          << " k " << t.k << ": C(" << i << ", " << j << ") = " << got << ", want "
                          << want;
          }
        }
      }
      EXPECT_EQ(bad, 0) << threads << " thread(s)";
    }
  }
  set_num_threads(1);
}

TEST(DenseGemm, SameBitsForOneThreadAndTwo) {
  for (const Case& t : kCases) {
    set_num_threads(1);
    const Result one = run(t, false);
    set_num_threads(2);
    const Result two = run(t, false);
    set_num_threads(1);
    ASSERT_EQ(one.c.size(), two.c.size());
    EXPECT_EQ(std::memcmp(one.c.data(), two.c.data(), one.c.size() * sizeof(float)), 0)
        << "m " << t.m << " n " << t.n << " k " << t.k;
    EXPECT_EQ(one.sums, two.sums) << "m " << t.m << " n " << t.n << " k " << t.k;
  }
}

}  // namespace
}  // namespace dtrain::ops
