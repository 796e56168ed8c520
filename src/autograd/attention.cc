// Attention ops: forward through dtrain/ops/attention.h, backward as strided batched GEMMs.
#include "dtrain/autograd/attention.h"

#include <memory>
#include <vector>

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/attention_fused.h"
#include "dtrain/ops/small_gemm.h"
#include "dtrain/ops/tensor_ops.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;
using ops::CausalPart;
using ops::small_gemm;
using ops::strided_batched_gemm;
using ops::StridedMatrices;
using ops::StridedOutput;

namespace {

Tape* recording_tape(const Tensor& a, const Tensor& b) {
  Tape* t = Tape::current();
  if (t == nullptr) return nullptr;
  return t->node_of(a) >= 0 || t->node_of(b) >= 0 ? t : nullptr;
}

// ---------------------------------------------------------------------------------------------
// batch_matmul: C_i = op(A_i) op(B_i); saved A, B; i[0] = transpose_a, i[1] = transpose_b. A
// rank-2 operand is shared by the batch, so its gradient sums over it (zero output stride).

void batch_matmul_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& a = n.saved[0];
  const Tensor& b = n.saved[1];
  const bool ta = n.i[0] != 0, tb = n.i[1] != 0;
  const int64_t m = g.dim(-2), nn = g.dim(-1);
  const int64_t k = a.dim(ta ? -2 : -1);
  const int64_t count = g.num_elements() / std::max<int64_t>(1, m * nn);
  const int64_t sa = a.rank() == 2 ? 0 : a.dim(-1) * a.dim(-2);
  const int64_t sb = b.rank() == 2 ? 0 : b.dim(-1) * b.dim(-2);
  const StridedMatrices gm{g.data<float>(), 0, m * nn, nn};
  const StridedMatrices am{a.data<float>(), 0, sa, a.dim(-1)};
  const StridedMatrices bm{b.data<float>(), 0, sb, b.dim(-1)};
  if (n.in[0] >= 0) {
    Tensor da(a.shape());
    if (sa == 0) da.fill(0.0);
    if (!ta) {  // dA [m, k] = g · op(B)ᵀ
      strided_batched_gemm(1, count, false, !tb, m, k, nn, 1.0f, gm, bm, 0.0f,
                           {da.data<float>(), 0, sa, k});
    } else {  // dA [k, m] = op(B) · gᵀ
      strided_batched_gemm(1, count, tb, true, k, m, nn, 1.0f, bm, gm, 0.0f,
                           {da.data<float>(), 0, sa, m});
    }
    t.accumulate(n.in[0], std::move(da));
  }
  if (n.in[1] >= 0) {
    Tensor db(b.shape());
    if (sb == 0) db.fill(0.0);
    if (!tb) {  // dB [k, n] = op(A)ᵀ · g
      strided_batched_gemm(1, count, !ta, false, k, nn, m, 1.0f, am, gm, 0.0f,
                           {db.data<float>(), 0, sb, nn});
    } else {  // dB [n, k] = gᵀ · op(A)
      strided_batched_gemm(1, count, true, ta, nn, k, m, 1.0f, gm, am, 0.0f,
                           {db.data<float>(), 0, sb, k});
    }
    t.accumulate(n.in[1], std::move(db));
  }
}

// ---------------------------------------------------------------------------------------------
// masked_softmax: y = softmax(f[0] · x + mask); saved y. dx = f[0] · y ⊙ (g − Σ g·y).

void masked_softmax_backward(Tape& t, const Node& n, Tensor g) {
  Tensor dx = g.use_count() == 1 ? std::move(g) : g.clone();
  ops::masked_softmax_backward_inplace(n.saved[0], dx, n.f[0]);
  t.accumulate(n.in[0], std::move(dx));
}

// ---------------------------------------------------------------------------------------------
// The two products of multi-head attention on [B, T, N, H] layouts. For batch b and head n,
// Q_bn = query[b, :, n, :] is a [T, H] matrix with leading dimension N·H (and so on).

struct HeadDims {
  int64_t batch, t, s, heads, h;
};

