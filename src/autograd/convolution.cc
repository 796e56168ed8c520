// Differentiable convolutions and pools: forward through dtrain/ops, backward recorded on the
// tape with the op's attributes in Node::attrs.
#include "dtrain/autograd/convolution.h"

#include <algorithm>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/error.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;
using ops::Activation;

namespace {

Tape* recording_tape(const Tensor& a, const Tensor* b = nullptr, const Tensor* c = nullptr) {
  Tape* t = Tape::current();
  if (t == nullptr) return nullptr;
  if (t->node_of(a) >= 0 || (b && b->defined() && t->node_of(*b) >= 0) ||
      (c && c->defined() && t->node_of(*c) >= 0)) {
    return t;
  }
  return nullptr;
}

int32_t node_or_none(Tape* t, const Tensor& x) { return x.defined() ? t->node_of(x) : -1; }

Tensor writable(Tensor g) { return g.use_count() == 1 ? std::move(g) : g.clone(); }

const ops::Conv2DAttrs& conv_attrs(const Node& n) {
  return *static_cast<const ops::Conv2DAttrs*>(n.attrs.get());
}
const ops::Pool2DAttrs& pool_attrs(const Node& n) {
  return *static_cast<const ops::Pool2DAttrs*>(n.attrs.get());
}

// dz = dy ⊙ act'(·) through saved[2]: the output, or the pre-activation z for activations whose
// derivative the output does not give (gelu, swish; i[1] = 1); dy itself for linear.
Tensor activation_grad(const Node& n, Tensor g) {
  const auto act = static_cast<Activation>(n.i[0]);
  if (act == Activation::kLinear) return g;
  Tensor dz = writable(std::move(g));
  const Tensor& saved = n.saved[2];
  const bool from_input = n.i[1] != 0;
  const int64_t cols = saved.dim(-1);
  ops::activation_backward_inplace(act, from_input ? nullptr : saved.data<float>(),
                                   from_input ? saved.data<float>() : nullptr, dz.data<float>(),
                                   saved.num_elements() / std::max<int64_t>(cols, 1), cols,
                                   ops::default_activation_alpha(act));
  return dz;
}

Tensor bias_grad(const Tensor& dz) {
  const int64_t cols = dz.dim(-1);
  Tensor db(Shape{cols});
  ops::column_sum(dz.data<float>(), dz.num_elements() / std::max<int64_t>(cols, 1), cols,
                  db.data<float>());
  return db;
}

// ReLU's dz = dy ⊙ [y > 0] and the bias gradient Σ dz over rows in one pass over dz (the two
// separate passes read it twice): the same sums in the same order as column_sum.
Tensor relu_grad_and_bias_grad(const Node& n, Tensor g, Tensor* db) {
  Tensor dz = writable(std::move(g));
  const Tensor& y = n.saved[2];
  const int64_t cols = y.dim(-1);
  const int64_t rows = y.num_elements() / std::max<int64_t>(cols, 1);
  *db = Tensor(Shape{cols});
  ops::relu_backward_column_sum(y.data<float>(), dz.data<float>(), rows, cols, db->data<float>());
  return dz;
}

// y = act(conv2d(x, W) + b); saved x, W and y, or z = conv2d(x, W) + b for gelu and swish (i[1] =
// 1; nothing for linear); i[0] = act.
void conv2d_backward(Tape& t, const Node& n, Tensor g) {
  const ops::Conv2DAttrs& a = conv_attrs(n);
  const Tensor& x = n.saved[0];
  const Tensor& w = n.saved[1];
  if (static_cast<Activation>(n.i[0]) == Activation::kRelu && n.in[2] >= 0) {
    Tensor db;
    const Tensor dz = relu_grad_and_bias_grad(n, std::move(g), &db);
    t.accumulate(n.in[2], std::move(db));
    if (n.in[1] >= 0) t.accumulate(n.in[1], ops::conv2d_backward_filter(x, dz, w.shape(), a));
    if (n.in[0] >= 0) t.accumulate(n.in[0], ops::conv2d_backward_input(dz, w, x.shape(), a));
    return;
  }
  const Tensor dz = activation_grad(n, std::move(g));
  if (n.in[2] >= 0) t.accumulate(n.in[2], bias_grad(dz));
  if (n.in[1] >= 0) t.accumulate(n.in[1], ops::conv2d_backward_filter(x, dz, w.shape(), a));
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::conv2d_backward_input(dz, w, x.shape(), a));
}

