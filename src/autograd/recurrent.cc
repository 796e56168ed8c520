// recurrent_sequence, slice_sequence, reverse_sequence.
#include "dtrain/autograd/recurrent.h"

#include <algorithm>
#include <memory>

#include "dtrain/autograd/gradient_tape.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;

namespace {

// What the backward of one recurrent_sequence call needs (one allocation per call).
struct RecurrentSaved {
  ops::RecurrentSpec spec;
  Tensor x, kernel, recurrent_kernel;
  ops::RecurrentForward forward;
};

// states = rnn(x; W, U, b); in = x, W, U; i[0] = the bias's node (-1: none), i[1] = has bias.
void recurrent_backward(Tape& t, const Node& n, Tensor g) {
  const auto& s = *static_cast<const RecurrentSaved*>(n.attrs.get());
  ops::RecurrentGradients d = ops::recurrent_backward(s.spec, s.x, s.kernel, s.recurrent_kernel,
                                                      n.i[1] != 0, s.forward, g, n.in[0] >= 0);
  if (n.in[0] >= 0) t.accumulate(n.in[0], std::move(d.dx));
  t.accumulate(n.in[1], std::move(d.dkernel));
  t.accumulate(n.in[2], std::move(d.drecurrent_kernel));
  if (n.i[0] >= 0) t.accumulate(static_cast<int32_t>(n.i[0]), std::move(d.dbias));
}

// Copies x[:, t0:t1, f0:f1] of x [B, T, F] into out [B, t1 − t0, f1 − f0], or back (add).
void copy_block(const float* x, float* out, int64_t B, int64_t T, int64_t F, int64_t t0, int64_t t1,
                int64_t f0, int64_t f1, bool scatter) {
  const int64_t tw = t1 - t0, fw = f1 - f0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < tw; ++t) {
      float* src = const_cast<float*>(x) + (b * T + t0 + t) * F + f0;
      float* dst = out + (b * tw + t) * fw;
      if (scatter) {
        std::copy_n(dst, fw, src);
      } else {
        std::copy_n(src, fw, dst);
      }
    }
  }
}

// out = x[:, i[0]:i[1], shape[1][0]:shape[1][1]]; shape[0] = x's shape.
void slice_backward(Tape& t, const Node& n, Tensor g) {
  const Shape& xs = n.shape[0];
  Tensor dx = Tensor::zeros(xs);
  copy_block(dx.data<float>(), g.data<float>(), xs[0], xs[1], xs[2], n.i[0], n.i[1], n.shape[1][0],
             n.shape[1][1], /*scatter=*/true);
  t.accumulate(n.in[0], std::move(dx));
}

Tensor reverse_time(const Tensor& x) {
  Tensor out(x.shape());
  const int64_t B = x.dim(0), T = x.dim(1);
  const int64_t row = T == 0 || B == 0 ? 0 : x.num_elements() / (B * T);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(px + (b * T + t) * row, row, po + (b * T + T - 1 - t) * row);
    }
  }
  return out;
}

// out = a ++ b along the last axis; shape[0], shape[1] = a's and b's shapes.
void concat_backward(Tape& t, const Node& n, Tensor g) {
  const int64_t m = n.shape[0].dim(-1), k = n.shape[1].dim(-1);
  const int64_t rows = m + k == 0 ? 0 : g.num_elements() / (m + k);
  const float* pg = g.data<float>();
  for (int side = 0; side < 2; ++side) {
    if (n.in[side] < 0) continue;
    Tensor d(n.shape[side]);
    const int64_t w = side == 0 ? m : k, off = side == 0 ? 0 : m;
    float* pd = d.data<float>();
    for (int64_t r = 0; r < rows; ++r) std::copy_n(pg + r * (m + k) + off, w, pd + r * w);
    t.accumulate(n.in[side], std::move(d));
  }
}

void reverse_backward(Tape& t, const Node& n, Tensor g) { t.accumulate(n.in[0], reverse_time(g)); }

}  // namespace