void check_head_layout(const Tensor& x, const char* op, const char* what) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 4, op, ": expected ",
               what, " as float32 [batch, time, heads, dim], got ",
               x.defined() ? x.shape().to_string() : "undefined");
}

// The causal products: one small_gemm per (batch, head), over the causal part only. A head of
// x [B, S, N, H] is x[b, :, n, :], an [S, H] matrix with leading dimension N·H.
struct CausalHeads {
  int64_t batch, heads, t;
  const float* head(const Tensor& x, int64_t b, int64_t n) const {
    return x.data<float>() + (b * x.dim(1) * heads + n) * x.dim(3);
  }
  float* head(Tensor& x, int64_t b, int64_t n) const {
    return x.data<float>() + (b * x.dim(1) * heads + n) * x.dim(3);
  }
  // Matrix (b, n) of a [B, N, T, T] tensor.
  const float* square(const Tensor& x, int64_t b, int64_t n) const {
    return x.data<float>() + (b * heads + n) * t * t;
  }
  float* square(Tensor& x, int64_t b, int64_t n) const {
    return x.data<float>() + (b * heads + n) * t * t;
  }
};

// x[b, :, n, :]ᵀ [H, T] into a per-thread buffer that grows once (no allocation per step).
const float* transposed_head(const float* x, int64_t t, int64_t h, int64_t ld) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < t * h) buffer.resize(t * h);
  float* out = buffer.data();
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t j = 0; j < h; ++j) out[j * t + s] = x[s * ld + j];
  }
  return out;
}

// out [B, N, T, T] = X_bn · Y_bnᵀ on the causal columns (zero above the diagonal), for x
// [B, T, N, H] and y [B, T, N, H].
void causal_outer(const CausalHeads& c, const Tensor& x, const Tensor& y, Tensor& out) {
  const int64_t h = x.dim(3), ld = c.heads * h;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t n = 0; n < c.heads; ++n) {
      small_gemm({.m = c.t,
                  .n = c.t,
                  .k = h,
                  .a = c.head(x, b, n),
                  .a_row_stride = ld,
                  .b = transposed_head(c.head(y, b, n), c.t, h, ld),
                  .ldb = c.t,
                  .c = c.square(out, b, n),
                  .ldc = c.t,
                  .causal = CausalPart::kColumnsUpToRow});
    }
  }
}

// out [B, T, N, H] = P_bn · X_bn (transpose: P_bnᵀ · X_bn) over P's causal triangle, for p
// [B, N, T, T] and x [B, T, N, H].
void causal_weighted(const CausalHeads& c, const Tensor& p, bool transpose, const Tensor& x,
                     Tensor& out) {
  const int64_t h = x.dim(3), ld = c.heads * h;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t n = 0; n < c.heads; ++n) {
      small_gemm({.m = c.t,
                  .n = h,
                  .k = c.t,
                  .a = c.square(p, b, n),
                  .a_row_stride = transpose ? 1 : c.t,
                  .a_inner_stride = transpose ? c.t : 1,
                  .b = c.head(x, b, n),
                  .ldb = ld,
                  .c = c.head(out, b, n),
                  .ldc = ld,
                  .causal = transpose ? CausalPart::kInnerFromRow : CausalPart::kInnerUpToRow});
    }
  }
}

