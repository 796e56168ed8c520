// The dense layers' GEMM (dtrain/ops/gemm.h, dense_gemm): op(B) packed into panels of 16 columns
// (zero-padded), A read in place through two strides (so Aᵀ costs nothing), a 6×16 AVX2 register
// block (12×32 with AVX-512) per step of the inner dimension, the bias (if any) added in the tile's
// epilogue. OpenBLAS packs A as well on every call and, split into the fixed row blocks that keep
// its bits independent of the thread count, B once per block: for the GPT's [4096, 128]-sized
// products that packing was ~15% of the step.
//
// Two ways to split the work: a small op(B) (the weights: x·W, dz·Wᵀ) is packed whole once and
// the rows of C are split; a large one (dW = xᵀ·dz, where B is dz, as large as the activations) is
// packed one inner slice at a time into a buffer that stays in cache, by the thread that owns
// those panels, and the panels (columns) of C are split: B is read from memory once and its
// packed copy never goes back to memory.
//
// Each C(i, j) is its terms added in increasing l by one FMA each, in a lane that does not depend
// on how the rows or panels are split (any partition over threads gives the same bits), then the
// bias (as PyTorch's addmm and OpenBLAS with beta = 1 add it: after the products). A long inner
// dimension runs in slices of kSliceK, each slice's sum added to C (blocked summation, as
// OpenBLAS's own inner blocking does; the slices depend on the shape only).
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/gemm.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define DTRAIN_PANEL_GEMM_AVX2 1
#if defined(__AVX512F__)
// Where the build targets AVX-512, a tile is 12 rows × two panels (32 columns) in 24 of the 32
// 512-bit registers: per inner step two loads of B and 12 broadcasts of A feed 24 FMAs, against
// 12 FMAs for 2 + 6 loads in the AVX2 tile. Each C(i, j) takes the same FMAs in the same order
// (the header comment's), so the bits are those of the AVX2 tile on every shape.
#define DTRAIN_PANEL_GEMM_AVX512 1
#endif
#endif

namespace dtrain::ops {
namespace {

#if DTRAIN_PANEL_GEMM_AVX2
#if DTRAIN_PANEL_GEMM_AVX512
constexpr int kRows = 12;
constexpr int kTilePanels = 2;  // panels a tile spans
#else
constexpr int kRows = 6;
constexpr int kTilePanels = 1;
#endif
constexpr int kCols = 16;              // columns per packed panel
constexpr int64_t kSliceK = 256;       // inner slice when k > kMaxOnePassK
constexpr int64_t kMaxOnePassK = 512;  // up to this k, one pass (a panel of k × 16 ≤ 32 KB)
// Rows × inner slice of A that a pass of the panels keeps in L2: 96 KB when the rows split (A
// read in place), 192 KB when the panels split (dW: one chunk holds all of a 128-row xᵀ slice).
constexpr int64_t kRowChunkFloats = 24576;
constexpr int64_t kPanelChunkFloats = 49152;

// What a tile adds to its accumulators when it stores them: nothing (C = acc), the bias
// (C = acc + bias) or C's partial sums from the previous inner slices (C += acc).
enum class Finish { kStore, kBias, kAddC };

__m256i tail_mask(int cols) {
  alignas(32) static const int kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                             0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - std::clamp(cols, 0, 8)));
}

// One tile: C[q, jj] (c + q · ldc + jj, q < Rows, jj < cols) from A(q, l) = a[q · rs + l · is]
// and the panels' slices: column jj of the tile is b[(jj / 16) · pstride + l · 16 + jj % 16],
// l < kc; bias (if kBias) at bias[jj]. cols ≤ 16 · kTilePanels.
struct TileArgs {
  const float* a;
  int64_t rs, is;
  const float* b;
  int64_t pstride;  // floats from one packed panel's slice to the next's
  int64_t kc;
  const float* bias;
  float* c;
  int64_t ldc;
  int cols;
  Finish finish;
};

#if DTRAIN_PANEL_GEMM_AVX512
// Lanes [0, cols) of a 16-lane register.
__mmask16 lane_mask(int cols) {
  return static_cast<__mmask16>((1u << std::clamp(cols, 0, 16)) - 1u);
}

