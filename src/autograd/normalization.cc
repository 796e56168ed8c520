// Differentiable batch and layer normalization: the fused kernels of ops/normalization.h
// forward, their fused backward recorded on the tape.
#include "dtrain/autograd/normalization.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/normalization.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;

namespace {

Tape* recording_tape(const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  Tape* t = Tape::current();
  if (t == nullptr) return nullptr;
  if (t->node_of(x) >= 0 || (gamma.defined() && t->node_of(gamma) >= 0) ||
      (beta.defined() && t->node_of(beta) >= 0)) {
    return t;
  }
  return nullptr;
}

int32_t node_or_none(Tape& t, const Tensor& x) { return x.defined() ? t.node_of(x) : -1; }

const float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

ops::ChannelLayout layout_of(const Shape& s, int axis) {
  ops::ChannelLayout l;
  for (int d = 0; d < axis; ++d) l.outer *= s[d];
  l.channels = s[axis];
  for (int d = axis + 1; d < s.rank(); ++d) l.inner *= s[d];
  return l;
}

int check_bn(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta, int axis) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32, op, ": expected a float32 input");
  DTRAIN_CHECK(x.rank() >= 1, op, ": expected an input of rank >= 1, got a scalar");
  const int a = axis < 0 ? axis + x.rank() : axis;
  DTRAIN_CHECK(a >= 0 && a < x.rank(), op, ": axis ", axis, " out of range for input ",
               x.shape().to_string());
  const int64_t c = x.dim(a);
  for (const Tensor* p : {&gamma, &beta}) {
    DTRAIN_CHECK(!p->defined() || (p->dtype() == DType::kFloat32 && p->num_elements() == c), op,
                 ": gamma/beta ", p->defined() ? p->shape().to_string() : "", " do not match ", c,
                 " channels of input ", x.shape().to_string());
  }
  return a;
}

void accumulate_params(Tape& t, const Node& n, Tensor& dgamma, Tensor& dbeta) {
  if (n.in[1] >= 0) t.accumulate(n.in[1], std::move(dgamma));
  if (n.in[2] >= 0) t.accumulate(n.in[2], std::move(dbeta));
}

// y = batch_norm(x; batch moments); in = (x, γ, β); saved x, γ, stats [2, C] = (mean,
// inv_std); i[0] = axis; shape[0] = γ's shape, shape[1] = β's shape; attrs = BatchNormSync.
void bn_training_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& x = n.saved[0];
  const Tensor& gamma = n.saved[1];
  const Tensor& stats = n.saved[2];
  const ops::ChannelLayout l = layout_of(x.shape(), static_cast<int>(n.i[0]));
  const int64_t c = l.channels;
  Tensor dx = n.in[0] >= 0 ? Tensor(x.shape()) : Tensor();
  Tensor dgamma = n.in[1] >= 0 ? Tensor(n.shape[0]) : Tensor();
  Tensor dbeta = n.in[2] >= 0 ? Tensor(n.shape[1]) : Tensor();
  const float* mean = stats.data<float>();
  const float* inv_std = mean + c;
  const auto* sync = static_cast<const BatchNormSync*>(n.attrs.get());
  if (sync != nullptr) {
    // Global Σdy, Σdy·x̂ and count: every replica reduces, whether or not it needs dx.
    thread_local std::vector<double> sums;
    sums.assign(static_cast<size_t>(2 * c + 1), 0.0);
    ops::batch_norm_backward_sums(g.data<float>(), x.data<float>(), l, mean, inv_std, sums.data());
    sums[2 * c] = static_cast<double>(l.count());
    sync->all_reduce_sum(sums);
    ops::batch_norm_backward(g.data<float>(), x.data<float>(), l, mean, inv_std,
                             data_or_null(gamma), dx.defined() ? dx.data<float>() : nullptr,
                             dgamma.defined() ? dgamma.data<float>() : nullptr,
                             dbeta.defined() ? dbeta.data<float>() : nullptr, sums.data(),
                             static_cast<int64_t>(sums[2 * c]));
  } else {
    ops::batch_norm_backward(g.data<float>(), x.data<float>(), l, mean, inv_std,
                             data_or_null(gamma), dx.defined() ? dx.data<float>() : nullptr,
                             dgamma.defined() ? dgamma.data<float>() : nullptr,
                             dbeta.defined() ? dbeta.data<float>() : nullptr);
  }
  if (n.in[0] >= 0) t.accumulate(n.in[0], std::move(dx));
  accumulate_params(t, n, dgamma, dbeta);
}

