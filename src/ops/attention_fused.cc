// The fused attention kernels (dtrain/ops/attention_fused.h). Per (batch, head): K (and, for
// the backward, V) transposed once into per-thread scratch; then per block of kRows queries,
// per block of kCols keys up to the causal edge: the score block by small_gemm, the online
// softmax on it in place, and its product with V added into the block's accumulator. The
// backward (FlashAttention-2's) recomputes each probability block from the saved log-sum-exp:
// dV += Pᵀ·dO, dP = dO·Vᵀ, dS = scale · P ⊙ (dP − rowsum(dO ⊙ O)), dQ += dS·K, dK += dSᵀ·Q.
#include "dtrain/ops/attention_fused.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dtrain/ops/small_gemm.h"
#include "vector_math.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dtrain::ops {
namespace {

// Square blocks (so that under the causal mask the diagonal block's products skip its upper
// triangle through small_gemm's causal parts), a multiple of its 6-row blocks and 16-column
// chunks.
constexpr int64_t kRows = 48;     // queries per block
constexpr int64_t kCols = kRows;  // keys per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-thread scratch that grows once.
float* scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

#if defined(__AVX2__)
// The 8×8 block at x (leading dimension ld) transposed into out (leading dimension ldo).
inline void transpose_8x8(const float* x, int64_t ld, float* out, int64_t ldo) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * ldo, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// x[s, :] for s < len (leading dimension ld) as [dim, len] (leading dimension len): 8×8
// register transposes where AVX2 has them, loops for the edges.
void transpose_into(const float* x, int64_t len, int64_t dim, int64_t ld, float* out) {
  int64_t s8 = 0, j8 = 0;
#if defined(__AVX2__)
  s8 = len / 8 * 8;
  j8 = dim / 8 * 8;
  for (int64_t s = 0; s < s8; s += 8) {
    for (int64_t j = 0; j < j8; j += 8) transpose_8x8(x + s * ld + j, ld, out + j * len + s, len);
  }
#endif
  for (int64_t s = 0; s < len; ++s) {
    for (int64_t j = s < s8 ? j8 : 0; j < dim; ++j) out[j * len + s] = x[s * ld + j];
  }
}

// max x[c] over c < n (−∞ for n = 0), in eight lanes so that it vectorizes.
float row_max_of(const float* x, int64_t n) {
  float m[8];
  std::fill(m, m + 8, kNegInf);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int l = 0; l < 8; ++l) m[l] = m[l] > x[c + l] ? m[l] : x[c + l];
  }
  for (; c < n; ++c) m[0] = m[0] > x[c] ? m[0] : x[c];
  return std::max(std::max(std::max(m[0], m[1]), std::max(m[2], m[3])),
                  std::max(std::max(m[4], m[5]), std::max(m[6], m[7])));
}

// Σ a[j]·b[j] over j < n in eight float lanes (the rows are short: H ≈ 32).
float dot_rows(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = vmath::mul_add(a[j + l], b[j + l], acc[l]);
  }
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; ++j) sum = vmath::mul_add(a[j], b[j], sum);
  return sum;
}

// The pair's views: row t of the query head at q + t·ldq, and so on.
struct Head {
  const float *q, *k, *v, *mask;
  int64_t ldq, ldv;
};

Head head_of(const FusedAttentionArgs& a, int64_t p) {
  const int64_t b = p / a.heads, n = p % a.heads;
  return {a.query + (b * a.t * a.heads + n) * a.key_dim,
          a.key + (b * a.s * a.heads + n) * a.key_dim,
          a.value + (b * a.s * a.heads + n) * a.value_dim,
          a.key_mask ? a.key_mask + b * a.s : nullptr,
          a.heads * a.key_dim,
          a.heads * a.value_dim};
}

// The keys query t may see end here (exclusive).
int64_t visible_end(const FusedAttentionArgs& a, int64_t t) {
  return a.causal ? std::min(t + 1, a.s) : a.s;
}

// Whether block (i0, j0) straddles the causal diagonal: there, key c ≤ query r within it.
bool on_diagonal(const FusedAttentionArgs& a, int64_t i0, int64_t j0) {
  return a.causal && i0 == j0;
}

// The causal parts of the diagonal block's products whose inner index is a key (P·V, dS·K) or
// a query (Pᵀ·dO, dSᵀ·Q).
CausalPart inner_keys(const FusedAttentionArgs& a, int64_t i0, int64_t j0) {
  return on_diagonal(a, i0, j0) ? CausalPart::kInnerUpToRow : CausalPart::kNone;
}
CausalPart inner_queries(const FusedAttentionArgs& a, int64_t i0, int64_t j0) {
  return on_diagonal(a, i0, j0) ? CausalPart::kInnerFromRow : CausalPart::kNone;
}

