// Differentiable activations (tf.nn / keras.activations). relu, sigmoid, tanh, softmax,
// log_softmax and activation(x, act) are declared in dtrain/autograd/functions.h; the ones below
// complete Keras's list. Softmax-like ones act along the last axis. Thread-safe for distinct
// tensors.
#pragma once

#include "dtrain/core/tensor.h"
#include "dtrain/ops/activations.h"

namespace dtrain {

// A named activation with an explicit slope α (leaky_relu's negative slope, elu's α).
Tensor activation(const Tensor& x, ops::Activation act, float alpha);

// x·Φ(x) (exact, erf), or its tanh approximation (keras.activations.gelu(x, approximate)).
Tensor gelu(const Tensor& x, bool approximate = false);
// x·sigmoid(x).
Tensor swish(const Tensor& x);
inline Tensor silu(const Tensor& x) { return swish(x); }
Tensor leaky_relu(const Tensor& x, float negative_slope = 0.2f);
Tensor elu(const Tensor& x, float alpha = 1.0f);
Tensor selu(const Tensor& x);
Tensor softplus(const Tensor& x);
Tensor softsign(const Tensor& x);
// relu6(x + 3) / 6, as Keras 3.
Tensor hard_sigmoid(const Tensor& x);
Tensor exponential(const Tensor& x);
Tensor relu6(const Tensor& x);

// keras.activations.relu(x, negative_slope, max_value, threshold): x ≥ max_value → max_value;
// threshold < x < max_value → x; else negative_slope·(x − threshold). max_value < 0: none.
Tensor relu(const Tensor& x, float negative_slope, float max_value, float threshold);

}  // namespace dtrain
