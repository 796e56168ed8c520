// Differentiable ops: forward through dtrain::ops, backward functions recorded on the tape.
// Each backward names the forward expression it differentiates.
#include "dtrain/autograd/functions.h"

#include <algorithm>
#include <cmath>

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/ops/gemm.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;
using ops::BinaryOp;
using ops::UnaryOp;

namespace {

// The tape to record on when any of the inputs is differentiated, else null.
Tape* recording_tape(const Tensor& a, const Tensor* b = nullptr, const Tensor* c = nullptr) {
  Tape* t = Tape::current();
  if (t == nullptr) return nullptr;
  if (t->node_of(a) >= 0 || (b && t->node_of(*b) >= 0) || (c && t->node_of(*c) >= 0)) return t;
  return nullptr;
}

// A tensor the caller may overwrite: g itself when nothing else holds its buffer.
Tensor writable(Tensor g) { return g.use_count() == 1 ? std::move(g) : g.clone(); }

template <class F>
Tensor map1(const Tensor& g, const Tensor& x, F f) {
  Tensor out(g.shape());
  const float* pg = g.data<float>();
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = g.num_elements(); i < n; ++i) po[i] = f(pg[i], px[i]);
  return out;
}

Tensor scaled(const Tensor& g, float s) { return ops::affine(g, s, 0.0f); }

// ---------------------------------------------------------------------------------------------
// Binary ops. shape[0], shape[1] are the input shapes (for un-broadcasting).

// out = a + b
void add_backward(Tape& t, const Node& n, Tensor g) {
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::reduce_to_shape(g, n.shape[0]));
  if (n.in[1] >= 0) t.accumulate(n.in[1], ops::reduce_to_shape(g, n.shape[1]));
}
// out = a − b
void sub_backward(Tape& t, const Node& n, Tensor g) {
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::reduce_to_shape(g, n.shape[0]));
  if (n.in[1] >= 0) t.accumulate(n.in[1], scaled(ops::reduce_to_shape(g, n.shape[1]), -1.0f));
}
// out = a · b (elementwise); saved a, b
void mul_backward(Tape& t, const Node& n, Tensor g) {
  if (n.in[0] >= 0) {
    t.accumulate(n.in[0],
                 ops::reduce_to_shape(ops::binary(BinaryOp::kMul, g, n.saved[1]), n.shape[0]));
  }
  if (n.in[1] >= 0) {
    t.accumulate(n.in[1],
                 ops::reduce_to_shape(ops::binary(BinaryOp::kMul, g, n.saved[0]), n.shape[1]));
  }
}
// out = a / b; saved b, out. d/da = 1/b, d/db = −a/b² = −out/b
void div_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor gb = ops::binary(BinaryOp::kDiv, g, n.saved[0]);
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::reduce_to_shape(gb, n.shape[0]));
  if (n.in[1] >= 0) {
    const Tensor d = ops::binary(BinaryOp::kMul, gb, n.saved[1]);
    t.accumulate(n.in[1], scaled(ops::reduce_to_shape(d, n.shape[1]), -1.0f));
  }
}
// out = max(a, b) (f[0] = 1) or min(a, b) (f[0] = 0); saved a, b. Ties go to a.
void minmax_backward(Tape& t, const Node& n, Tensor g) {
  const bool is_max = n.f[0] != 0;
  // 1 where a was chosen, in the broadcast shape.
  const Tensor mask =
      ops::binary(is_max ? BinaryOp::kGreaterEqual : BinaryOp::kLessEqual, n.saved[0], n.saved[1]);
  const Tensor ga = ops::binary(BinaryOp::kMul, g, mask);
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::reduce_to_shape(ga, n.shape[0]));
  if (n.in[1] >= 0) {
    t.accumulate(n.in[1], ops::reduce_to_shape(ops::binary(BinaryOp::kSub, g, ga), n.shape[1]));
  }
}

