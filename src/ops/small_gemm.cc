// The small causal GEMM (dtrain/ops/small_gemm.h): rows in blocks of up to 6, columns in
// chunks of 16, the inner loop split where the causal part starts and ends so that only the
// diagonal's few steps test each row's range.
#include "dtrain/ops/small_gemm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "dtrain/core/error.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DTRAIN_SMALL_GEMM_AVX2 1
#if defined(__AVX512F__)
// With AVX-512: blocks of 12 rows, two chunks (32 columns) at a time in 24 of the 32 registers.
// Every C(i, j) takes the same FMAs in the same order as in the AVX2 blocks, so the bits are the
// same.
#define DTRAIN_SMALL_GEMM_AVX512 1
#endif
#endif

namespace dtrain::ops {
namespace {

#if DTRAIN_SMALL_GEMM_AVX512
constexpr int kRows = 12;  // rows per block
#else
constexpr int kRows = 6;
#endif
constexpr int kCols = 16;  // columns per chunk (two 8-float registers, or one 16-float one)

// The inner range [lo, hi) that row i sums over.
void inner_range(const SmallGemmArgs& g, int64_t i, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = g.k;
  if (g.causal == CausalPart::kInnerUpToRow) *hi = std::min(i + 1, g.k);
  if (g.causal == CausalPart::kInnerFromRow) *lo = std::min(i, g.k);
}

// The row block's inner ranges, their union [lo, hi) and the part [f0, f1) every row sums
// (lo ≤ f0 ≤ f1 ≤ hi).
struct BlockRanges {
  int64_t row_lo[kRows], row_hi[kRows];
  int64_t lo, f0, f1, hi;
};

BlockRanges block_ranges(const SmallGemmArgs& g, int64_t i0, int rows) {
  BlockRanges r{};
  int64_t max_lo = 0, min_hi = g.k;
  r.lo = g.k;
  r.hi = 0;
  for (int q = 0; q < rows; ++q) {
    inner_range(g, i0 + q, &r.row_lo[q], &r.row_hi[q]);
    r.lo = std::min(r.lo, r.row_lo[q]);
    r.hi = std::max(r.hi, r.row_hi[q]);
    max_lo = std::max(max_lo, r.row_lo[q]);
    min_hi = std::min(min_hi, r.row_hi[q]);
  }
  if (r.lo > r.hi) r.lo = r.hi;
  r.f0 = std::clamp(max_lo, r.lo, r.hi);
  r.f1 = std::clamp(min_hi, r.f0, r.hi);
  return r;
}

// Plain loops for columns [j0, j1) of the block: the tail past the last full chunk, and every
// column where the build has no AVX2.
void block_scalar(const SmallGemmArgs& g, int64_t i0, int rows, const BlockRanges& r, int64_t j0,
                  int64_t j1) {
  for (int q = 0; q < rows; ++q) {
    const int64_t i = i0 + q;
    const float* a = g.a + i * g.a_row_stride;
    float* c = g.c + i * g.ldc;
    if (!g.accumulate) std::fill(c + j0, c + j1, 0.0f);
    for (int64_t l = r.row_lo[q]; l < r.row_hi[q]; ++l) {
      const float av = a[l * g.a_inner_stride];
      const float* b = g.b + l * g.ldb;
      for (int64_t j = j0; j < j1; ++j) c[j] = std::fma(av, b[j], c[j]);  // as the vector blocks
    }
  }
}

#if DTRAIN_SMALL_GEMM_AVX512
// Columns [j0, j0 + 16 · Chunks) of a block of `Rows` rows, in Chunks · Rows registers.
template <int Rows, int Chunks>
void block_avx512(const SmallGemmArgs& g, int64_t i0, const BlockRanges& r, int64_t j0) {
  __m512 acc[Rows][Chunks];
#pragma GCC unroll 12
  for (int q = 0; q < Rows; ++q) {
    const float* c = g.c + (i0 + q) * g.ldc + j0;
#pragma GCC unroll 2
    for (int h = 0; h < Chunks; ++h) {
      acc[q][h] = g.accumulate ? _mm512_loadu_ps(c + 16 * h) : _mm512_setzero_ps();
    }
  }
  const float* a = g.a + i0 * g.a_row_stride;
  const int64_t rs = g.a_row_stride, is = g.a_inner_stride;
  const float* b = g.b + j0;
  // A step where some rows are outside their range: those are skipped (A not read).
  auto masked_step = [&](int64_t l) {
    __m512 bv[Chunks];
#pragma GCC unroll 2
    for (int h = 0; h < Chunks; ++h) bv[h] = _mm512_loadu_ps(b + l * g.ldb + 16 * h);
#pragma GCC unroll 12
    for (int q = 0; q < Rows; ++q) {
      if (l < r.row_lo[q] || l >= r.row_hi[q]) continue;
      const __m512 av = _mm512_set1_ps(a[q * rs + l * is]);
#pragma GCC unroll 2
      for (int h = 0; h < Chunks; ++h) acc[q][h] = _mm512_fmadd_ps(av, bv[h], acc[q][h]);
    }
  };
  for (int64_t l = r.lo; l < r.f0; ++l) masked_step(l);
  {
    const float* al = a + r.f0 * is;
    const float* bl = b + r.f0 * g.ldb;
    const int64_t ldb = g.ldb;
#pragma GCC unroll 2
    for (int64_t l = r.f0; l < r.f1; ++l, al += is, bl += ldb) {
      __m512 bv[Chunks];
#pragma GCC unroll 2
      for (int h = 0; h < Chunks; ++h) bv[h] = _mm512_loadu_ps(bl + 16 * h);
#pragma GCC unroll 12
      for (int q = 0; q < Rows; ++q) {
        const __m512 av = _mm512_set1_ps(al[q * rs]);
#pragma GCC unroll 2
        for (int h = 0; h < Chunks; ++h) acc[q][h] = _mm512_fmadd_ps(av, bv[h], acc[q][h]);
      }
    }
  }
  for (int64_t l = r.f1; l < r.hi; ++l) masked_step(l);
#pragma GCC unroll 12
  for (int q = 0; q < Rows; ++q) {
    float* c = g.c + (i0 + q) * g.ldc + j0;
#pragma GCC unroll 2
    for (int h = 0; h < Chunks; ++h) _mm512_storeu_ps(c + 16 * h, acc[q][h]);
  }
}

using BlockFn = void (*)(const SmallGemmArgs&, int64_t, const BlockRanges&, int64_t);

// block_avx512<1..kRows, Chunks>, indexed by rows − 1.
template <int Chunks, int... R>
constexpr auto blocks_of(std::integer_sequence<int, R...>) {
  return std::array<BlockFn, sizeof...(R)>{&block_avx512<R + 1, Chunks>...};
}

template <int Chunks>
void block_avx512_rows(const SmallGemmArgs& g, int64_t i0, int rows, const BlockRanges& r,
                       int64_t j0) {
  static constexpr auto kBlocks = blocks_of<Chunks>(std::make_integer_sequence<int, kRows>{});
  kBlocks[std::clamp(rows, 1, kRows) - 1](g, i0, r, j0);
}

// Whole chunks [j0, j1) of a block: two at a time, then the odd one.
void block_chunks(const SmallGemmArgs& g, int64_t i0, int rows, const BlockRanges& r, int64_t j0,
                  int64_t j1) {
  for (; j0 + 2 * kCols <= j1; j0 += 2 * kCols) block_avx512_rows<2>(g, i0, rows, r, j0);
  if (j0 < j1) block_avx512_rows<1>(g, i0, rows, r, j0);
}
#elif DTRAIN_SMALL_GEMM_AVX2
// Columns [j0, j0 + 16) of a block of `Rows` rows, in 2·Rows registers.
template <int Rows>
void block_avx2(const SmallGemmArgs& g, int64_t i0, const BlockRanges& r, int64_t j0) {
  __m256 acc[Rows][2];
  if (g.accumulate) {
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) {
      const float* c = g.c + (i0 + q) * g.ldc + j0;
      acc[q][0] = _mm256_loadu_ps(c);
      acc[q][1] = _mm256_loadu_ps(c + 8);
    }
  } else {
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_ps();
  }
  const float* a = g.a + i0 * g.a_row_stride;
  const int64_t rs = g.a_row_stride, is = g.a_inner_stride;
  const float* b = g.b + j0;
  // A step where some rows are outside their range: those add 0·B (not read from A).
  auto masked_step = [&](int64_t l) {
    const __m256 b0 = _mm256_loadu_ps(b + l * g.ldb);
    const __m256 b1 = _mm256_loadu_ps(b + l * g.ldb + 8);
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) {
      if (l < r.row_lo[q] || l >= r.row_hi[q]) continue;
      const __m256 av = _mm256_broadcast_ss(a + q * rs + l * is);
      acc[q][0] = _mm256_fmadd_ps(av, b0, acc[q][0]);
      acc[q][1] = _mm256_fmadd_ps(av, b1, acc[q][1]);
    }
  };
  for (int64_t l = r.lo; l < r.f0; ++l) masked_step(l);
  {
    // The steps every row takes: pointers stepped, not l times the strides.
    const float* al = a + r.f0 * is;
    const float* bl = b + r.f0 * g.ldb;
    const int64_t ldb = g.ldb;
#pragma GCC unroll 4
    for (int64_t l = r.f0; l < r.f1; ++l, al += is, bl += ldb) {
      const __m256 b0 = _mm256_loadu_ps(bl);
      const __m256 b1 = _mm256_loadu_ps(bl + 8);
#pragma GCC unroll 6
      for (int q = 0; q < Rows; ++q) {
        const __m256 av = _mm256_broadcast_ss(al + q * rs);
        acc[q][0] = _mm256_fmadd_ps(av, b0, acc[q][0]);
        acc[q][1] = _mm256_fmadd_ps(av, b1, acc[q][1]);
      }
    }
  }
  for (int64_t l = r.f1; l < r.hi; ++l) masked_step(l);
#pragma GCC unroll 6
  for (int q = 0; q < Rows; ++q) {
    float* c = g.c + (i0 + q) * g.ldc + j0;
    _mm256_storeu_ps(c, acc[q][0]);
    _mm256_storeu_ps(c + 8, acc[q][1]);
  }
}

