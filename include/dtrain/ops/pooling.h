// Pooling kernels on float32 NHWC tensors (tf.nn.max_pool2d / avg_pool2d), without autograd.
// A 1-D pool is a 2-D one over height 1. Average pooling under "same" padding divides by the
// number of input elements inside each window (padding is not counted), as TensorFlow does.
// Max pooling sends the gradient to the first maximum of each window in row-major order.
// Thread-safe; no workspace.
#pragma once

#include <cstdint>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/convolution.h"

namespace dtrain::ops {

struct Pool2DAttrs {
  int64_t pool[2] = {2, 2};
  int64_t strides[2] = {2, 2};
  Padding padding = Padding::kValid;  // valid or same
};

enum class PoolKind { kMax, kAverage };

// y [n, oh, ow, c] = pool(x [n, h, w, c]). Throws InvalidArgumentError naming `op` for a bad
// rank or a window larger than the input under "valid".
Tensor pool2d(PoolKind kind, const Tensor& x, const Pool2DAttrs& a, const char* op = "pool2d");
// d x for d y of y = pool2d(kind, x); max pooling needs x (and recomputes the argmax).
Tensor pool2d_backward(PoolKind kind, const Tensor& x, const Tensor& dy, const Pool2DAttrs& a);

// Over every axis between the batch and the channels: x [n, d1, ..., c] → [n, c].
Tensor global_pool(PoolKind kind, const Tensor& x);
// d x [n, d1, ..., c] for d y [n, c].
Tensor global_pool_backward(PoolKind kind, const Tensor& x, const Tensor& dy);

}  // namespace dtrain::ops