template <int Rows, int Panels>
void tile(const TileArgs& t) {
  __mmask16 mask[Panels];
  __m512 acc[Rows][Panels];
#pragma GCC unroll 2
  for (int p = 0; p < Panels; ++p) mask[p] = lane_mask(t.cols - 16 * p);
#pragma GCC unroll 12
  for (int q = 0; q < Rows; ++q) {
#pragma GCC unroll 2
    for (int p = 0; p < Panels; ++p) acc[q][p] = _mm512_setzero_ps();
  }
  const int64_t rs = t.rs, is = t.is, pstride = t.pstride;
  const float* a = t.a;
  const float* b = t.b;
#pragma GCC unroll 2
  for (int64_t l = 0; l < t.kc; ++l, a += is, b += kCols) {
    __m512 bv[Panels];
#pragma GCC unroll 2
    for (int p = 0; p < Panels; ++p) bv[p] = _mm512_loadu_ps(b + p * pstride);
#pragma GCC unroll 12
    for (int q = 0; q < Rows; ++q) {
      const __m512 av = _mm512_set1_ps(a[q * rs]);
#pragma GCC unroll 2
      for (int p = 0; p < Panels; ++p) acc[q][p] = _mm512_fmadd_ps(av, bv[p], acc[q][p]);
    }
  }
  if (t.finish == Finish::kBias) {
#pragma GCC unroll 2
    for (int p = 0; p < Panels; ++p) {
      const __m512 bias = _mm512_maskz_loadu_ps(mask[p], t.bias + 16 * p);
#pragma GCC unroll 12
      for (int q = 0; q < Rows; ++q) acc[q][p] = _mm512_add_ps(acc[q][p], bias);
    }
  } else if (t.finish == Finish::kAddC) {
#pragma GCC unroll 12
    for (int q = 0; q < Rows; ++q) {
      const float* c = t.c + q * t.ldc;
#pragma GCC unroll 2
      for (int p = 0; p < Panels; ++p) {
        acc[q][p] = _mm512_add_ps(_mm512_maskz_loadu_ps(mask[p], c + 16 * p), acc[q][p]);
      }
    }
  }
#pragma GCC unroll 12
  for (int q = 0; q < Rows; ++q) {
    float* c = t.c + q * t.ldc;
#pragma GCC unroll 2
    for (int p = 0; p < Panels; ++p) _mm512_mask_storeu_ps(c + 16 * p, mask[p], acc[q][p]);
  }
}

// tile<1..kRows, Panels>, indexed by rows − 1.
template <int Panels, int... R>
constexpr auto tiles_of(std::integer_sequence<int, R...>) {
  return std::array<void (*)(const TileArgs&), sizeof...(R)>{&tile<R + 1, Panels>...};
}

// A tile of `rows` rows over t.cols columns (one panel or two).
void tile_rows(int rows, const TileArgs& t) {
  static constexpr auto kOne = tiles_of<1>(std::make_integer_sequence<int, kRows>{});
  static constexpr auto kTwo = tiles_of<2>(std::make_integer_sequence<int, kRows>{});
  (t.cols > kCols ? kTwo : kOne)[std::clamp(rows, 1, kRows) - 1](t);
}
#else
template <int Rows>
void tile(const TileArgs& t) {
  const __m256i m0 = tail_mask(t.cols), m1 = tail_mask(t.cols - 8);
  __m256 acc[Rows][2];
#pragma GCC unroll 6
  for (int q = 0; q < Rows; ++q) acc[q][0] = acc[q][1] = _mm256_setzero_ps();
  const int64_t rs = t.rs, is = t.is;
  const float* a = t.a;
  const float* b = t.b;
#pragma GCC unroll 4
  for (int64_t l = 0; l < t.kc; ++l, a += is, b += kCols) {
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) {
      const __m256 av = _mm256_broadcast_ss(a + q * rs);
      acc[q][0] = _mm256_fmadd_ps(av, b0, acc[q][0]);
      acc[q][1] = _mm256_fmadd_ps(av, b1, acc[q][1]);
    }
  }
  if (t.finish == Finish::kBias) {
    const __m256 b0 = _mm256_maskload_ps(t.bias, m0);
    const __m256 b1 = _mm256_maskload_ps(t.bias + 8, m1);
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) {
      acc[q][0] = _mm256_add_ps(acc[q][0], b0);
      acc[q][1] = _mm256_add_ps(acc[q][1], b1);
    }
  } else if (t.finish == Finish::kAddC) {
#pragma GCC unroll 6
    for (int q = 0; q < Rows; ++q) {
      const float* c = t.c + q * t.ldc;
      acc[q][0] = _mm256_add_ps(_mm256_maskload_ps(c, m0), acc[q][0]);
      acc[q][1] = _mm256_add_ps(_mm256_maskload_ps(c + 8, m1), acc[q][1]);
    }
  }