// scores[b, n] = Q_bn · K_bnᵀ; saved query, key; i[0] = causal.
void scores_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& q = n.saved[0];
  const Tensor& k = n.saved[1];
  const int64_t batch = q.dim(0), tq = q.dim(1), heads = q.dim(2), h = q.dim(3), s = k.dim(1);
  const int64_t ld = heads * h;
  if (n.i[0] != 0) {
    const CausalHeads c{batch, heads, tq};
    if (n.in[0] >= 0) {  // dQ_bn = G_bn · K_bn over s ≤ t
      Tensor dq(q.shape());
      causal_weighted(c, g, false, k, dq);
      t.accumulate(n.in[0], std::move(dq));
    }
    if (n.in[1] >= 0) {  // dK_bn = G_bnᵀ · Q_bn over t ≥ s
      Tensor dk(k.shape());
      causal_weighted(c, g, true, q, dk);
      t.accumulate(n.in[1], std::move(dk));
    }
    return;
  }
  const StridedMatrices gm{g.data<float>(), heads * tq * s, tq * s, s};
  if (n.in[0] >= 0) {  // dQ_bn [T, H] = G_bn [T, S] · K_bn [S, H]
    Tensor dq(q.shape());
    strided_batched_gemm(batch, heads, false, false, tq, h, s, 1.0f, gm,
                         {k.data<float>(), s * ld, h, ld}, 0.0f,
                         {dq.data<float>(), tq * ld, h, ld});
    t.accumulate(n.in[0], std::move(dq));
  }
  if (n.in[1] >= 0) {  // dK_bn [S, H] = G_bnᵀ [S, T] · Q_bn [T, H]
    Tensor dk(k.shape());
    strided_batched_gemm(batch, heads, true, false, s, h, tq, 1.0f, gm,
                         {q.data<float>(), tq * ld, h, ld}, 0.0f,
                         {dk.data<float>(), s * ld, h, ld});
    t.accumulate(n.in[1], std::move(dk));
  }
}

// out_bn = P_bn · V_bn; saved probs, value; i[0] = causal.
void combine_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& p = n.saved[0];
  const Tensor& v = n.saved[1];
  const int64_t batch = p.dim(0), heads = p.dim(1), tq = p.dim(2), s = p.dim(3), h = v.dim(3);
  const int64_t ld = heads * h;
  if (n.i[0] != 0) {
    const CausalHeads c{batch, heads, tq};
    if (n.in[0] >= 0) {  // dP_bn = G_bn · V_bnᵀ for s ≤ t, 0 above
      Tensor dp(p.shape());
      causal_outer(c, g, v, dp);
      t.accumulate(n.in[0], std::move(dp));
    }
    if (n.in[1] >= 0) {  // dV_bn = P_bnᵀ · G_bn over t ≥ s
      Tensor dv(v.shape());
      causal_weighted(c, p, true, g, dv);
      t.accumulate(n.in[1], std::move(dv));
    }
    return;
  }
  const StridedMatrices gm{g.data<float>(), tq * ld, h, ld};
  if (n.in[0] >= 0) {  // dP_bn [T, S] = G_bn [T, H] · V_bnᵀ [H, S]
    Tensor dp(p.shape());
    strided_batched_gemm(batch, heads, false, true, tq, s, h, 1.0f, gm,
                         {v.data<float>(), s * ld, h, ld}, 0.0f,
                         {dp.data<float>(), heads * tq * s, tq * s, s});
    t.accumulate(n.in[0], std::move(dp));
  }
  if (n.in[1] >= 0) {  // dV_bn [S, H] = P_bnᵀ [S, T] · G_bn [T, H]
    Tensor dv(v.shape());
    strided_batched_gemm(batch, heads, true, false, s, h, tq, 1.0f,
                         {p.data<float>(), heads * tq * s, tq * s, s}, gm, 0.0f,
                         {dv.data<float>(), s * ld, h, ld});
    t.accumulate(n.in[1], std::move(dv));
  }
}

// ---------------------------------------------------------------------------------------------
// fused_attention: saved query, key, value; attrs: the output, the rows' log-sum-exp and the key
// mask; f[0] = scale, i[0] = causal.

struct FusedSaved {
  Tensor out, lse, key_mask;
};

ops::FusedAttentionArgs fused_args(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& key_mask, float scale, bool causal) {
  return {.batch = q.dim(0),
          .t = q.dim(1),
          .s = k.dim(1),
          .heads = q.dim(2),
          .key_dim = q.dim(3),
          .value_dim = v.dim(3),
          .query = q.data<float>(),
          .key = k.data<float>(),
          .value = v.data<float>(),
          .key_mask = key_mask.defined() ? key_mask.data<float>() : nullptr,
          .scale = scale,
          .causal = causal};
}

