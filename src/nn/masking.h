// Keras masks inside the layers: checking and combining the [batch, time] masks that
// Sequential and Functional carry beside values (dtrain/nn/layer.h, call_masked).
#pragma once

#include <cstdint>

#include "dtrain/core/tensor.h"
#include "dtrain/nn/layer.h"

namespace dtrain::nn::detail {

// `mask` (any numeric or bool dtype, nonzero = a real step) as float32 0/1 [batch, time].
// Throws InvalidArgumentError naming `layer`, the mask's shape and the expected one when it is
// not [batch, time].
Tensor sequence_mask(const Tensor& mask, int64_t batch, int64_t time, const Layer& layer);

// The elementwise logical and of two masks of one shape (float32 0/1); InvalidArgumentError
// naming `layer` and both shapes otherwise.
Tensor mask_and(const Tensor& a, const Tensor& b, const Layer& layer);

// 1 where ids != 0 (Embedding(mask_zero=true)), float32 of ids' shape.
Tensor nonzero_mask(const Tensor& ids);

// Sequential and Functional report the mask of their output here at the end of every call; it
// is kept only when `model` is the one call_with_output_mask (dtrain/nn/output_mask.h) runs on
// this thread (a nested model's report is ignored).
void report_output_mask(const Layer* model, const Tensor& mask);

}  // namespace dtrain::nn::detail