#pragma GCC unroll 6
  for (int q = 0; q < Rows; ++q) {
    float* c = t.c + q * t.ldc;
    if (t.cols == kCols) {
      _mm256_storeu_ps(c, acc[q][0]);
      _mm256_storeu_ps(c + 8, acc[q][1]);
    } else {
      _mm256_maskstore_ps(c, m0, acc[q][0]);
      _mm256_maskstore_ps(c + 8, m1, acc[q][1]);
    }
  }
}

void tile_rows(int rows, const TileArgs& t) {
  switch (rows) {
    case 6:
      return tile<6>(t);
    case 5:
      return tile<5>(t);
    case 4:
      return tile<4>(t);
    case 3:
      return tile<3>(t);
    case 2:
      return tile<2>(t);
    default:
      return tile<1>(t);
  }
}
#endif

struct Operands {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  const float* bias;
  float* c;
  int64_t ldc;
  float* b_column_sums;
  // The inner slice (shape-dependent only) and A's strides per row and per inner step.
  int64_t slice, a_row_stride, a_inner_stride;
};

Finish finish_of(const Operands& o, int64_t l0) {
  return l0 > 0 ? Finish::kAddC : (o.bias != nullptr ? Finish::kBias : Finish::kStore);
}

// The tile arguments for `panels` panels' columns from `j0` over the inner slice [l0, l0 + kc),
// with B's first panel at `b` (the next `pstride` floats on) and A read with strides (rs, is);
// the caller sets `a` and `c` per row block.
TileArgs panel_tile(const Operands& o, int64_t j0, int64_t panels, int64_t l0, int64_t kc,
                    const float* b, int64_t pstride, int64_t rs, int64_t is) {
  return TileArgs{.a = nullptr,
                  .rs = rs,
                  .is = is,
                  .b = b,
                  .pstride = pstride,
                  .kc = kc,
                  .bias = o.bias != nullptr ? o.bias + j0 : nullptr,
                  .c = nullptr,
                  .ldc = o.ldc,
                  .cols = static_cast<int>(std::min<int64_t>(kCols * panels, o.n - j0)),
                  .finish = finish_of(o, l0)};
}

// Packs op(B)[l0 : l0 + kc, 16 p0 : 16 p1] into zero-padded panels of 16 columns:
// out[((p − p0) · kc + l) · 16 + jj] = B(l0 + l, 16p + jj). With `sums` (not trans_b), also
// adds each column's values to sums[j] in increasing l (sums start at 0 for l0 = 0).
void pack_panels(const Operands& o, int64_t l0, int64_t kc, int64_t p0, int64_t p1, float* out,
                 float* sums) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t j0 = p * kCols;
    const int cols = static_cast<int>(std::min<int64_t>(kCols, o.n - j0));
    float* dst = out + (p - p0) * kc * kCols;
    if (!o.trans_b) {
      // A row of the panel is 64 bytes: two vector copies (masked for a partial panel), not a
      // memmove call each.
      const __m256i m0 = tail_mask(cols), m1 = tail_mask(cols - 8);
      const float* src = o.b + l0 * o.ldb + j0;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
      if (sums != nullptr && l0 > 0) {
        s0 = _mm256_maskload_ps(sums + j0, m0);
        s1 = _mm256_maskload_ps(sums + j0 + 8, m1);
      }
      for (int64_t l = 0; l < kc; ++l, dst += kCols, src += o.ldb) {
        const __m256 v0 = _mm256_maskload_ps(src, m0), v1 = _mm256_maskload_ps(src + 8, m1);
        _mm256_storeu_ps(dst, v0);
        _mm256_storeu_ps(dst + 8, v1);
        if (sums != nullptr) {
          s0 = _mm256_add_ps(s0, v0);
          s1 = _mm256_add_ps(s1, v1);
        }
      }
      if (sums != nullptr) {
        _mm256_maskstore_ps(sums + j0, m0, s0);
        _mm256_maskstore_ps(sums + j0 + 8, m1, s1);
      }
    } else {
      // B(l, j) = b[j · ldb + l]: column by column.
      std::fill(dst, dst + kc * kCols, 0.0f);
      for (int jj = 0; jj < cols; ++jj) {
        const float* src = o.b + (j0 + jj) * o.ldb + l0;
        for (int64_t l = 0; l < kc; ++l) dst[l * kCols + jj] = src[l];
      }
    }
  }
}