void fused_attention_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& q = n.saved[0];
  const Tensor& k = n.saved[1];
  const Tensor& v = n.saved[2];
  const auto& saved = *static_cast<const FusedSaved*>(n.attrs.get());
  const ops::FusedAttentionArgs a = fused_args(q, k, v, saved.key_mask, n.f[0], n.i[0] != 0);
  Tensor dq(q.shape()), dk(k.shape()), dv(v.shape());
  ops::fused_attention_backward(a, saved.out.data<float>(), saved.lse.data<float>(),
                                g.data<float>(), dq.data<float>(), dk.data<float>(),
                                dv.data<float>(), 0, a.batch * a.heads);
  t.accumulate(n.in[0], std::move(dq));
  t.accumulate(n.in[1], std::move(dk));
  t.accumulate(n.in[2], std::move(dv));
}

}  // namespace

Tensor batch_matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  Tensor out = ops::batch_matmul(a, b, transpose_a, transpose_b);
  Tape* t = recording_tape(a, b);
  if (t == nullptr) return out;
  Node& n = t->record(batch_matmul_backward, out, t->node_of(a), t->node_of(b));
  n.saved[0] = stop_gradient(a);
  n.saved[1] = stop_gradient(b);
  n.i[0] = transpose_a;
  n.i[1] = transpose_b;
  return out;
}

Tensor masked_softmax(const Tensor& x, const Tensor& mask, const MaskedSoftmaxOptions& options) {
  Tensor y = ops::masked_softmax(x, mask, options);
  Tape* t = Tape::current();
  if (t == nullptr || t->node_of(x) < 0) return y;
  Tensor saved = stop_gradient(y);
  Node& n = t->record(masked_softmax_backward, y, t->node_of(x));
  n.saved[0] = std::move(saved);
  n.f[0] = options.scale;
  return y;
}

Tensor multihead_scores(const Tensor& query, const Tensor& key, bool causal) {
  check_head_layout(query, "multihead_scores", "the query");
  check_head_layout(key, "multihead_scores", "the key");
  DTRAIN_CHECK(
      query.dim(0) == key.dim(0) && query.dim(2) == key.dim(2) && query.dim(3) == key.dim(3),
      "multihead_scores: query ", query.shape().to_string(), " and key ", key.shape().to_string(),
      " differ in batch, heads or key dim");
  const int64_t batch = query.dim(0), tq = query.dim(1), heads = query.dim(2), h = query.dim(3);
  const int64_t s = key.dim(1), ld = heads * h;
  DTRAIN_CHECK(!causal || tq == s, "multihead_scores: a causal product needs as many keys as ",
               "queries, got ", tq, " queries and ", s, " keys");
  Tensor out(Shape{batch, heads, tq, s});
  if (causal) {
    causal_outer({batch, heads, tq}, query, key, out);
  } else {
    strided_batched_gemm(batch, heads, false, true, tq, s, h, 1.0f,
                         {query.data<float>(), tq * ld, h, ld}, {key.data<float>(), s * ld, h, ld},
                         0.0f, {out.data<float>(), heads * tq * s, tq * s, s});
  }
  Tape* t = recording_tape(query, key);
  if (t == nullptr) return out;
  Node& n = t->record(scores_backward, out, t->node_of(query), t->node_of(key));
  n.saved[0] = stop_gradient(query);
  n.saved[1] = stop_gradient(key);
  n.i[0] = causal;
  return out;
}

