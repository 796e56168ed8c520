// Winograd F(4x4, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):
//   Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A
// per 6x6 input tile d and 3x3 kernel g, giving a 4x4 output tile with 36 multiplications where
// the direct convolution takes 144. Over channels the ⊙ becomes, for each of the 36 transformed
// positions ξ, a GEMM M_ξ [tiles, out] = V_ξ [tiles, in] · U_ξ [in, out]. Channels are the
// innermost NHWC axis, so the transforms run on 8 channels at a time (GCC vector extensions) and
// the GEMMs on a 6x16 AVX2/FMA register tile.
//
// Backward-data is the forward convolution of dy (padded by 2 − pad) with the kernel flipped in
// space and transposed in channels. Backward-weights is the adjoint of the forward's transforms:
// dU_ξ = V_ξᵀ · dM_ξ with dM = A dY Aᵀ, then dg = Gᵀ dU G.
#include "winograd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/convolution.h"

namespace dtrain::ops {

namespace {

std::atomic<int>& algo_flag() {
  static std::atomic<int> flag = [] {
    const char* env = std::getenv("DTRAIN_CONV_ALGO");
    const std::string v = env == nullptr ? "" : env;
    if (v.empty() || v == "auto" || v == "winograd") return static_cast<int>(ConvAlgo::kAuto);
    if (v == "direct") return static_cast<int>(ConvAlgo::kDirect);
    throw InvalidArgumentError(str_cat("DTRAIN_CONV_ALGO: unknown value '", v,
                                       "' (expected 'auto', 'winograd' or 'direct')"));
  }();
  return flag;
}

std::atomic<int64_t> winograd_calls{0};

}  // namespace

void set_conv_algo(ConvAlgo a) { algo_flag().store(static_cast<int>(a)); }
ConvAlgo conv_algo() { return static_cast<ConvAlgo>(algo_flag().load()); }
int64_t winograd_conv_calls() { return winograd_calls.load(std::memory_order_relaxed); }

namespace detail {

namespace {

constexpr int64_t kAlpha = 6;             // input tile side
constexpr int64_t kTile = 4;              // output tile side
constexpr int64_t kXi = kAlpha * kAlpha;  // transformed positions
constexpr int64_t kChunk = 18;            // tiles per forward work item (shape-only)

using v8 = float __attribute__((vector_size(32)));

// The distance between two transformed positions' planes of `tiles` x `channels` floats: one
// cache line more than the plane, so that a tile's 36 values do not fall into the same few L1
// sets (with 36 tiles x 64 channels the planes are 9 KiB apart, and 36 loads hit 4 of 64 sets).
inline int64_t plane_stride(int64_t tiles, int64_t channels) { return tiles * channels + 16; }

// Unaligned 8-float accesses (a memcpy of a v8 compiled to pairs of 16-byte integer moves).
using v8u = float __attribute__((vector_size(32), aligned(4), may_alias));
inline void load8(v8* v, const float* p) { *v = *reinterpret_cast<const v8u*>(p); }
inline void store8(float* p, const v8* v) { *reinterpret_cast<v8u*>(p) = *v; }

// Bᵀ on six values d[0], d[s], ..., d[5s] → out[0], out[t], ..., out[5t].
inline void bt6(const v8* d, int64_t s, v8* out, int64_t t) {
  const v8 d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
  out[0] = 4.0f * d0 - 5.0f * d2 + d4;
  out[t] = d3 + d4 - 4.0f * (d1 + d2);
  out[2 * t] = d4 - d3 + 4.0f * (d1 - d2);
  out[3 * t] = d4 - d2 + 2.0f * (d3 - d1);
  out[4 * t] = d4 - d2 - 2.0f * (d3 - d1);
  out[5 * t] = 4.0f * d1 - 5.0f * d3 + d5;
}

// Aᵀ: six values → four.
inline void at6(const v8* m, int64_t s, v8* out, int64_t t) {
  const v8 m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
  const v8 p12 = m1 + m2, d12 = m1 - m2, p34 = m3 + m4, d34 = m3 - m4;
  out[0] = m0 + p12 + p34;
  out[t] = d12 + 2.0f * d34;
  out[2 * t] = p12 + 4.0f * p34;
  out[3 * t] = d12 + 8.0f * d34 + m5;
}

// A (the adjoint of Aᵀ): four values → six.
inline void a4(const v8* y, int64_t s, v8* out, int64_t t) {
  const v8 y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
  const v8 p02 = y0 + y2, p13 = y1 + y3, q02 = y0 + 4.0f * y2, q13 = 2.0f * y1 + 8.0f * y3;
  out[0] = y0;
  out[t] = p02 + p13;
  out[2 * t] = p02 - p13;
  out[3 * t] = q02 + q13;
  out[4 * t] = q02 - q13;
  out[5 * t] = y3;
}

// G: three kernel taps → six.
inline void g3(const v8* g, int64_t s, v8* out, int64_t t) {
  const v8 g0 = g[0], g1 = g[s], g2 = g[2 * s];
  const v8 p = g0 + g2;
  out[0] = 0.25f * g0;
  out[t] = (p + g1) * (-1.0f / 6.0f);
  out[2 * t] = (p - g1) * (-1.0f / 6.0f);
  out[3 * t] = g0 * (1.0f / 24.0f) + g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
  out[4 * t] = g0 * (1.0f / 24.0f) - g1 * (1.0f / 12.0f) + g2 * (1.0f / 6.0f);
  out[5 * t] = g2;
}

// Gᵀ (the adjoint of G): six values → three taps.
inline void gt6(const v8* u, int64_t s, v8* out, int64_t t) {
  const v8 u0 = u[0], u1 = u[s], u2 = u[2 * s], u3 = u[3 * s], u4 = u[4 * s], u5 = u[5 * s];
  out[0] = 0.25f * u0 - (u1 + u2) * (1.0f / 6.0f) + (u3 + u4) * (1.0f / 24.0f);
  out[t] = (u2 - u1) * (1.0f / 6.0f) + (u3 - u4) * (1.0f / 12.0f);
  out[2 * t] = (u3 + u4 - u1 - u2) * (1.0f / 6.0f) + u5;
}

// The per-thread buffers (only grow).
float* buffer(int which, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& b = buffers[which];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

struct Tiling {
  int64_t th, tw, total;
};

Tiling tiling(const WinogradConv& g) {
  const int64_t th = (g.oh + kTile - 1) / kTile, tw = (g.ow + kTile - 1) / kTile;
  return Tiling{th, tw, g.n * th * tw};
}

// V[ξ][t][:] (position ξ at v + ξ·stride) ← Bᵀ d B for the 6x6 input tile of global tile `tile`.
void input_tile(const WinogradConv& g, const Tiling& tl, const float* x, int64_t tile, float* v,
                int64_t stride) {
  const int64_t n = tile / (tl.th * tl.tw), r = tile % (tl.th * tl.tw);
  const int64_t iy0 = (r / tl.tw) * kTile - g.pt, ix0 = (r % tl.tw) * kTile - g.pl;
  const float* img = x + n * g.h * g.w * g.c;
  const v8 zero = {};
  v8 d[kXi], t[kXi];
  for (int64_t c = 0; c < g.c; c += 8) {
    for (int64_t i = 0; i < kAlpha; ++i) {
      const int64_t iy = iy0 + i;
      for (int64_t j = 0; j < kAlpha; ++j) {
        const int64_t ix = ix0 + j;
        if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) {
          load8(&d[i * kAlpha + j], img + (iy * g.w + ix) * g.c + c);
        } else {
          d[i * kAlpha + j] = zero;
        }
      }
    }
    for (int64_t j = 0; j < kAlpha; ++j) bt6(d + j, kAlpha, t + j, kAlpha);
    for (int64_t i = 0; i < kAlpha; ++i) bt6(t + i * kAlpha, 1, d + i * kAlpha, 1);
    for (int64_t xi = 0; xi < kXi; ++xi) store8(v + xi * stride + c, &d[xi]);
  }
}

// y's 4x4 output tile `tile` ← Aᵀ m A (+ bias), m[ξ] at m + ξ·stride.
void output_tile(const WinogradConv& g, const Tiling& tl, const float* m, int64_t stride,
                 const float* bias, int64_t tile, float* y) {
  const int64_t n = tile / (tl.th * tl.tw), r = tile % (tl.th * tl.tw);
  const int64_t oy0 = (r / tl.tw) * kTile, ox0 = (r % tl.tw) * kTile;
  const int64_t rows = std::min(kTile, g.oh - oy0), cols = std::min(kTile, g.ow - ox0);
  float* img = y + n * g.oh * g.ow * g.o;
  v8 a[kXi], s[kTile * kAlpha], out[kTile * kTile];
  for (int64_t o = 0; o < g.o; o += 8) {
    for (int64_t xi = 0; xi < kXi; ++xi) load8(&a[xi], m + xi * stride + o);
    for (int64_t j = 0; j < kAlpha; ++j) at6(a + j, kAlpha, s + j, kAlpha);
    for (int64_t p = 0; p < kTile; ++p) at6(s + p * kAlpha, 1, out + p * kTile, 1);
    v8 b = {};
    if (bias != nullptr) load8(&b, bias + o);
    for (int64_t p = 0; p < rows; ++p) {
      for (int64_t q = 0; q < cols; ++q) {
        const v8 val = out[p * kTile + q] + b;
        store8(img + ((oy0 + p) * g.ow + ox0 + q) * g.o + o, &val);
      }
    }
  }
}

// dM[ξ][t][:] ← A dY Aᵀ for dy's 4x4 tile `tile` (zero beyond the output).
void output_grad_tile(const WinogradConv& g, const Tiling& tl, const float* dy, int64_t tile,
                      float* dm, int64_t stride) {
  const int64_t n = tile / (tl.th * tl.tw), r = tile % (tl.th * tl.tw);
  const int64_t oy0 = (r / tl.tw) * kTile, ox0 = (r % tl.tw) * kTile;
  const float* img = dy + n * g.oh * g.ow * g.o;
  const v8 zero = {};
  v8 e[kTile * kTile], s[kAlpha * kTile], out[kXi];
  for (int64_t o = 0; o < g.o; o += 8) {
    for (int64_t p = 0; p < kTile; ++p) {
      for (int64_t q = 0; q < kTile; ++q) {
        if (oy0 + p < g.oh && ox0 + q < g.ow) {
          load8(&e[p * kTile + q], img + ((oy0 + p) * g.ow + ox0 + q) * g.o + o);
        } else {
          e[p * kTile + q] = zero;
        }
      }
    }
    for (int64_t q = 0; q < kTile; ++q) a4(e + q, kTile, s + q, kTile);  // s [6][4]
    for (int64_t i = 0; i < kAlpha; ++i) a4(s + i * kTile, 1, out + i * kAlpha, 1);
    for (int64_t xi = 0; xi < kXi; ++xi) store8(dm + xi * stride + o, &out[xi]);
  }
}

// U[ξ][c][o] ← G k Gᵀ for the kernel k[i][j][c][o] = w[i][j][c][o] (HWIO [3, 3, c, o]), or,
// when `flip`, k[i][j][c][o] = w[2 − i][2 − j][o][c] with w HWIO [3, 3, o, c].
void transform_kernel(const float* w, int64_t c_count, int64_t o_count, bool flip, float* u) {
  const int64_t plane = c_count * o_count;
  v8 k[9], s[kAlpha * 3], out[kXi];
  for (int64_t c = 0; c < c_count; ++c) {
    for (int64_t o = 0; o < o_count; o += 8) {
      for (int64_t tap = 0; tap < 9; ++tap) {
        if (!flip) {
          load8(&k[tap], w + tap * plane + c * o_count + o);
        } else {
          float lanes[8];
          for (int64_t l = 0; l < 8; ++l) lanes[l] = w[(8 - tap) * plane + (o + l) * c_count + c];
          load8(&k[tap], lanes);
        }
      }
      for (int64_t j = 0; j < 3; ++j) g3(k + j, 3, s + j, 3);  // s [6][3]
      for (int64_t i = 0; i < kAlpha; ++i) g3(s + i * 3, 1, out + i * kAlpha, 1);
      for (int64_t xi = 0; xi < kXi; ++xi) store8(u + xi * plane + c * o_count + o, &out[xi]);
    }
  }
}

// C [m, n] = op(A) [m, k] · B [k, n] with A's element (r, kk) at a[r·ars + kk·aks] (a plain
// matrix or its transpose), n a multiple of 8; each element sums over kk in order.
#if defined(__AVX2__) && defined(__FMA__)
// Named accumulators (an array of __m256 made GCC 12 store every accumulator to the stack on
// every step of the k loop).
// With ACC the sums continue from C's values (k split into blocks gives the same bits).
template <int R, int NV, bool ACC>
void kernel_block(int64_t k, const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                  float* c, int64_t ldc) {
  __m256 c0a = _mm256_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a;
  __m256 c3a = c0a, c3b = c0a, c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a;
  if constexpr (ACC) {
#define DTRAIN_WINOGRAD_LOAD(r)                                       \
  if constexpr (R > r) {                                              \
    c##r##a = _mm256_loadu_ps(c + r * ldc);                           \
    if constexpr (NV > 1) c##r##b = _mm256_loadu_ps(c + r * ldc + 8); \
  }
    DTRAIN_WINOGRAD_LOAD(0)
    DTRAIN_WINOGRAD_LOAD(1)
    DTRAIN_WINOGRAD_LOAD(2)
    DTRAIN_WINOGRAD_LOAD(3)
    DTRAIN_WINOGRAD_LOAD(4)
    DTRAIN_WINOGRAD_LOAD(5)
#undef DTRAIN_WINOGRAD_LOAD
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* bk = b + kk * ldb;
    const float* ak = a + kk * aks;
    const __m256 b0 = _mm256_loadu_ps(bk);
    const __m256 b1 = NV > 1 ? _mm256_loadu_ps(bk + 8) : b0;
#define DTRAIN_WINOGRAD_ROW(r)                                        \
  if constexpr (R > r) {                                              \
    const __m256 av = _mm256_broadcast_ss(ak + r * ars);              \
    c##r##a = _mm256_fmadd_ps(av, b0, c##r##a);                       \
    if constexpr (NV > 1) c##r##b = _mm256_fmadd_ps(av, b1, c##r##b); \
  }
    DTRAIN_WINOGRAD_ROW(0)
    DTRAIN_WINOGRAD_ROW(1)
    DTRAIN_WINOGRAD_ROW(2)
    DTRAIN_WINOGRAD_ROW(3)
    DTRAIN_WINOGRAD_ROW(4)
    DTRAIN_WINOGRAD_ROW(5)
#undef DTRAIN_WINOGRAD_ROW
  }
#define DTRAIN_WINOGRAD_STORE(r)                                      \
  if constexpr (R > r) {                                              \
    _mm256_storeu_ps(c + r * ldc, c##r##a);                           \
    if constexpr (NV > 1) _mm256_storeu_ps(c + r * ldc + 8, c##r##b); \
  }
  DTRAIN_WINOGRAD_STORE(0)
  DTRAIN_WINOGRAD_STORE(1)
  DTRAIN_WINOGRAD_STORE(2)
  DTRAIN_WINOGRAD_STORE(3)
  DTRAIN_WINOGRAD_STORE(4)
  DTRAIN_WINOGRAD_STORE(5)
#undef DTRAIN_WINOGRAD_STORE
}

template <int NV, bool ACC>
void kernel_rows(int rows, int64_t k, const float* a, int64_t ars, int64_t aks, const float* b,
                 int64_t ldb, float* c, int64_t ldc) {
  switch (rows) {
    case 6:
      return kernel_block<6, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
    case 5:
      return kernel_block<5, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
    case 4:
      return kernel_block<4, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
    case 3:
      return kernel_block<3, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
    case 2:
      return kernel_block<2, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
    default:
      return kernel_block<1, NV, ACC>(k, a, ars, aks, b, ldb, c, ldc);
  }
}

template <bool ACC>
void gemm_pass(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t aks,
               const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    for (int64_t i0 = 0; i0 < m; i0 += 6) {
      const int rows = static_cast<int>(std::min<int64_t>(6, m - i0));
      if (n - j0 >= 16) {
        kernel_rows<2, ACC>(rows, k, a + i0 * ars, ars, aks, b + j0, ldb, c + i0 * ldc + j0, ldc);
      } else {
        kernel_rows<1, ACC>(rows, k, a + i0 * ars, ars, aks, b + j0, ldb, c + i0 * ldc + j0, ldc);
      }
    }
  }
}

void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t aks,
                const float* b, int64_t ldb, float* c, int64_t ldc) {
  gemm_pass<false>(m, n, k, a, ars, aks, b, ldb, c, ldc);
}

// The same product for a long k (backward-weights: k = tiles), in blocks of k whose slices of A
// and B stay in L1 while every register tile of C passes over them.
// With `accumulate` the sums continue from C's values: splitting k between calls gives the same
// bits as one call.
void small_gemm_blocked_k(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t aks,
                          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kBlock = 32;
  for (int64_t k0 = 0; k0 < k; k0 += kBlock) {
    const int64_t kb = std::min(kBlock, k - k0);
    if (k0 == 0 && !accumulate) {
      gemm_pass<false>(m, n, kb, a, ars, aks, b, ldb, c, ldc);
    } else {
      gemm_pass<true>(m, n, kb, a + k0 * aks, ars, aks, b + k0 * ldb, ldb, c, ldc);
    }
  }
}
#else
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t aks,
                const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    std::fill_n(ci, n, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = a[i * ars + kk * aks];
      const float* bk = b + kk * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += av * bk[j];
    }
  }
}

void small_gemm_blocked_k(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t aks,
                          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::fill_n(ci, n, 0.0f);
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = a[i * ars + kk * aks];
      const float* bk = b + kk * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += av * bk[j];
    }
  }
}
#endif

