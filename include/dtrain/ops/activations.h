// Activation kernels (keras.activations): forward in place and backward, on float32 rows. Dense
// fuses them into its kernel; the autograd ops (dtrain/autograd/activations.h) and the
// activation layers (dtrain/nn/activations.h) call them. Thread-safe for distinct buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace dtrain::ops {

enum class Activation {
  kLinear,
  kRelu,
  kSigmoid,
  kTanh,
  kSoftmax,      // along the last axis
  kGelu,         // x·Φ(x), the exact erf form (Keras's gelu(approximate=False), the default)
  kGeluTanh,     // 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))) (gelu(approximate=True))
  kSwish,        // x·sigmoid(x), also "silu"
  kLeakyRelu,    // x > 0 ? x : α·x (α = 0.2 for the string "leaky_relu", as Keras 3)
  kElu,          // x > 0 ? x : α(eˣ − 1) (α = 1)
  kSelu,         // λ·elu(x, α) with Keras's λ, α
  kSoftplus,     // log(1 + eˣ)
  kSoftsign,     // x / (1 + |x|)
  kHardSigmoid,  // relu6(x + 3) / 6 (Keras 3; Keras 2's was clip(0.2x + 0.5, 0, 1))
  kExponential,  // eˣ
  kLogSoftmax,   // along the last axis
  kRelu6,        // min(max(x, 0), 6)
};

// Keras's activation names: "linear" (and ""/"None"), "relu", "sigmoid", "tanh", "softmax",
// "gelu", "swish"/"silu", "leaky_relu", "elu", "selu", "softplus", "softsign", "hard_sigmoid",
// "exponential", "log_softmax", "relu6", and "gelu_approximate" (dtrain's name for the tanh
// form, which Keras reaches only through gelu(approximate=True)). Throws InvalidArgumentError
// naming the unknown activation and listing the known ones.
Activation activation_from_name(const std::string& name);
// The name activation_from_name reads back ("swish" for kSwish, as Keras 2 writes it).
const char* activation_name(Activation a);
// α of kLeakyRelu (0.2) and kElu (1.0) when not given; 0 for the others.
float default_activation_alpha(Activation a);
// Whether the derivative needs the input x (gelu, swish): for every other activation it is
// computed from the output y = act(x) alone, so backward passes need not keep x.
bool activation_needs_input(Activation a);

// y [rows, cols] ← act(y), in place (softmax / log_softmax along each row). `alpha` is the
// slope of kLeakyRelu and kElu (ignored by the others).
void activation_inplace(Activation act, float* y, int64_t rows, int64_t cols, float alpha);
inline void activation_inplace(Activation act, float* y, int64_t rows, int64_t cols) {
  activation_inplace(act, y, rows, cols, default_activation_alpha(act));
}
// y ← act(x) for x and y [rows, cols] that do not overlap: one pass for the exact GELU (the
// dense layer keeps x for the backward), a copy and activation_inplace for the others.
void activation(Activation act, const float* x, float* y, int64_t rows, int64_t cols, float alpha);
// dz ← dy ⊙ act'(x), in place on dz (which holds dy on entry), from the output y = act(x) or,
// where activation_needs_input(act), from the input x (y may then be null; x may be null
// otherwise). For softmax: dz = y ⊙ (dy − Σ_j dy_j y_j) per row.
void activation_backward_inplace(Activation act, const float* y, const float* x, float* dz,
                                 int64_t rows, int64_t cols, float alpha);
// The same for activations whose derivative the output gives (not gelu or swish: throws
// InternalError).
void activation_backward_inplace(Activation act, const float* y, float* dz, int64_t rows,
                                 int64_t cols);

// ReLU's backward and the bias gradient in one pass over dz [rows, cols]: dz ← dy ⊙ [y > 0] in
// place, sum[c] = Σ_r dz[r, c] (float, summed over the rows in order).
void relu_backward_column_sum(const float* y, float* dz, int64_t rows, int64_t cols, float* sum);

// keras.layers.ReLU: x ≥ max_value → max_value; threshold < x < max_value → x; else
// negative_slope·(x − threshold). max_value < 0 means none.
void relu_general(const float* x, float* y, int64_t n, float max_value, float negative_slope,
                  float threshold);
// dz ← dy ⊙ relu_general'(x), from the input x.
void relu_general_backward(const float* x, float* dz, int64_t n, float max_value,
                           float negative_slope, float threshold);

// Softmax (or log-softmax) of each row of x [rows, cols] into y (may alias x), numerically
// stable (the row's max subtracted, the sum in double).
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols, bool log);
// 1 / (1 + e⁻ˣ), stable for large |x|.
inline float sigmoid_scalar(float x) {
  if (x >= 0) return 1.0f / (1.0f + std::exp(-x));
  const float z = std::exp(x);
  return z / (1.0f + z);
}

}  // namespace dtrain::ops