void block_avx2_rows(const SmallGemmArgs& g, int64_t i0, int rows, const BlockRanges& r,
                     int64_t j0) {
  switch (rows) {
    case 6:
      return block_avx2<6>(g, i0, r, j0);
    case 5:
      return block_avx2<5>(g, i0, r, j0);
    case 4:
      return block_avx2<4>(g, i0, r, j0);
    case 3:
      return block_avx2<3>(g, i0, r, j0);
    case 2:
      return block_avx2<2>(g, i0, r, j0);
    default:
      return block_avx2<1>(g, i0, r, j0);
  }
}

// Whole chunks [j0, j1) of a block.
void block_chunks(const SmallGemmArgs& g, int64_t i0, int rows, const BlockRanges& r, int64_t j0,
                  int64_t j1) {
  for (; j0 < j1; j0 += kCols) block_avx2_rows(g, i0, rows, r, j0);
}
#endif

}  // namespace

void small_gemm(const SmallGemmArgs& g) {
  if (g.m <= 0 || g.n <= 0) return;
  DTRAIN_CHECK(!g.accumulate || g.causal != CausalPart::kColumnsUpToRow,
               "small_gemm: accumulate does not combine with kColumnsUpToRow");
  const bool causal_columns = g.causal == CausalPart::kColumnsUpToRow;
  for (int64_t i0 = 0; i0 < g.m; i0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, g.m - i0));
    const BlockRanges r = block_ranges(g, i0, rows);
    // Columns the block computes: all, or up to its last row's diagonal.
    const int64_t cols = causal_columns ? std::min(i0 + rows, g.n) : g.n;
    int64_t j0 = 0;
#if DTRAIN_SMALL_GEMM_AVX2
    // Whole chunks (for the causal columns, the chunk holding the diagonal too, if it fits).
    const int64_t chunk_end =
        causal_columns ? std::min((cols + kCols - 1) / kCols * kCols, g.n / kCols * kCols)
                       : g.n / kCols * kCols;
    block_chunks(g, i0, rows, r, 0, chunk_end);
    j0 = chunk_end;
#endif
    if (j0 < cols) block_scalar(g, i0, rows, r, j0, cols);
    if (causal_columns) {
      for (int q = 0; q < rows; ++q) {
        const int64_t i = i0 + q;
        float* c = g.c + i * g.ldc;
        std::fill(c + std::min(i + 1, g.n), c + g.n, 0.0f);
      }
    }
  }
}

}  // namespace dtrain::ops