// The forward convolution of g with the transformed kernel u [36][c][o].
void forward_transformed(const WinogradConv& g, const float* x, const float* u, const float* bias,
                         float* y) {
  const Tiling tl = tiling(g);
  const int64_t chunks = (tl.total + kChunk - 1) / kChunk;
  const int64_t plane = g.c * g.o;
  // Chunks of tiles are independent (each output element belongs to one tile).
  parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
    const int64_t sv = plane_stride(kChunk, g.c), sm = plane_stride(kChunk, g.o);
    float* v = buffer(0, kXi * sv);
    float* m = buffer(1, kXi * sm);
    for (int64_t ch = begin; ch < end; ++ch) {
      const int64_t t0 = ch * kChunk, nt = std::min(kChunk, tl.total - t0);
      for (int64_t t = 0; t < nt; ++t) input_tile(g, tl, x, t0 + t, v + t * g.c, sv);
      for (int64_t xi = 0; xi < kXi; ++xi) {
        small_gemm(nt, g.o, g.c, v + xi * sv, g.c, 1, u + xi * plane, g.o, m + xi * sm, g.o);
      }
      for (int64_t t = 0; t < nt; ++t) {
        output_tile(g, tl, m + t * g.o, sm, bias, t0 + t, y);
      }
    }
  });
}

}  // namespace