Tensor record_binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = ops::binary(op, a, b);
  Tape* t = recording_tape(a, &b);
  if (t == nullptr) return out;
  const int32_t ia = t->node_of(a), ib = t->node_of(b);
  switch (op) {
    case BinaryOp::kAdd: {
      Node& n = t->record(add_backward, out, ia, ib);
      n.shape[0] = a.shape();
      n.shape[1] = b.shape();
      break;
    }
    case BinaryOp::kSub: {
      Node& n = t->record(sub_backward, out, ia, ib);
      n.shape[0] = a.shape();
      n.shape[1] = b.shape();
      break;
    }
    case BinaryOp::kMul: {
      Node& n = t->record(mul_backward, out, ia, ib);
      n.saved[0] = stop_gradient(a);
      n.saved[1] = stop_gradient(b);
      n.shape[0] = a.shape();
      n.shape[1] = b.shape();
      break;
    }
    case BinaryOp::kDiv: {
      Tensor saved_out = stop_gradient(out);
      Node& n = t->record(div_backward, out, ia, ib);
      n.saved[0] = stop_gradient(b);
      n.saved[1] = std::move(saved_out);
      n.shape[0] = a.shape();
      n.shape[1] = b.shape();
      break;
    }
    case BinaryOp::kGreaterEqual:
    case BinaryOp::kLessEqual:
      throw InvalidArgumentError("comparisons are not differentiable");
    case BinaryOp::kMaximum:
    case BinaryOp::kMinimum: {
      Node& n = t->record(minmax_backward, out, ia, ib);
      n.saved[0] = stop_gradient(a);
      n.saved[1] = stop_gradient(b);
      n.shape[0] = a.shape();
      n.shape[1] = b.shape();
      n.f[0] = op == BinaryOp::kMaximum ? 1.0f : 0.0f;
      break;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Unary ops: saved[0] = x, saved[1] = out.

// out = x · f[0] + f[1]
void scale_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], n.f[0] == 1.0f ? std::move(g) : scaled(g, n.f[0]));
}
// out = −x
void neg_backward(Tape& t, const Node& n, Tensor g) { t.accumulate(n.in[0], scaled(g, -1.0f)); }
// out = exp(x): d = out
void exp_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::binary(BinaryOp::kMul, g, n.saved[1]));
}
// out = log(x): d = 1/x
void log_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::binary(BinaryOp::kDiv, g, n.saved[0]));
}
// out = sqrt(x): d = 0.5 / out
void sqrt_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], map1(g, n.saved[1], [](float gi, float o) { return 0.5f * gi / o; }));
}
// out = x²: d = 2x
void square_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], map1(g, n.saved[0], [](float gi, float x) { return 2.0f * gi * x; }));
}
// out = |x|: d = sign(x)
void abs_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], map1(g, n.saved[0],
                             [](float gi, float x) { return x > 0 ? gi : (x < 0 ? -gi : 0.0f); }));
}
// out = x − logsumexp(x): dx = g − softmax(x) Σ g, per row
void log_softmax_backward(Tape& t, const Node& n, Tensor g) {
  Tensor dx = writable(std::move(g));
  const Tensor& out = n.saved[1];
  const int64_t cols = out.dim(-1), rows = out.num_elements() / std::max<int64_t>(cols, 1);
  float* pd = dx.data<float>();
  const float* po = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0;
    for (int64_t c = 0; c < cols; ++c) s += pd[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) pd[r * cols + c] -= std::exp(po[r * cols + c]) * s;
  }
  t.accumulate(n.in[0], std::move(dx));
}
// out = clip(x, f[0], f[1]): d = 1 inside [lo, hi]
void clip_backward(Tape& t, const Node& n, Tensor g) {
  const float lo = n.f[0], hi = n.f[1];
  t.accumulate(n.in[0], map1(g, n.saved[0], [lo, hi](float gi, float x) {
                 return (x >= lo && x <= hi) ? gi : 0.0f;
               }));
}

Tensor record_unary(const Tensor& x, Tensor out, detail::BackwardFn fn, bool save_x, bool save_out,
                    int64_t i0 = 0) {
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Tensor saved_out = save_out ? stop_gradient(out) : Tensor();
  Node& n = t->record(fn, out, t->node_of(x));
  if (save_x) n.saved[0] = stop_gradient(x);
  n.saved[1] = std::move(saved_out);
  n.i[0] = i0;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Matrix ops.

// out = op(a) · op(b); saved a, b; i[0] = transpose_a, i[1] = transpose_b.
void matmul_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& a = n.saved[0];
  const Tensor& b = n.saved[1];
  const bool ta = n.i[0] != 0, tb = n.i[1] != 0;
  if (n.in[0] >= 0) {
    // C = A B → dA = g Bᵀ; C = Aᵀ B → dA = B gᵀ; C = A Bᵀ → dA = g B; C = Aᵀ Bᵀ → dA = Bᵀ gᵀ.
    Tensor da = !ta ? ops::matmul(g, b, false, !tb) : ops::matmul(b, g, tb, true);
    t.accumulate(n.in[0], std::move(da));
  }
  if (n.in[1] >= 0) {
    // C = A B → dB = Aᵀ g; C = Aᵀ B → dB = A g; C = A Bᵀ → dB = gᵀ A; C = Aᵀ Bᵀ → dB = gᵀ Aᵀ.
    Tensor db = !tb ? ops::matmul(a, g, !ta, false) : ops::matmul(g, a, true, ta);
    t.accumulate(n.in[1], std::move(db));
  }
}