Tensor recurrent_sequence(const ops::RecurrentSpec& spec, const Tensor& x, const Tensor& kernel,
                          const Tensor& recurrent_kernel, const Tensor& bias, const char* who,
                          const Tensor& mask) {
  ops::RecurrentForward fwd =
      ops::recurrent_forward(spec, x, kernel, recurrent_kernel, bias, who, mask);
  Tensor states = fwd.states;
  Tape* t = Tape::current();
  if (t == nullptr) return states;
  const int32_t ix = t->node_of(x), iw = t->node_of(kernel), iu = t->node_of(recurrent_kernel);
  const int32_t ib = bias.defined() ? t->node_of(bias) : -1;
  if (ix < 0 && iw < 0 && iu < 0 && ib < 0) return states;
  auto saved = std::make_shared<RecurrentSaved>(RecurrentSaved{
      spec, stop_gradient(x), stop_gradient(kernel), stop_gradient(recurrent_kernel), fwd});
  saved->forward.states = stop_gradient(fwd.states);
  Node& n = t->record(recurrent_backward, states, ix, iw, iu);
  n.i[0] = ib;
  n.i[1] = bias.defined();
  n.attrs = std::move(saved);
  return states;
}

Tensor slice_sequence(const Tensor& x, int64_t t_begin, int64_t t_end, int64_t f_begin,
                      int64_t f_end) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 3 && 0 <= t_begin &&
                   t_begin <= t_end && t_end <= x.dim(1) && 0 <= f_begin && f_begin <= f_end &&
                   f_end <= x.dim(2),
               "slice_sequence: cannot take [:, ", t_begin, ":", t_end, ", ", f_begin, ":", f_end,
               "] of ", x.defined() ? x.shape().to_string() : "undefined");
  Tensor out(Shape{x.dim(0), t_end - t_begin, f_end - f_begin});
  copy_block(x.data<float>(), out.data<float>(), x.dim(0), x.dim(1), x.dim(2), t_begin, t_end,
             f_begin, f_end, /*scatter=*/false);
  Tape* t = Tape::current();
  if (t == nullptr || t->node_of(x) < 0) return out;
  Node& n = t->record(slice_backward, out, t->node_of(x));
  n.shape[0] = x.shape();
  n.i[0] = t_begin;
  n.i[1] = t_end;
  n.shape[1] = Shape{f_begin, f_end};
  return out;
}

Tensor concat_last_axis(const Tensor& a, const Tensor& b) {
  DTRAIN_CHECK(a.defined() && b.defined() && a.dtype() == DType::kFloat32 &&
                   b.dtype() == DType::kFloat32 && a.rank() >= 1 && a.rank() == b.rank(),
               "concat_last_axis: expected float32 tensors of one rank, got ",
               a.defined() ? a.shape().to_string() : "undefined", " and ",
               b.defined() ? b.shape().to_string() : "undefined");
  Shape out_shape = a.shape();
  for (int d = 0; d + 1 < a.rank(); ++d) {
    DTRAIN_CHECK(a.dim(d) == b.dim(d), "concat_last_axis: ", a.shape().to_string(), " and ",
                 b.shape().to_string(), " differ before the last axis");
  }
  const int64_t m = a.dim(-1), k = b.dim(-1);
  out_shape[out_shape.rank() - 1] = m + k;
  Tensor out(out_shape);
  const int64_t rows = m + k == 0 ? 0 : out.num_elements() / (m + k);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(pa + r * m, m, po + r * (m + k));
    std::copy_n(pb + r * k, k, po + r * (m + k) + m);
  }
  Tape* t = Tape::current();
  if (t == nullptr || (t->node_of(a) < 0 && t->node_of(b) < 0)) return out;
  Node& n = t->record(concat_backward, out, t->node_of(a), t->node_of(b));
  n.shape[0] = a.shape();
  n.shape[1] = b.shape();
  return out;
}

Tensor reverse_sequence(const Tensor& x) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() >= 2,
               "reverse_sequence: expected float32 [batch, time, ...], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  Tensor out = reverse_time(x);
  Tape* t = Tape::current();
  if (t == nullptr || t->node_of(x) < 0) return out;
  t->record(reverse_backward, out, t->node_of(x));
  return out;
}

}  // namespace dtrain