// y = batch_norm(x; fixed moments); saved as bn_training_backward's.
void bn_inference_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& x = n.saved[0];
  const Tensor& gamma = n.saved[1];
  const Tensor& stats = n.saved[2];
  const ops::ChannelLayout l = layout_of(x.shape(), static_cast<int>(n.i[0]));
  Tensor dx = n.in[0] >= 0 ? Tensor(x.shape()) : Tensor();
  Tensor dgamma = n.in[1] >= 0 ? Tensor(n.shape[0]) : Tensor();
  Tensor dbeta = n.in[2] >= 0 ? Tensor(n.shape[1]) : Tensor();
  const float* mean = stats.data<float>();
  ops::batch_norm_inference_backward(g.data<float>(), x.data<float>(), l, mean, mean + l.channels,
                                     data_or_null(gamma), dx.defined() ? dx.data<float>() : nullptr,
                                     dgamma.defined() ? dgamma.data<float>() : nullptr,
                                     dbeta.defined() ? dbeta.data<float>() : nullptr);
  if (n.in[0] >= 0) t.accumulate(n.in[0], std::move(dx));
  accumulate_params(t, n, dgamma, dbeta);
}

// y = layer_norm(x); saved x, γ, stats [rows, 2]; i[0] = rows; shapes of γ, β.
void ln_backward(Tape& t, const Node& n, Tensor g) {
  const Tensor& x = n.saved[0];
  const Tensor& gamma = n.saved[1];
  const int64_t rows = n.i[0], d = rows > 0 ? x.num_elements() / rows : 0;
  Tensor dx = n.in[0] >= 0 ? Tensor(x.shape()) : Tensor();
  Tensor dgamma = n.in[1] >= 0 ? Tensor(n.shape[0]) : Tensor();
  Tensor dbeta = n.in[2] >= 0 ? Tensor(n.shape[1]) : Tensor();
  ops::layer_norm_backward(g.data<float>(), x.data<float>(), rows, d, n.saved[2].data<float>(),
                           data_or_null(gamma), dx.defined() ? dx.data<float>() : nullptr,
                           dgamma.defined() ? dgamma.data<float>() : nullptr,
                           dbeta.defined() ? dbeta.data<float>() : nullptr);
  if (n.in[0] >= 0) t.accumulate(n.in[0], std::move(dx));
  accumulate_params(t, n, dgamma, dbeta);
}

Tensor record(detail::BackwardFn fn, Tensor& y, const Tensor& x, const Tensor& gamma,
              const Tensor& beta, Tensor stats, int64_t i0,
              const std::shared_ptr<const BatchNormSync>& sync = nullptr) {
  Tape* t = recording_tape(x, gamma, beta);
  if (t == nullptr) return y;
  Node& n = t->record(fn, y, t->node_of(x), node_or_none(*t, gamma), node_or_none(*t, beta));
  n.saved[0] = stop_gradient(x);
  if (gamma.defined()) n.saved[1] = stop_gradient(gamma);
  n.saved[2] = std::move(stats);
  n.i[0] = i0;
  if (gamma.defined()) n.shape[0] = gamma.shape();
  if (beta.defined()) n.shape[1] = beta.shape();
  if (sync) n.attrs = sync;  // the collective for the backward (a copy: no allocation)
  return y;
}

}  // namespace

