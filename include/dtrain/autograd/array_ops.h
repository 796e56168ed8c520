// Differentiable array ops: concatenation and splitting along an axis (tf.concat, tf.split).
// Shape errors throw InvalidArgumentError naming the op and the shapes. Thread-safe for
// distinct tensors.
#pragma once

#include <span>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain {

// xs joined along `axis` (negative counts from the end); the gradient of each input is its
// slice of the output's gradient.
Tensor concat(std::span<const Tensor> xs, int axis);
Tensor concat(std::initializer_list<Tensor> xs, int axis);

// x split along `axis` into pieces of `sizes` (which sum to x's dimension there).
std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> sizes, int axis);
// The elements begin ≤ i < begin + size of x along `axis`.
Tensor slice_axis(const Tensor& x, int axis, int64_t begin, int64_t size);

}  // namespace dtrain
