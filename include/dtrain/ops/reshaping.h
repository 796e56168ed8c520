// Layout kernels for the reshaping layers (Permute, ZeroPadding2D, UpSampling2D): general
// transposes, zero padding and its inverse crop, and nearest-neighbour repetition along an axis
// with its adjoint sum. float32 tensors of any rank up to Shape::kMaxRank. Thread-safe.
#pragma once

#include <span>

#include "dtrain/core/tensor.h"

namespace dtrain::ops {

// out.dim(i) = x.dim(perm[i]); perm is a permutation of 0..rank-1 (else InvalidArgumentError).
Tensor transpose(const Tensor& x, std::span<const int> perm);
// Zeros before and after every axis: out.dim(d) = before[d] + x.dim(d) + after[d].
Tensor pad(const Tensor& x, const Shape& before, const Shape& after);
// The window of `size` starting at `begin` (pad's adjoint).
Tensor crop(const Tensor& x, const Shape& begin, const Shape& size);
// Repeats every index of `axis` k times: out.dim(axis) = k·x.dim(axis),
// out[..., i·k + r, ...] = x[..., i, ...] (nearest-neighbour upsampling).
Tensor repeat_elements(const Tensor& x, int axis, int64_t k);
// The adjoint: out[..., i, ...] = Σ_r g[..., i·k + r, ...].
Tensor sum_repeats(const Tensor& g, int axis, int64_t k);

}  // namespace dtrain::ops