Tensor batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, int axis,
                           float epsilon, BatchNormMoments* moments,
                           const std::shared_ptr<const BatchNormSync>& sync) {
  const int a = check_bn("batch_norm_training", x, gamma, beta, axis);
  const ops::ChannelLayout l = layout_of(x.shape(), a);
  const int64_t c = l.channels;
  Tensor stats(Shape{2, c});  // mean, then inv_std
  Tensor var(Shape{c});
  float* mean = stats.data<float>();
  if (sync == nullptr) {
    ops::batch_norm_moments(x.data<float>(), l, mean, var.data<float>());
  } else {
    // Global moments: Σx, Σx² (in double) and the count over every replica, in one pass and
    // one collective.
    thread_local std::vector<double> sums;
    thread_local std::vector<float> zeros;
    sums.assign(static_cast<size_t>(2 * c + 1), 0.0);
    zeros.assign(static_cast<size_t>(c), 0.0f);
    double* sq = sums.data() + c;
    ops::channel_sums(x.data<float>(), l, sums.data(), zeros.data(), sq);
    sums[2 * c] = static_cast<double>(l.count());
    sync->all_reduce_sum(sums);
    const double m = sums[2 * c] > 0 ? sums[2 * c] : 1.0;
    for (int64_t j = 0; j < c; ++j) {
      const double mu = sums[j] / m;
      mean[j] = static_cast<float>(mu);
      var.data<float>()[j] = static_cast<float>(std::max(0.0, sq[j] / m - mu * mu));
    }
  }
  Tensor y(x.shape());
  ops::batch_norm_apply(x.data<float>(), l, mean, var.data<float>(), data_or_null(gamma),
                        data_or_null(beta), epsilon, y.data<float>(), mean + c);
  if (moments) {
    moments->mean = Tensor(Shape{c});
    std::copy_n(mean, c, moments->mean.data<float>());
    moments->variance = var;
  }
  return record(bn_training_backward, y, x, gamma, beta, std::move(stats), a, sync);
}

Tensor batch_norm_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& mean, const Tensor& variance, int axis, float epsilon) {
  const int a = check_bn("batch_norm_inference", x, gamma, beta, axis);
  const ops::ChannelLayout l = layout_of(x.shape(), a);
  const int64_t c = l.channels;
  DTRAIN_CHECK(mean.defined() && variance.defined() && mean.num_elements() == c &&
                   variance.num_elements() == c,
               "batch_norm_inference: mean/variance do not match ", c, " channels of input ",
               x.shape().to_string());
  Tensor stats(Shape{2, c});
  std::copy_n(mean.data<float>(), c, stats.data<float>());
  Tensor y(x.shape());
  ops::batch_norm_apply(x.data<float>(), l, mean.data<float>(), variance.data<float>(),
                        data_or_null(gamma), data_or_null(beta), epsilon, y.data<float>(),
                        stats.data<float>() + c);
  return record(bn_inference_backward, y, x, gamma, beta, std::move(stats), a);
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int begin_axis,
                  float epsilon) {
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() >= 1,
               "layer_norm: expected a float32 input of rank >= 1");
  const int b = begin_axis < 0 ? begin_axis + x.rank() : begin_axis;
  DTRAIN_CHECK(b >= 0 && b < x.rank(), "layer_norm: axis ", begin_axis, " out of range for input ",
               x.shape().to_string());
  int64_t rows = 1;
  for (int d = 0; d < b; ++d) rows *= x.dim(d);
  const int64_t d = rows > 0 ? x.num_elements() / rows : 0;
  for (const Tensor* p : {&gamma, &beta}) {
    DTRAIN_CHECK(!p->defined() || (p->dtype() == DType::kFloat32 && p->num_elements() == d),
                 "layer_norm: gamma/beta ", p->defined() ? p->shape().to_string() : "",
                 " do not match the normalized dims of input ", x.shape().to_string());
  }
  Tensor y(x.shape());
  Tensor stats(Shape{rows, 2});
  ops::layer_norm_forward(x.data<float>(), rows, d, data_or_null(gamma), data_or_null(beta),
                          epsilon, y.data<float>(), stats.data<float>());
  return record(ln_backward, y, x, gamma, beta, std::move(stats), rows);
}

}  // namespace dtrain