Tensor multihead_combine(const Tensor& probs, const Tensor& value, bool causal) {
  DTRAIN_CHECK(probs.defined() && probs.dtype() == DType::kFloat32 && probs.rank() == 4,
               "multihead_combine: expected probabilities float32 [batch, heads, T, S], got ",
               probs.defined() ? probs.shape().to_string() : "undefined");
  check_head_layout(value, "multihead_combine", "the value");
  DTRAIN_CHECK(
      probs.dim(0) == value.dim(0) && probs.dim(1) == value.dim(2) && probs.dim(3) == value.dim(1),
      "multihead_combine: probabilities ", probs.shape().to_string(), " and value ",
      value.shape().to_string(), " differ in batch, heads or length");
  const int64_t batch = probs.dim(0), heads = probs.dim(1), tq = probs.dim(2), s = probs.dim(3);
  const int64_t h = value.dim(3), ld = heads * h;
  DTRAIN_CHECK(!causal || tq == s, "multihead_combine: a causal product needs square ",
               "probabilities, got ", probs.shape().to_string());
  Tensor out(Shape{batch, tq, heads, h});
  if (causal) {
    causal_weighted({batch, heads, tq}, probs, false, value, out);
  } else {
    strided_batched_gemm(batch, heads, false, false, tq, h, s, 1.0f,
                         {probs.data<float>(), heads * tq * s, tq * s, s},
                         {value.data<float>(), s * ld, h, ld}, 0.0f,
                         {out.data<float>(), tq * ld, h, ld});
  }
  Tape* t = recording_tape(probs, value);
  if (t == nullptr) return out;
  Node& n = t->record(combine_backward, out, t->node_of(probs), t->node_of(value));
  n.saved[0] = stop_gradient(probs);
  n.saved[1] = stop_gradient(value);
  n.i[0] = causal;
  return out;
}

Tensor fused_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                       const Tensor& key_mask, const FusedAttentionOptions& options) {
  check_head_layout(query, "fused_attention", "the query");
  check_head_layout(key, "fused_attention", "the key");
  check_head_layout(value, "fused_attention", "the value");
  DTRAIN_CHECK(
      query.dim(0) == key.dim(0) && key.dim(0) == value.dim(0) && query.dim(2) == key.dim(2) &&
          key.dim(2) == value.dim(2) && query.dim(3) == key.dim(3) && key.dim(1) == value.dim(1),
      "fused_attention: query ", query.shape().to_string(), ", key ", key.shape().to_string(),
      " and value ", value.shape().to_string(), " differ in batch, heads, key dim or length");
  const int64_t batch = query.dim(0), s = key.dim(1);
  Tensor mask;
  if (key_mask.defined()) {
    DTRAIN_CHECK(key_mask.rank() == 2 && key_mask.dim(0) == batch && key_mask.dim(1) == s,
                 "fused_attention: key_mask ", key_mask.shape().to_string(),
                 " is not [batch, S] = [", batch, ", ", s, "]");
    mask = key_mask.dtype() == DType::kFloat32 ? key_mask : ops::cast(key_mask, DType::kFloat32);
  }
  DTRAIN_CHECK(ops::fused_attention_rows_have_keys(mask.defined() ? mask.data<float>() : nullptr,
                                                   batch, s, options.causal),
               "fused_attention: some query sees no unmasked key (key_mask ",
               mask.defined() ? mask.shape().to_string() : std::string("none"), ", ", s,
               " keys, causal ", options.causal, ")");
  const ops::FusedAttentionArgs a =
      fused_args(query, key, value, mask, options.scale, options.causal);
  Tensor out(Shape{batch, query.dim(1), query.dim(2), value.dim(3)});
  Tensor lse(Shape{batch, query.dim(2), query.dim(1)});
  ops::fused_attention_forward(a, out.data<float>(), lse.data<float>(), 0, a.batch * a.heads);
  Tape* t = Tape::current();
  if (t == nullptr) return out;
  const int32_t nq = t->node_of(query), nk = t->node_of(key), nv = t->node_of(value);
  if (nq < 0 && nk < 0 && nv < 0) return out;
  auto saved = std::make_shared<FusedSaved>(FusedSaved{stop_gradient(out), std::move(lse), mask});
  Node& n = t->record(fused_attention_backward, out, nq, nk, nv);
  n.saved[0] = stop_gradient(query);
  n.saved[1] = stop_gradient(key);
  n.saved[2] = stop_gradient(value);
  n.attrs = std::move(saved);
  n.f[0] = options.scale;
  n.i[0] = options.causal;
  return out;
}

}  // namespace dtrain