// Rows [r0, r1) of C over every column, op(B) packed whole (all inner slices) in `panels`:
// per inner slice, chunks of rows whose slice of A stays in L2 while every panel's slice passes
// over them.
void rows_range(const Operands& o, const float* panels, int64_t r0, int64_t r1) {
  const int64_t chunk = std::clamp<int64_t>(kRowChunkFloats / o.slice / kRows * kRows, kRows, 384);
  const int64_t np = (o.n + kCols - 1) / kCols;
  for (int64_t l0 = 0; l0 < std::max<int64_t>(o.k, 1); l0 += o.slice) {
    const int64_t kc = std::min(o.k, l0 + o.slice) - l0;
    for (int64_t c0 = r0; c0 < r1; c0 += chunk) {
      const int64_t c1 = std::min(r1, c0 + chunk);
      for (int64_t p = 0; p < np; p += kTilePanels) {
        const int64_t j0 = p * kCols;
        TileArgs t = panel_tile(o, j0, std::min<int64_t>(kTilePanels, np - p), l0, kc,
                                panels + (p * o.k + l0) * kCols, o.k * kCols, o.a_row_stride,
                                o.a_inner_stride);
        for (int64_t i = c0; i < c1; i += kRows) {
          t.a = o.a + i * o.a_row_stride + l0 * o.a_inner_stride;
          t.c = o.c + i * o.ldc + j0;
          tile_rows(static_cast<int>(std::min<int64_t>(kRows, c1 - i)), t);
        }
      }
    }
  }
}

// Rows [c0, c1) × inner [l0, l0 + kc) of A, stored transposed (A(i, l) = a[l · lda + i]),
// packed into kRows-row tiles: out[(i0 − c0) · kc + l · kRows + q] = A(i0 + q, l0 + l) for the tile
// at i0 (a partial last tile leaves its missing rows unwritten; its tile never reads them).
void pack_a_transposed(const Operands& o, int64_t l0, int64_t kc, int64_t c0, int64_t c1,
                       float* out) {
  // Row l of the stored Aᵀ is read once, in order, and dealt out to the tiles (each written in
  // order too): reading tile by tile took a cache line per l for six floats of it.
  const int64_t full = (c1 - c0) / kRows * kRows;
  for (int64_t l = 0; l < kc; ++l) {
    const float* src = o.a + (l0 + l) * o.lda + c0;
    float* dst = out + l * kRows;
    for (int64_t i = 0; i < full; i += kRows)
      std::memcpy(dst + i * kc, src + i, kRows * sizeof(float));
    for (int64_t i = full; i < c1 - c0; ++i) dst[full * kc + (i - full)] = src[i];
  }
}

// Panels [p0, p1) of C over every row, for a large op(B) (dW = xᵀ·dz: B is dz, as large as the
// activations): op(B) packed one inner slice at a time into a buffer that stays in cache (the
// column sums continued slice by slice), so B is read from memory once and never written back.
void panels_range(const Operands& o, int64_t p0, int64_t p1) {
  thread_local std::vector<float> buffer, packed_a;
  const auto need = static_cast<size_t>((p1 - p0) * o.slice * kCols);
  if (buffer.size() < need) buffer.resize(need);
  float* panels = buffer.data();
  const int64_t chunk =
      std::clamp<int64_t>(kPanelChunkFloats / o.slice / kRows * kRows, kRows, 384);
  // Aᵀ stored (xᵀ of dW): a tile's six values of one l are adjacent, but each l is another row
  // of x, so the tile would touch a cache line per l; packed, its slice is 6·kc floats in a row.
  const bool pack_a = o.trans_a;
  if (pack_a && packed_a.size() < static_cast<size_t>(chunk * o.slice)) {
    packed_a.resize(static_cast<size_t>(chunk * o.slice));
  }
  for (int64_t l0 = 0; l0 < o.k; l0 += o.slice) {
    const int64_t kc = std::min(o.k, l0 + o.slice) - l0;
    pack_panels(o, l0, kc, p0, p1, panels, o.b_column_sums);
    for (int64_t c0 = 0; c0 < o.m; c0 += chunk) {
      const int64_t c1 = std::min(o.m, c0 + chunk);
      if (pack_a) pack_a_transposed(o, l0, kc, c0, c1, packed_a.data());
      for (int64_t p = p0; p < p1; p += kTilePanels) {
        const int64_t j0 = p * kCols;
        TileArgs t = panel_tile(o, j0, std::min<int64_t>(kTilePanels, p1 - p), l0, kc,
                                panels + (p - p0) * kc * kCols, kc * kCols,
                                pack_a ? 1 : o.a_row_stride, pack_a ? kRows : o.a_inner_stride);
        for (int64_t i = c0; i < c1; i += kRows) {
          t.a = pack_a ? packed_a.data() + (i - c0) * kc
                       : o.a + i * o.a_row_stride + l0 * o.a_inner_stride;
          t.c = o.c + i * o.ldc + j0;
          tile_rows(static_cast<int>(std::min<int64_t>(kRows, c1 - i)), t);
        }
      }
    }
  }
}

