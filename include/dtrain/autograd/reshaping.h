// Differentiable layout ops for the reshaping layers: transpose, zero padding and
// nearest-neighbour repetition (upsampling). Thread-safe for distinct tensors.
#pragma once

#include <span>

#include "dtrain/core/tensor.h"

namespace dtrain {

// out.dim(i) = x.dim(perm[i]) (tf.transpose).
Tensor transpose(const Tensor& x, std::span<const int> perm);
// Zero padding: out.dim(d) = before[d] + x.dim(d) + after[d] (tf.pad with zeros).
Tensor pad(const Tensor& x, const Shape& before, const Shape& after);
// Every index of `axis` repeated k times (keras.backend.repeat_elements).
Tensor repeat_elements(const Tensor& x, int axis, int64_t k);

}  // namespace dtrain