// out = act(x · W + b); saved x [B, in], W [in, out], out (or x · W + b) [B, out]; i[0] = act.
void dense_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& x = n.saved[0];
  const Tensor& w = n.saved[1];
  const Tensor& y = n.saved[2];
  const int64_t batch = x.dim(0), in = x.dim(1), out = w.dim(1);
  Tensor dz = writable(std::move(g));  // dz = dy ⊙ act'(·)
  // saved[2] is the pre-activation z when the derivative needs it (i[1] = 1), else the output.
  const auto act = static_cast<Activation>(n.i[0]);
  const bool from_input = n.i[1] != 0;
  ops::activation_backward_inplace(act, from_input ? nullptr : y.data<float>(),
                                   from_input ? y.data<float>() : nullptr, dz.data<float>(), batch,
                                   out, ops::default_activation_alpha(act));
  // db = Σ_batch dz, from the dW product's pass over dz when there is one.
  Tensor db = n.in[2] >= 0 ? Tensor(Shape{out}) : Tensor();
  if (n.in[1] >= 0) {
    Tensor dw(Shape{in, out});  // dW = xᵀ dz
    ops::dense_gemm(true, false, in, out, batch, x.data<float>(), in, dz.data<float>(), out,
                    nullptr, dw.data<float>(), out, db.defined() ? db.data<float>() : nullptr);
    t.accumulate(n.in[1], std::move(dw));
  } else if (db.defined()) {
    ops::column_sum(dz.data<float>(), batch, out, db.data<float>());
  }
  if (db.defined()) t.accumulate(n.in[2], std::move(db));
  if (n.in[0] >= 0) {
    Tensor dx(Shape{batch, in});  // dx = dz Wᵀ
    ops::dense_gemm(false, true, batch, in, out, dz.data<float>(), out, w.data<float>(), out,
                    nullptr, dx.data<float>(), in);
    t.accumulate(n.in[0], std::move(dx));
  }
}

// out = Σ_axis x; shape[0] = x's shape, i[0] = has axis, i[1] = axis, f[0] = 1/count for mean.
void reduce_backward(Tape& t, const Node& n, Tensor g) {
  std::optional<int> axis;
  if (n.i[0]) axis = static_cast<int>(n.i[1]);
  Tensor dx = ops::expand_reduced(g, n.shape[0], axis);
  if (n.f[0] != 1.0f) {
    float* p = dx.data<float>();
    for (int64_t i = 0, m = dx.num_elements(); i < m; ++i) p[i] *= n.f[0];
  }
  t.accumulate(n.in[0], std::move(dx));
}

// out = reshape(x); shape[0] = x's shape.
void reshape_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], g.reshape(n.shape[0]));
}

// loss[b] = −log softmax(z)[b, y_b]; saved probs, labels. dz = g_b (p − onehot(y_b)).
void sparse_xent_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& p = n.saved[0];
  const Tensor& labels = n.saved[1];
  const int64_t batch = p.dim(0), classes = p.dim(1);
  Tensor dz(p.shape());
  const float* pp = p.data<float>();
  const float* pg = g.data<float>();
  float* pd = dz.data<float>();
  parallel_for(batch, grain_for(classes), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float gb = pg[b];
      for (int64_t c = 0; c < classes; ++c) pd[b * classes + c] = gb * pp[b * classes + c];
      pd[b * classes + ops::label_at(labels, b)] -= gb;
    }
  });
  t.accumulate(n.in[0], std::move(dz));
}

// loss[b] = −Σ_c y_bc log softmax(z)_bc; saved probs, y. dz = g_b (p Σ_c y_bc − y).
void xent_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& p = n.saved[0];
  const Tensor& y = n.saved[1];
  const int64_t batch = p.dim(0), classes = p.dim(1);
  Tensor dz(p.shape());
  const float* pp = p.data<float>();
  const float* py = y.data<float>();
  const float* pg = g.data<float>();
  float* pd = dz.data<float>();
  for (int64_t b = 0; b < batch; ++b) {
    float ysum = 0;
    for (int64_t c = 0; c < classes; ++c) ysum += py[b * classes + c];
    for (int64_t c = 0; c < classes; ++c) {
      pd[b * classes + c] = pg[b] * (pp[b * classes + c] * ysum - py[b * classes + c]);
    }
  }
  t.accumulate(n.in[0], std::move(dz));
}

