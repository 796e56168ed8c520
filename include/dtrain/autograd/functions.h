// Differentiable ops on float32 tensors, in the spirit of tf.math / tf.nn. Each computes its
// result with the kernels of dtrain/ops and, while a GradientTape is recording and an input
// depends on a watched source, records how to differentiate it. Shape errors throw
// InvalidArgumentError naming the op and the shapes. Thread-safe for distinct tensors.
#pragma once

#include <optional>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain {

using ops::Activation;

// Elementwise with NumPy broadcasting.
Tensor add(const Tensor& a, const Tensor& b);
Tensor subtract(const Tensor& a, const Tensor& b);
Tensor multiply(const Tensor& a, const Tensor& b);
Tensor divide(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// x * alpha + beta.
Tensor scale(const Tensor& x, float alpha, float beta = 0.0f);

Tensor negative(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// Along the last axis.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// Clamps to [lo, hi]; the gradient passes where lo <= x <= hi (as tf.clip_by_value).
Tensor clip_by_value(const Tensor& x, float lo, float hi);
// Applies a named activation.
Tensor activation(const Tensor& x, Activation act);

// a [m, k] · b [k, n], optionally transposed operands.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// The fused Dense kernel: act(x · kernel + bias). x [batch, in], kernel [in, out], bias [out]
// or undefined. One GEMM, one pass for bias and activation; backward skips dx when x is not
// differentiated (the first layer).
Tensor dense(const Tensor& x, const Tensor& kernel, const Tensor& bias, Activation act);

Tensor reduce_sum(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Tensor reduce_mean(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// A view with a new shape (same element count).
Tensor reshape(const Tensor& x, const Shape& shape);

// Per-example cross-entropy from logits [batch, classes] and integer labels [batch] → [batch].
Tensor sparse_softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits);
// Per-example cross-entropy from logits and one-hot/probability labels [batch, classes].
Tensor softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits);
// Per-element logistic loss: max(x, 0) − x·z + log(1 + exp(−|x|)) for logits x, labels z.
Tensor sigmoid_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits);
// x [batch, classes], labels [batch] → x[b, labels[b]] as [batch].
Tensor pick(const Tensor& x, const Tensor& labels);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return subtract(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return multiply(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return divide(a, b); }
inline Tensor operator-(const Tensor& a) { return negative(a); }
inline Tensor operator+(const Tensor& a, float s) { return scale(a, 1.0f, s); }
inline Tensor operator-(const Tensor& a, float s) { return scale(a, 1.0f, -s); }
inline Tensor operator*(const Tensor& a, float s) { return scale(a, s); }
inline Tensor operator/(const Tensor& a, float s) { return scale(a, 1.0f / s); }
inline Tensor operator*(float s, const Tensor& a) { return scale(a, s); }
inline Tensor operator+(float s, const Tensor& a) { return scale(a, 1.0f, s); }
inline Tensor operator-(float s, const Tensor& a) { return scale(a, -1.0f, s); }

}  // namespace dtrain