bool winograd_applies(const WinogradConv& g) {
  return conv_algo() == ConvAlgo::kAuto && g.n > 0 && g.c >= 16 && g.o >= 16 && g.c % 8 == 0 &&
         g.o % 8 == 0 && g.oh > 0 && g.ow > 0 && g.pt >= 0 && g.pt <= 2 && g.pl >= 0 && g.pl <= 2;
}

void winograd_conv2d(const WinogradConv& g, const float* x, const float* w, const float* bias,
                     float* y) {
  float* u = buffer(2, kXi * g.c * g.o);
  transform_kernel(w, g.c, g.o, false, u);
  forward_transformed(g, x, u, bias, y);
  winograd_calls.fetch_add(1, std::memory_order_relaxed);
}

void winograd_conv2d_backward_input(const WinogradConv& g, const float* dy, const float* w,
                                    float* dx) {
  // dx[q] = Σ_i dy[q + i − (2 − pt)] · w[2 − i]ᵀ: a forward convolution over dy.
  const WinogradConv t{.n = g.n,
                       .h = g.oh,
                       .w = g.ow,
                       .c = g.o,
                       .oh = g.h,
                       .ow = g.w,
                       .o = g.c,
                       .pt = 2 - g.pt,
                       .pl = 2 - g.pl};
  float* u = buffer(2, kXi * g.c * g.o);
  transform_kernel(w, t.c, t.o, true, u);
  forward_transformed(t, dy, u, nullptr, dx);
  winograd_calls.fetch_add(1, std::memory_order_relaxed);
}