// loss = max(x, 0) − x z + log(1 + exp(−|x|)); saved x, z. dx = g (sigmoid(x) − z).
void sigmoid_xent_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& x = n.saved[0];
  const Tensor& z = n.saved[1];
  Tensor dx(x.shape());
  const float* px = x.data<float>();
  const float* pz = z.data<float>();
  const float* pg = g.data<float>();
  float* pd = dx.data<float>();
  for (int64_t i = 0, m = x.num_elements(); i < m; ++i) {
    const float s =
        px[i] >= 0 ? 1.0f / (1.0f + std::exp(-px[i])) : std::exp(px[i]) / (1.0f + std::exp(px[i]));
    pd[i] = pg[i] * (s - pz[i]);
  }
  t.accumulate(n.in[0], std::move(dx));
}

// out[b] = x[b, y_b]; saved labels; shape[0] = x's shape. dx = scatter of g.
void pick_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& labels = n.saved[0];
  Tensor dx = Tensor::zeros(n.shape[0]);
  const int64_t batch = n.shape[0][0], classes = n.shape[0][1];
  float* pd = dx.data<float>();
  const float* pg = g.data<float>();
  for (int64_t b = 0; b < batch; ++b) pd[b * classes + ops::label_at(labels, b)] = pg[b];
  t.accumulate(n.in[0], std::move(dx));
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kAdd, a, b); }
Tensor subtract(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kSub, a, b); }
Tensor multiply(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kMul, a, b); }
Tensor divide(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kDiv, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kMaximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return record_binary(BinaryOp::kMinimum, a, b); }

Tensor scale(const Tensor& x, float alpha, float beta) {
  Tensor out = ops::affine(x, alpha, beta);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(scale_backward, out, t->node_of(x));
  n.f[0] = alpha;
  n.f[1] = beta;
  return out;
}

Tensor negative(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kNeg, x), neg_backward, false, false);
}
Tensor exp(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kExp, x), exp_backward, false, true);
}
Tensor log(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kLog, x), log_backward, true, false);
}
Tensor sqrt(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kSqrt, x), sqrt_backward, false, true);
}
Tensor square(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kSquare, x), square_backward, true, false);
}
Tensor abs(const Tensor& x) {
  return record_unary(x, ops::unary(UnaryOp::kAbs, x), abs_backward, true, false);
}

Tensor log_softmax(const Tensor& x) {
  return record_unary(x, ops::log_softmax(x), log_softmax_backward, false, true);
}

Tensor clip_by_value(const Tensor& x, float lo, float hi) {
  DTRAIN_CHECK(lo <= hi, "clip_by_value: lower bound ", lo, " exceeds upper bound ", hi);
  Tensor out = ops::clip(x, lo, hi);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(clip_backward, out, t->node_of(x));
  n.saved[0] = stop_gradient(x);
  n.f[0] = lo;
  n.f[1] = hi;
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  Tensor out = ops::matmul(a, b, transpose_a, transpose_b);
  Tape* t = recording_tape(a, &b);
  if (t == nullptr) return out;
  Node& n = t->record(matmul_backward, out, t->node_of(a), t->node_of(b));
  n.saved[0] = stop_gradient(a);
  n.saved[1] = stop_gradient(b);
  n.i[0] = transpose_a;
  n.i[1] = transpose_b;
  return out;
}

Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation act) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 2,
               "dense: expected float32 input [batch, features], got ",
               x.defined() ? dtype_name(x.dtype()) : "undefined", " ", x.shape().to_string());
  DTRAIN_CHECK(kernel.rank() == 2 && kernel.dim(0) == x.dim(1), "dense: input has ", x.dim(1),
               " features, kernel ", kernel.shape().to_string(), " expects ",
               kernel.rank() == 2 ? kernel.dim(0) : -1);
  const int64_t batch = x.dim(0), in = x.dim(1), units = kernel.dim(1);
  Tensor y(Shape{batch, units});
  if (bias.defined()) {
    DTRAIN_CHECK(bias.num_elements() == units, "dense: bias ", bias.shape().to_string(),
                 " does not match ", units, " units");
  }
  // y = b + x · W: the bias starts the GEMM's accumulators (no broadcast pass).
  ops::dense_gemm(false, false, batch, units, in, x.data<float>(), in, kernel.data<float>(), units,
                  bias.defined() ? bias.data<float>() : nullptr, y.data<float>(), units);
  Tape* t = bias.defined() ? recording_tape(x, &kernel, &bias) : recording_tape(x, &kernel);
  // Activations whose derivative the output does not give (gelu, swish) keep the
  // pre-activation: one extra buffer, only for them and only while recording.
  const bool keep_z = t != nullptr && ops::activation_needs_input(act);
  Tensor saved_y;
  if (keep_z) {
    saved_y = std::move(y);
    y = Tensor(Shape{batch, units});
    ops::activation(act, saved_y.data<float>(), y.data<float>(), batch, units,
                    ops::default_activation_alpha(act));
  } else {
    ops::activation_inplace(act, y.data<float>(), batch, units);
  }
  if (t == nullptr) return y;
  if (!keep_z) saved_y = stop_gradient(y);
  Node& n = t->record(dense_backward, y, t->node_of(x), t->node_of(kernel),
                      bias.defined() ? t->node_of(bias) : -1);
  n.saved[0] = stop_gradient(x);
  n.saved[1] = stop_gradient(kernel);
  n.saved[2] = std::move(saved_y);
  n.i[0] = static_cast<int64_t>(act);
  n.i[1] = keep_z ? 1 : 0;
  return y;
}