// y = act(conv2d_backward_input(x, W) + b), the transposed convolution: x plays dy's part, so
// dx = conv2d(dz, W) and dW = conv2d_backward_filter(dz, x).
void conv2d_transpose_backward(Tape& t, const Node& n, Tensor g) {
  const ops::Conv2DAttrs& a = conv_attrs(n);
  const Tensor& x = n.saved[0];
  const Tensor& w = n.saved[1];
  const Tensor dz = activation_grad(n, std::move(g));
  if (n.in[2] >= 0) t.accumulate(n.in[2], bias_grad(dz));
  if (n.in[1] >= 0) t.accumulate(n.in[1], ops::conv2d_backward_filter(dz, x, w.shape(), a));
  if (n.in[0] >= 0) t.accumulate(n.in[0], ops::conv2d(dz, w, Tensor(), a));
}

Tensor finish_conv(Tensor y, const Tensor& x, const Tensor& kernel, const Tensor& bias,
                   const ConvAttrsPtr& attrs, Activation act, detail::BackwardFn backward) {
  const int64_t cols = y.dim(-1);
  Tape* t = recording_tape(x, &kernel, &bias);
  // As dense: gelu and swish keep the pre-activation (one extra buffer, only while recording).
  const bool keep_z = t != nullptr && ops::activation_needs_input(act);
  Tensor saved_y = keep_z ? y.clone() : Tensor();
  ops::activation_inplace(act, y.data<float>(), y.num_elements() / std::max<int64_t>(cols, 1),
                          cols);
  if (t == nullptr) return y;
  if (!keep_z && act != Activation::kLinear) saved_y = stop_gradient(y);
  Node& n = t->record(backward, y, t->node_of(x), t->node_of(kernel), node_or_none(t, bias));
  n.saved[0] = stop_gradient(x);
  n.saved[1] = stop_gradient(kernel);
  n.saved[2] = std::move(saved_y);
  n.i[0] = static_cast<int64_t>(act);
  n.i[1] = keep_z ? 1 : 0;
  n.attrs = attrs;
  return y;
}

void check_attrs(const void* attrs, const char* op) {
  DTRAIN_CHECK(attrs != nullptr, op, ": attributes are null");
}

// out = to_channels_last(x) (i[0] = 1) or to_channels_first(x) (i[0] = 0).
void move_channels_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], n.i[0] ? ops::to_channels_first(g) : ops::to_channels_last(g));
}

// y = pool2d(kind = i[0], x); saved x.
void pool2d_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::pool2d_backward(static_cast<ops::PoolKind>(n.i[0]), n.saved[0], g,
                                             pool_attrs(n)));
}

// y = global_pool(kind = i[0], x); saved x.
void global_pool_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0],
               ops::global_pool_backward(static_cast<ops::PoolKind>(n.i[0]), n.saved[0], g));
}

Tensor record_pool(ops::PoolKind kind, const Tensor& x, const PoolAttrsPtr& attrs, const char* op) {
  check_attrs(attrs.get(), op);
  Tensor y = ops::pool2d(kind, x, *attrs, op);
  Tape* t = recording_tape(x);
  if (t == nullptr) return y;
  Node& n = t->record(pool2d_backward, y, t->node_of(x));
  n.saved[0] = stop_gradient(x);
  n.i[0] = static_cast<int64_t>(kind);
  n.attrs = attrs;
  return y;
}

Tensor record_global_pool(ops::PoolKind kind, const Tensor& x) {
  Tensor y = ops::global_pool(kind, x);
  Tape* t = recording_tape(x);
  if (t == nullptr) return y;
  Node& n = t->record(global_pool_backward, y, t->node_of(x));
  n.saved[0] = stop_gradient(x);
  n.i[0] = static_cast<int64_t>(kind);
  return y;
}

Tensor record_move_channels(const Tensor& x, bool to_last) {
  Tensor y = to_last ? ops::to_channels_last(x) : ops::to_channels_first(x);
  Tape* t = recording_tape(x);
  if (t == nullptr) return y;
  Node& n = t->record(move_channels_backward, y, t->node_of(x));
  n.i[0] = to_last ? 1 : 0;
  return y;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const ConvAttrsPtr& attrs,
              Activation act) {
  check_attrs(attrs.get(), "conv2d");
  Tensor y = ops::conv2d(x, kernel, bias, *attrs, "conv2d");
  return finish_conv(std::move(y), x, kernel, bias, attrs, act, conv2d_backward);
}