// Scores block [rows, cols] (leading dimension kCols) = Q[i0 : i0 + rows] · Kᵀ[:, j0 : j0 + cols]
// from the transposed keys kt [H, S].
// On the causal diagonal block (j0 = i0) only its lower triangle (key ≤ query).
void score_block(const FusedAttentionArgs& a, const Head& h, const float* kt, int64_t i0,
                 int64_t rows, int64_t j0, int64_t cols, float* sc) {
  small_gemm({.m = rows,
              .n = cols,
              .k = a.key_dim,
              .a = h.q + i0 * h.ldq,
              .a_row_stride = h.ldq,
              .b = kt + j0,
              .ldb = a.s,
              .c = sc,
              .ldc = kCols,
              .causal = on_diagonal(a, i0, j0) ? CausalPart::kColumnsUpToRow : CausalPart::kNone});
}

// The number of the block's first `cols` keys that query t sees (0 ≤ result ≤ cols).
int64_t visible_in_block(const FusedAttentionArgs& a, int64_t t, int64_t j0, int64_t cols) {
  return std::clamp<int64_t>(visible_end(a, t) - j0, 0, cols);
}

}  // namespace

bool fused_attention_rows_have_keys(const float* key_mask, int64_t batch, int64_t s, bool causal) {
  if (s <= 0) return false;
  if (key_mask == nullptr) return true;
  for (int64_t b = 0; b < batch; ++b) {
    const float* m = key_mask + b * s;
    if (causal ? m[0] == 0.0f : std::all_of(m, m + s, [](float x) { return x == 0.0f; })) {
      return false;
    }
  }
  return true;
}