Tensor reduce_sum(const Tensor& x, std::optional<int> axis, bool keepdims) {
  Tensor out = ops::reduce_sum(x, axis, keepdims);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(reduce_backward, out, t->node_of(x));
  n.shape[0] = x.shape();
  n.i[0] = axis.has_value();
  n.i[1] = axis.value_or(0);
  n.f[0] = 1.0f;
  return out;
}

Tensor reduce_mean(const Tensor& x, std::optional<int> axis, bool keepdims) {
  Tensor out = ops::reduce_mean(x, axis, keepdims);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(reduce_backward, out, t->node_of(x));
  n.shape[0] = x.shape();
  n.i[0] = axis.has_value();
  n.i[1] = axis.value_or(0);
  const int64_t count = axis ? x.dim(*axis) : x.num_elements();
  n.f[0] = count == 0 ? 0.0f : 1.0f / static_cast<float>(count);
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor out = x.reshape(shape);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(reshape_backward, out, t->node_of(x));
  n.shape[0] = x.shape();
  return out;
}

namespace {
// The two softmax cross-entropies: the kernel computes the loss and, when recording, the
// probabilities its backward needs.
using XentKernel = Tensor (*)(const Tensor& logits, const Tensor& labels, Tensor* probs);
Tensor record_xent(XentKernel kernel, detail::BackwardFn backward, const Tensor& labels,
                   const Tensor& logits) {
  Tape* t = recording_tape(logits);
  Tensor probs;
  Tensor loss = kernel(logits, labels, t ? &probs : nullptr);
  if (t == nullptr) return loss;
  Node& n = t->record(backward, loss, t->node_of(logits));
  n.saved[0] = std::move(probs);
  n.saved[1] = stop_gradient(labels);
  return loss;
}
}  // namespace

Tensor sparse_softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits) {
  return record_xent(ops::sparse_softmax_cross_entropy, sparse_xent_backward, labels, logits);
}

Tensor softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits) {
  return record_xent(ops::softmax_cross_entropy, xent_backward, labels, logits);
}

Tensor sigmoid_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits) {
  DTRAIN_CHECK(labels.defined() && logits.defined() && labels.shape() == logits.shape() &&
                   labels.dtype() == DType::kFloat32 && logits.dtype() == DType::kFloat32,
               "sigmoid_cross_entropy_with_logits: labels ", labels.shape().to_string(),
               " and logits ", logits.shape().to_string(), " must be float32 of one shape");
  Tensor loss(logits.shape());
  const float* px = logits.data<float>();
  const float* pz = labels.data<float>();
  float* pl = loss.data<float>();
  for (int64_t i = 0, m = loss.num_elements(); i < m; ++i) {
    const float x = px[i];
    pl[i] = std::max(x, 0.0f) - x * pz[i] + std::log1p(std::exp(-std::fabs(x)));
  }
  Tape* t = recording_tape(logits);
  if (t == nullptr) return loss;
  Node& n = t->record(sigmoid_xent_backward, loss, t->node_of(logits));
  n.saved[0] = stop_gradient(logits);
  n.saved[1] = stop_gradient(labels);
  return loss;
}

Tensor pick(const Tensor& x, const Tensor& labels) {
  Tensor out = ops::pick(x, labels);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(pick_backward, out, t->node_of(x));
  n.saved[0] = stop_gradient(labels);
  n.shape[0] = x.shape();
  return out;
}

}  // namespace dtrain