// Below this many multiply-adds, OpenBLAS: a small product costs little either way, and small
// models (the 20-step PyTorch differential's among them) keep OpenBLAS's bits, which PyTorch
// linked to the same OpenBLAS reproduces (docs/decisions.md).
constexpr int64_t kMinWork = int64_t{1} << 20;
// op(B) above this many floats (the weights are far smaller) is packed slice by slice.
constexpr int64_t kLargeB = int64_t{1} << 18;

void panel_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc,
                float* b_column_sums) {
  const int64_t panels = (n + kCols - 1) / kCols;
  const Operands o{.trans_a = trans_a,
                   .trans_b = trans_b,
                   .m = m,
                   .n = n,
                   .k = k,
                   .a = a,
                   .lda = lda,
                   .b = b,
                   .ldb = ldb,
                   .bias = bias,
                   .c = c,
                   .ldc = ldc,
                   .b_column_sums = b_column_sums,
                   .slice = k <= kMaxOnePassK ? std::max<int64_t>(k, 1) : kSliceK,
                   .a_row_stride = trans_a ? 1 : lda,
                   .a_inner_stride = trans_a ? lda : 1};
  if (k > 0 && k * n > kLargeB) {
    // Panels in ranges; each element is computed the same way in any range (header comment).
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, m * k));
    parallel_for(panels, grain, [&](int64_t p0, int64_t p1) { panels_range(o, p0, p1); });
    return;
  }
  // One buffer per calling thread, grown as needed (the step's shapes repeat).
  thread_local std::vector<float> packed;
  const auto need = static_cast<size_t>(panels * std::max<int64_t>(k, 1) * kCols);
  if (packed.size() < need) packed.resize(need);
  float* const panels_data = packed.data();  // (packed names each thread's own buffer)
  if (k > 0) {
    parallel_for(panels, grain_for(k * kCols), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        pack_panels(o, 0, k, p, p + 1, panels_data + p * k * kCols, b_column_sums);
      }
    });
  } else if (b_column_sums != nullptr) {
    std::fill(b_column_sums, b_column_sums + n, 0.0f);
  }
  // Rows in ranges of whole tiles; the split changes no bits (header comment).
  const int64_t grain = std::max<int64_t>(
      kRows, (int64_t{1} << 20) / std::max<int64_t>(1, n * k) / kRows * kRows + kRows);
  parallel_for(m, grain, [&](int64_t r0, int64_t r1) { rows_range(o, panels_data, r0, r1); });
}
#endif

// Σ_l b[l · ldb + j] in increasing l from 0, as ops::column_sum sums.
void column_sums(const float* b, int64_t k, int64_t n, int64_t ldb, float* sums) {
  std::fill(sums, sums + n, 0.0f);
  for (int64_t l = 0; l < k; ++l) {
    for (int64_t j = 0; j < n; ++j) sums[j] += b[l * ldb + j];
  }
}

}  // namespace

void dense_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc,
                float* b_column_sums) {
  DTRAIN_CHECK(b_column_sums == nullptr || !trans_b,
               "dense_gemm: column sums of B are computed only without trans_b");
  if (n <= 0) return;
  if (m <= 0) {
    if (b_column_sums != nullptr) column_sums(b, k, n, ldb, b_column_sums);
    return;
  }
#if DTRAIN_PANEL_GEMM_AVX2
  if (m * n * std::max<int64_t>(k, 1) >= kMinWork) {
    panel_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, ldc, b_column_sums);
    return;
  }
#endif
  if (b_column_sums != nullptr) column_sums(b, k, n, ldb, b_column_sums);
  if (bias != nullptr) {
    for (int64_t i = 0; i < m; ++i) std::copy_n(bias, n, c + i * ldc);
  }
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, bias != nullptr ? 1.0f : 0.0f, c, ldc);
}

}  // namespace dtrain::ops
