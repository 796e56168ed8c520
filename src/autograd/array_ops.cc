// Differentiable concat and slice: forward through dtrain/ops/array_ops, backward recorded on
// the tape. A concat of more than three inputs keeps its input nodes in the node's attrs.
#include "dtrain/autograd/array_ops.h"

#include <numeric>

#include "dtrain/ops/array_ops.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;

namespace {

// The input nodes and sizes along the axis of a concat of more than three inputs.
struct ConcatAttrs {
  std::vector<int32_t> inputs;
  std::vector<int64_t> sizes;
};

// out = concat(x_0, ..., x_{n-1}) along axis i[0]; for n ≤ 3 the sizes along the axis are in
// shape[0] and the inputs in in[], else in attrs (ConcatAttrs). dx_k = slice of g.
void concat_backward(Tape& t, const Node& n, Tensor g) {
  const int axis = static_cast<int>(n.i[0]);
  int64_t offset = 0;
  if (n.attrs) {
    const auto& a = *static_cast<const ConcatAttrs*>(n.attrs.get());
    for (size_t k = 0; k < a.inputs.size(); ++k) {
      if (a.inputs[k] >= 0) t.accumulate(a.inputs[k], ops::slice_axis(g, axis, offset, a.sizes[k]));
      offset += a.sizes[k];
    }
    return;
  }
  for (int k = 0; k < n.shape[0].rank(); ++k) {
    if (n.in[k] >= 0) t.accumulate(n.in[k], ops::slice_axis(g, axis, offset, n.shape[0][k]));
    offset += n.shape[0][k];
  }
}

// out = x[..., begin:begin+size, ...] along axis i[0], begin i[1]; shape[0] = x's shape.
// dx = zeros with g at the slice.
void slice_backward(Tape& t, const Node& n, Tensor g) {
  Tensor dx = Tensor::zeros(n.shape[0]);
  ops::add_slice_inplace(dx, g, static_cast<int>(n.i[0]), n.i[1]);
  t.accumulate(n.in[0], std::move(dx));
}

}  // namespace

Tensor concat(std::span<const Tensor> xs, int axis) {
  Tensor out = ops::concat(xs, axis);
  Tape* t = Tape::current();
  if (t == nullptr) return out;
  bool any = false;
  for (const Tensor& x : xs) any = any || t->node_of(x) >= 0;
  if (!any) return out;
  const int a = ops::normalize_axis(axis, out.rank(), "concat");
  if (xs.size() <= 3) {
    Node& n =
        t->record(concat_backward, out, t->node_of(xs[0]), xs.size() > 1 ? t->node_of(xs[1]) : -1,
                  xs.size() > 2 ? t->node_of(xs[2]) : -1);
    n.i[0] = a;
    Shape sizes;
    for (const Tensor& x : xs) sizes.push_back(x.dim(a));
    n.shape[0] = sizes;
    return out;
  }
  auto attrs = std::make_shared<ConcatAttrs>();
  for (const Tensor& x : xs) {
    attrs->inputs.push_back(t->node_of(x));
    attrs->sizes.push_back(x.dim(a));
  }
  Node& n = t->record(concat_backward, out, -1);
  n.i[0] = a;
  n.attrs = std::move(attrs);
  return out;
}

Tensor concat(std::initializer_list<Tensor> xs, int axis) {
  return concat(std::span<const Tensor>(xs.begin(), xs.size()), axis);
}

Tensor slice_axis(const Tensor& x, int axis, int64_t begin, int64_t size) {
  Tensor out = ops::slice_axis(x, axis, begin, size);
  Tape* t = Tape::current();
  if (t == nullptr || t->node_of(x) < 0) return out;
  Node& n = t->record(slice_backward, out, t->node_of(x));
  n.i[0] = ops::normalize_axis(axis, x.rank(), "slice");
  n.i[1] = begin;
  n.shape[0] = x.shape();
  return out;
}

std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> sizes, int axis) {
  const int a = ops::normalize_axis(axis, x.rank(), "split");
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  DTRAIN_CHECK(total == x.dim(a), "split: sizes sum to ", total, " but dimension ", a, " of shape ",
               x.shape().to_string(), " is ", x.dim(a));
  std::vector<Tensor> out;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    out.push_back(slice_axis(x, a, offset, s));
    offset += s;
  }
  return out;
}

}  // namespace dtrain