void winograd_conv2d_backward_filter(const WinogradConv& g, const float* x, const float* dy,
                                     float* dw) {
  const Tiling tl = tiling(g);
  const int64_t plane = g.c * g.o;
  // Tiles per pass: a pass's transformed input and gradient (36 positions each) stay within
  // ~512 KiB, an L2 cache, so that the products read them from there (with all 576 tiles of the
  // CNN's conv2 in one pass, 8 MiB, writing and reading them back cost as much as the products).
  // A multiple of kChunk that depends on the shape only; the passes continue each position's
  // sums in tile order, so the bits depend on neither the pass size nor the thread count.
  const int64_t fit = (int64_t{128} << 10) / (kXi * (g.c + g.o));
  const int64_t pass = std::max<int64_t>(kChunk, fit / kChunk * kChunk);
  const int64_t span = std::min(pass, (tl.total + kChunk - 1) / kChunk * kChunk);
  const int64_t sv = plane_stride(span, g.c), sm = plane_stride(span, g.o);
  float* v = buffer(0, kXi * sv);
  float* dm = buffer(1, kXi * sm);
  float* du = buffer(2, kXi * plane);
  for (int64_t t0 = 0; t0 < tl.total; t0 += span) {
    const int64_t nt = std::min(span, tl.total - t0);
    const int64_t chunks = (nt + kChunk - 1) / kChunk;
    parallel_for(chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin * kChunk; t < std::min(end * kChunk, nt); ++t) {
        input_tile(g, tl, x, t0 + t, v + t * g.c, sv);
        output_grad_tile(g, tl, dy, t0 + t, dm + t * g.o, sm);
      }
    });
    // Each position's product sums over the tiles in order: split the positions.
    parallel_for(kXi, 1, [&](int64_t begin, int64_t end) {
      for (int64_t xi = begin; xi < end; ++xi) {
        small_gemm_blocked_k(g.c, g.o, nt, v + xi * sv, 1, g.c, dm + xi * sm, g.o, du + xi * plane,
                             g.o, t0 > 0);
      }
    });
  }
  // dw[a][b][c][o] = Σ_ij G[i][a] dU[i][j] G[j][b].
  v8 a[kXi], s[3 * kAlpha], out[9];
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t o = 0; o < g.o; o += 8) {
      for (int64_t xi = 0; xi < kXi; ++xi) load8(&a[xi], du + xi * plane + c * g.o + o);
      for (int64_t j = 0; j < kAlpha; ++j) gt6(a + j, kAlpha, s + j, kAlpha);  // s [3][6]
      for (int64_t p = 0; p < 3; ++p) gt6(s + p * kAlpha, 1, out + p * 3, 1);
      for (int64_t tap = 0; tap < 9; ++tap) store8(dw + tap * plane + c * g.o + o, &out[tap]);
    }
  }
  winograd_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace dtrain::ops