Tensor conv1d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const ConvAttrsPtr& attrs,
              Activation act) {
  check_attrs(attrs.get(), "conv1d");
  DTRAIN_CHECK(x.defined() && x.rank() == 3,
               "conv1d: expected input [batch, steps, channels], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  DTRAIN_CHECK(kernel.defined() && kernel.rank() == 3,
               "conv1d: expected kernel [k, in/groups, filters], got ",
               kernel.defined() ? kernel.shape().to_string() : "undefined");
  DTRAIN_CHECK(attrs->strides[0] == 1 && attrs->dilation[0] == 1,
               "conv1d: the height stride and dilation must be 1");
  const Tensor x4 = reshape(x, Shape{x.dim(0), 1, x.dim(1), x.dim(2)});
  const Tensor k4 = reshape(kernel, Shape{1, kernel.dim(0), kernel.dim(1), kernel.dim(2)});
  const Tensor y = conv2d(x4, k4, bias, attrs, act);
  return reshape(y, Shape{y.dim(0), y.dim(2), y.dim(3)});
}

Tensor depthwise_conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias,
                        const ConvAttrsPtr& attrs, Activation act) {
  check_attrs(attrs.get(), "depthwise_conv2d");
  DTRAIN_CHECK(x.defined() && x.rank() == 4,
               "depthwise_conv2d: expected input [batch, height, width, channels], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  DTRAIN_CHECK(kernel.defined() && kernel.rank() == 4 && kernel.dim(2) == x.dim(3),
               "depthwise_conv2d: kernel ",
               kernel.defined() ? kernel.shape().to_string() : "undefined",
               " does not match an input with ", x.dim(3), " channels");
  DTRAIN_CHECK(attrs->groups == x.dim(3), "depthwise_conv2d: attrs.groups is ", attrs->groups,
               " but must equal the ", x.dim(3), " input channels");
  // [kh, kw, c, dm] and the grouped HWIO kernel [kh, kw, 1, c·dm] share one memory layout:
  // output channel c·dm + m of group c.
  const Tensor k =
      reshape(kernel, Shape{kernel.dim(0), kernel.dim(1), 1, kernel.dim(2) * kernel.dim(3)});
  return conv2d(x, k, bias, attrs, act);
}

Tensor conv2d_transpose(const Tensor& x, const Tensor& kernel, const Tensor& bias,
                        const ConvAttrsPtr& attrs, Activation act) {
  check_attrs(attrs.get(), "conv2d_transpose");
  const ops::Conv2DAttrs& a = *attrs;
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 4,
               "conv2d_transpose: expected float32 input [batch, height, width, channels], got ",
               x.defined() ? x.shape().to_string() : "undefined");
  DTRAIN_CHECK(kernel.defined() && kernel.rank() == 4 && kernel.dim(3) == x.dim(3),
               "conv2d_transpose: kernel ",
               kernel.defined() ? kernel.shape().to_string() : "undefined",
               " [kh, kw, filters, in] does not match an input with ", x.dim(3), " channels");
  DTRAIN_CHECK(a.groups == 1, "conv2d_transpose: groups must be 1");
  DTRAIN_CHECK(a.padding != ops::Padding::kCausal,
               "conv2d_transpose: padding must be 'valid' or 'same'");
  const Shape out{x.dim(0),
                  ops::conv_transpose_output_size(x.dim(1), kernel.dim(0), a.strides[0],
                                                  a.dilation[0], a.padding),
                  ops::conv_transpose_output_size(x.dim(2), kernel.dim(1), a.strides[1],
                                                  a.dilation[1], a.padding),
                  kernel.dim(2)};
  Tensor y = ops::conv2d_backward_input(x, kernel, out, a);
  if (bias.defined()) {
    DTRAIN_CHECK(bias.num_elements() == kernel.dim(2), "conv2d_transpose: bias ",
                 bias.shape().to_string(), " does not match ", kernel.dim(2), " filters");
    ops::bias_add_inplace(y, bias);
  }
  return finish_conv(std::move(y), x, kernel, bias, attrs, act, conv2d_transpose_backward);
}

Tensor max_pool2d(const Tensor& x, const PoolAttrsPtr& attrs) {
  return record_pool(ops::PoolKind::kMax, x, attrs, "max_pool2d");
}
Tensor avg_pool2d(const Tensor& x, const PoolAttrsPtr& attrs) {
  return record_pool(ops::PoolKind::kAverage, x, attrs, "avg_pool2d");
}
Tensor global_max_pool(const Tensor& x) { return record_global_pool(ops::PoolKind::kMax, x); }
Tensor global_avg_pool(const Tensor& x) { return record_global_pool(ops::PoolKind::kAverage, x); }

Tensor to_channels_last(const Tensor& x) { return record_move_channels(x, true); }
Tensor to_channels_first(const Tensor& x) { return record_move_channels(x, false); }

}  // namespace dtrain
