// Differentiable layout ops: kernels from ops/reshaping.h, adjoints recorded on the tape.
#include "dtrain/autograd/reshaping.h"

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/reshaping.h"
#include "tape.h"

namespace dtrain {

using detail::Node;
using detail::Tape;

namespace {

Tape* recording_tape(const Tensor& x) {
  Tape* t = Tape::current();
  return t != nullptr && t->node_of(x) >= 0 ? t : nullptr;
}

// out = transpose(x, perm); i[0] packs perm (4 bits per axis), i[1] = rank. dx = transpose(g,
// perm⁻¹).
void transpose_backward(Tape& t, const Node& n, Tensor g) {
  const int rank = static_cast<int>(n.i[1]);
  int inverse[Shape::kMaxRank];
  for (int d = 0; d < rank; ++d) inverse[(n.i[0] >> (4 * d)) & 0xF] = d;
  t.accumulate(n.in[0], ops::transpose(g, std::span<const int>(inverse, rank)));
}

// out = pad(x, before, after); shape[0] = x's shape, shape[1] = before. dx = crop(g).
void pad_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::crop(g, n.shape[1], n.shape[0]));
}

// out = repeat_elements(x, i[0], i[1]). dx = sum of the repeats.
void repeat_backward(Tape& t, const Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::sum_repeats(g, static_cast<int>(n.i[0]), n.i[1]));
}

}  // namespace

Tensor transpose(const Tensor& x, std::span<const int> perm) {
  Tensor out = ops::transpose(x, perm);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(transpose_backward, out, t->node_of(x));
  int64_t packed = 0;
  for (size_t d = 0; d < perm.size(); ++d) packed |= static_cast<int64_t>(perm[d]) << (4 * d);
  n.i[0] = packed;
  n.i[1] = static_cast<int64_t>(perm.size());
  return out;
}

Tensor pad(const Tensor& x, const Shape& before, const Shape& after) {
  Tensor out = ops::pad(x, before, after);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(pad_backward, out, t->node_of(x));
  n.shape[0] = x.shape();
  n.shape[1] = before;
  return out;
}

Tensor repeat_elements(const Tensor& x, int axis, int64_t k) {
  Tensor out = ops::repeat_elements(x, axis, k);
  Tape* t = recording_tape(x);
  if (t == nullptr) return out;
  Node& n = t->record(repeat_backward, out, t->node_of(x));
  n.i[0] = axis < 0 ? axis + x.rank() : axis;
  n.i[1] = k;
  return out;
}

}  // namespace dtrain
