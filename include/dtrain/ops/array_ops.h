// Array kernels without autograd: concatenation and slicing along an axis (float32, contiguous).
// Thread-safe for distinct outputs.
#pragma once

#include <span>

#include "dtrain/core/tensor.h"

namespace dtrain::ops {

// Normalizes `axis` (negative counts from the end) for a tensor of `rank`; throws
// InvalidArgumentError naming `op` when it is out of range.
int normalize_axis(int axis, int rank, const char* op);

// xs [..., n_k, ...] joined along `axis` → [..., Σ n_k, ...]. Every input has the same rank
// and the same dimensions except along `axis` (InvalidArgumentError naming the shapes).
Tensor concat(std::span<const Tensor> xs, int axis);

// x [..., n, ...] → [..., size, ...]: the elements begin ≤ i < begin + size along `axis`.
Tensor slice_axis(const Tensor& x, int axis, int64_t begin, int64_t size);

// out [..., n, ...] += g [..., size, ...] placed at begin along `axis` (the backward of
// slice_axis), in place.
void add_slice_inplace(Tensor& out, const Tensor& g, int axis, int64_t begin);

}  // namespace dtrain::ops
