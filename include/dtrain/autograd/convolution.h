// Differentiable convolutions and pools on NHWC float32 tensors (tf.nn.conv2d,
// tf.nn.depthwise_conv2d, tf.nn.conv2d_transpose, tf.nn.max_pool2d, ...). Kernels come from
// dtrain/ops/convolution.h and ops/pooling.h. The attributes are shared: a layer keeps one
// shared_ptr and each recorded node copies it, so a training step does not allocate for them.
// Shape errors throw InvalidArgumentError naming the op. Thread-safe for distinct tensors.
#pragma once

#include <memory>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/convolution.h"
#include "dtrain/ops/pooling.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain {

using ConvAttrsPtr = std::shared_ptr<const ops::Conv2DAttrs>;
using PoolAttrsPtr = std::shared_ptr<const ops::Pool2DAttrs>;

// act(conv(x [n, h, w, c], kernel [kh, kw, c / groups, filters]) + bias [filters]); bias may be
// undefined. The activation is fused (its derivative taken from the output).
Tensor conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const ConvAttrsPtr& attrs,
              ops::Activation act = ops::Activation::kLinear);
// x [n, length, c], kernel [k, c / groups, filters]: a conv2d over height 1 (attrs' height
// entries must be 1; the width entries are the 1-D stride and dilation).
Tensor conv1d(const Tensor& x, const Tensor& kernel, const Tensor& bias, const ConvAttrsPtr& attrs,
              ops::Activation act = ops::Activation::kLinear);
// x [n, h, w, c], kernel [kh, kw, c, depth_multiplier] → [n, oh, ow, c · depth_multiplier]
// (output channel c·dm + m, as TF). attrs->groups must equal c.
Tensor depthwise_conv2d(const Tensor& x, const Tensor& kernel, const Tensor& bias,
                        const ConvAttrsPtr& attrs, ops::Activation act = ops::Activation::kLinear);
// The transposed convolution (the gradient of conv2d with respect to its input): x [n, h, w, c],
// kernel [kh, kw, filters, c] → [n, oh, ow, filters] with oh = conv_transpose_output_size(h, ...).
Tensor conv2d_transpose(const Tensor& x, const Tensor& kernel, const Tensor& bias,
                        const ConvAttrsPtr& attrs, ops::Activation act = ops::Activation::kLinear);

// x [n, h, w, c] → [n, oh, ow, c].
Tensor max_pool2d(const Tensor& x, const PoolAttrsPtr& attrs);
Tensor avg_pool2d(const Tensor& x, const PoolAttrsPtr& attrs);
// x [n, d1, ..., c] → [n, c].
Tensor global_max_pool(const Tensor& x);
Tensor global_avg_pool(const Tensor& x);

// [n, c, d1, ...] ↔ [n, d1, ..., c] (the channels_first layers transpose in and out).
Tensor to_channels_last(const Tensor& x);
Tensor to_channels_first(const Tensor& x);

}  // namespace dtrain