void fused_attention_forward(const FusedAttentionArgs& a, float* out, float* lse, int64_t begin,
                             int64_t end) {
  thread_local std::vector<float> kt_buf, sc_buf, acc_buf;
  float* kt = scratch(kt_buf, a.key_dim * a.s);
  float* sc = scratch(sc_buf, kRows * kCols);
  float* acc = scratch(acc_buf, kRows * a.value_dim);
  const int64_t hv = a.value_dim;
  float row_max[kRows], row_sum[kRows];
  for (int64_t p = begin; p < end; ++p) {
    const Head h = head_of(a, p);
    transpose_into(h.k, a.s, a.key_dim, h.ldq, kt);
    float* o = out + ((p / a.heads) * a.t * a.heads + p % a.heads) * hv;
    float* l = lse + p * a.t;
    for (int64_t i0 = 0; i0 < a.t; i0 += kRows) {
      const int64_t rows = std::min(kRows, a.t - i0);
      const int64_t keys = visible_end(a, i0 + rows - 1);  // the block's last row sees most
      std::fill(row_max, row_max + rows, kNegInf);
      std::fill(row_sum, row_sum + rows, 0.0f);
      std::fill(acc, acc + rows * hv, 0.0f);
      for (int64_t j0 = 0; j0 < keys; j0 += kCols) {
        const int64_t cols = std::min(kCols, keys - j0);
        score_block(a, h, kt, i0, rows, j0, cols, sc);
        for (int64_t r = 0; r < rows; ++r) {
          float* x = sc + r * kCols;
          const int64_t vis = visible_in_block(a, i0 + r, j0, cols);
          for (int64_t c = 0; c < vis; ++c) x[c] *= a.scale;
          float mx;
          if (h.mask) {
            for (int64_t c = 0; c < vis; ++c) x[c] = h.mask[j0 + c] != 0.0f ? x[c] : kNegInf;
          }
          mx = row_max_of(x, vis);
          std::fill(x + vis, x + cols, 0.0f);
          if (mx == kNegInf) {  // nothing visible here: the row's state is unchanged
            std::fill(x, x + vis, 0.0f);
            continue;
          }
          const float m_new = std::max(row_max[r], mx);
          const float alpha = vmath::exp(row_max[r] - m_new);  // 0 for the first block
          const float sum = static_cast<float>(vmath::exp_shifted_sum(x, vis, m_new));
          row_sum[r] = row_sum[r] * alpha + sum;
          row_max[r] = m_new;
          if (alpha != 1.0f) {
            float* ar = acc + r * hv;
            for (int64_t j = 0; j < hv; ++j) ar[j] *= alpha;
          }
        }
        small_gemm({.m = rows,
                    .n = hv,
                    .k = cols,
                    .a = sc,
                    .a_row_stride = kCols,
                    .b = h.v + j0 * h.ldv,
                    .ldb = h.ldv,
                    .c = acc,
                    .ldc = hv,
                    .causal = inner_keys(a, i0, j0),
                    .accumulate = true});
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / row_sum[r];
        const float* ar = acc + r * hv;
        float* orow = o + (i0 + r) * h.ldv;
        for (int64_t j = 0; j < hv; ++j) orow[j] = ar[j] * inv;
        l[i0 + r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  }
}

void fused_attention_backward(const FusedAttentionArgs& a, const float* out, const float* lse,
                              const float* d_out, float* d_query, float* d_key, float* d_value,
                              int64_t begin, int64_t end) {
  thread_local std::vector<float> kt_buf, vt_buf, p_buf, dp_buf, d_buf;
  const int64_t hk = a.key_dim, hv = a.value_dim;
  float* kt = scratch(kt_buf, hk * a.s);
  float* vt = scratch(vt_buf, hv * a.s);
  float* pb = scratch(p_buf, kRows * kCols);
  float* dp = scratch(dp_buf, kRows * kCols);
  float* dd = scratch(d_buf, a.t);
  for (int64_t p = begin; p < end; ++p) {
    const Head h = head_of(a, p);
    const int64_t q_off = ((p / a.heads) * a.t * a.heads + p % a.heads);
    const int64_t k_off = ((p / a.heads) * a.s * a.heads + p % a.heads);
    const float* o = out + q_off * hv;
    const float* go = d_out + q_off * hv;
    float* dq = d_query + q_off * hk;
    float* dk = d_key + k_off * hk;
    float* dv = d_value + k_off * hv;
    const float* l = lse + p * a.t;
    transpose_into(h.k, a.s, hk, h.ldq, kt);
    transpose_into(h.v, a.s, hv, h.ldv, vt);
    for (int64_t t = 0; t < a.t; ++t) {
      dd[t] = dot_rows(go + t * h.ldv, o + t * h.ldv, hv);
      std::fill(dq + t * h.ldq, dq + t * h.ldq + hk, 0.0f);
    }
    for (int64_t s = 0; s < a.s; ++s) {
      std::fill(dk + s * h.ldq, dk + s * h.ldq + hk, 0.0f);
      std::fill(dv + s * h.ldv, dv + s * h.ldv + hv, 0.0f);
    }
    for (int64_t i0 = 0; i0 < a.t; i0 += kRows) {
      const int64_t rows = std::min(kRows, a.t - i0);
      const int64_t keys = visible_end(a, i0 + rows - 1);
      for (int64_t j0 = 0; j0 < keys; j0 += kCols) {
        const int64_t cols = std::min(kCols, keys - j0);
        score_block(a, h, kt, i0, rows, j0, cols, pb);
        // P = e^(scale · s − lse) on the visible, unmasked keys; 0 elsewhere.
        for (int64_t r = 0; r < rows; ++r) {
          float* x = pb + r * kCols;
          const int64_t vis = visible_in_block(a, i0 + r, j0, cols);
          const float shift = l[i0 + r];
          for (int64_t c = 0; c < vis; ++c) x[c] = vmath::exp(x[c] * a.scale - shift);
          if (h.mask) {
            for (int64_t c = 0; c < vis; ++c) x[c] = h.mask[j0 + c] != 0.0f ? x[c] : 0.0f;
          }
          std::fill(x + vis, x + cols, 0.0f);
        }
        // dV[j0 : j0 + cols] += Pᵀ · dO[i0 : i0 + rows]
        small_gemm({.m = cols,
                    .n = hv,
                    .k = rows,
                    .a = pb,
                    .a_row_stride = 1,
                    .a_inner_stride = kCols,
                    .b = go + i0 * h.ldv,
                    .ldb = h.ldv,
                    .c = dv + j0 * h.ldv,
                    .ldc = h.ldv,
                    .causal = inner_queries(a, i0, j0),
                    .accumulate = true});
        // dP = dO[i0 : i0 + rows] · Vᵀ[:, j0 : j0 + cols]; dS = scale · P ⊙ (dP − D)
        small_gemm(
            {.m = rows,
             .n = cols,
             .k = hv,
             .a = go + i0 * h.ldv,
             .a_row_stride = h.ldv,
             .b = vt + j0,
             .ldb = a.s,
             .c = dp,
             .ldc = kCols,
             .causal = on_diagonal(a, i0, j0) ? CausalPart::kColumnsUpToRow : CausalPart::kNone});
        for (int64_t r = 0; r < rows; ++r) {
          const float* pr = pb + r * kCols;
          float* gr = dp + r * kCols;
          const float d = dd[i0 + r];
          for (int64_t c = 0; c < cols; ++c) gr[c] = a.scale * pr[c] * (gr[c] - d);
        }
        // dQ[i0 : i0 + rows] += dS · K[j0 : j0 + cols]
        small_gemm({.m = rows,
                    .n = hk,
                    .k = cols,
                    .a = dp,
                    .a_row_stride = kCols,
                    .b = h.k + j0 * h.ldq,
                    .ldb = h.ldq,
                    .c = dq + i0 * h.ldq,
                    .ldc = h.ldq,
                    .causal = inner_keys(a, i0, j0),
                    .accumulate = true});
        // dK[j0 : j0 + cols] += dSᵀ · Q[i0 : i0 + rows]
        small_gemm({.m = cols,
                    .n = hk,
                    .k = rows,
                    .a = dp,
                    .a_row_stride = 1,
                    .a_inner_stride = kCols,
                    .b = h.q + i0 * h.ldq,
                    .ldb = h.ldq,
                    .c = dk + j0 * h.ldq,
                    .ldc = h.ldq,
                    .causal = inner_queries(a, i0, j0),
                    .accumulate = true});
      }
    }
  }
}

}  // namespace dtrain::ops
