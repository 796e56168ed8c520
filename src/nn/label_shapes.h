// Checks of y_true's shape against y_pred's that losses and metrics share (private to src/nn).
#pragma once

#include <string>

#include "dtrain/core/error.h"
#include "dtrain/core/tensor.h"

namespace dtrain::nn::detail {

// The shape without its last dimension.
inline Shape drop_last(const Shape& s) {
  Shape out;
  for (int i = 0; i + 1 < s.rank(); ++i) out.push_back(s[i]);
  return out;
}

// True when a and b differ only by one trailing dimension of size 1 ([B] against [B, 1]), the
// case Keras's squeeze_or_expand_dimensions reconciles.
inline bool differ_by_trailing_one(const Shape& a, const Shape& b) {
  if (a.rank() + 1 == b.rank()) return b.dim(-1) == 1 && drop_last(b) == a;
  if (b.rank() + 1 == a.rank()) return a.dim(-1) == 1 && drop_last(a) == b;
  return false;
}

// InvalidArgumentError "<who>: y_true [..] does not match y_pred [..] (<expected>)".
[[noreturn]] inline void throw_shape_mismatch(const std::string& who, const Tensor& y_true,
                                              const Tensor& y_pred, const std::string& expected) {
  throw InvalidArgumentError(str_cat(who, ": y_true ", y_true.shape().to_string(),
                                     " does not match y_pred ", y_pred.shape().to_string(), " (",
                                     expected, ")"));
}

}  // namespace dtrain::nn::detail
