// Activation kernels. Each backward names the derivative it computes and what it reads it from.
#include "dtrain/ops/activations.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "vector_math.h"

namespace dtrain::ops {
namespace {

// Keras's (and PyTorch's) SELU constants.
constexpr float kSeluScale = 1.0507009873554804934193349852946f;
constexpr float kSeluAlpha = 1.6732632423543772848170429916717f;
constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/√(2π)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

struct NamedActivation {
  const char* name;
  Activation act;
};
constexpr NamedActivation kNames[] = {
    {"linear", Activation::kLinear},
    {"relu", Activation::kRelu},
    {"sigmoid", Activation::kSigmoid},
    {"tanh", Activation::kTanh},
    {"softmax", Activation::kSoftmax},
    {"gelu", Activation::kGelu},
    {"gelu_approximate", Activation::kGeluTanh},
    {"swish", Activation::kSwish},
    {"silu", Activation::kSwish},
    {"leaky_relu", Activation::kLeakyRelu},
    {"elu", Activation::kElu},
    {"selu", Activation::kSelu},
    {"softplus", Activation::kSoftplus},
    {"softsign", Activation::kSoftsign},
    {"hard_sigmoid", Activation::kHardSigmoid},
    {"exponential", Activation::kExponential},
    {"log_softmax", Activation::kLogSoftmax},
    {"relu6", Activation::kRelu6},
};

}  // namespace

Activation activation_from_name(const std::string& name) {
  if (name.empty() || name == "None") return Activation::kLinear;
  for (const auto& n : kNames) {
    if (name == n.name) return n.act;
  }
  std::string known;
  for (const auto& n : kNames) known += (known.empty() ? "" : ", ") + std::string(n.name);
  throw InvalidArgumentError("unknown activation '" + name + "' (known: " + known + ")");
}

const char* activation_name(Activation a) {
  for (const auto& n : kNames) {
    if (n.act == a) return n.name;  // the first entry: "swish" before "silu"
  }
  return "linear";
}

float default_activation_alpha(Activation a) {
  if (a == Activation::kLeakyRelu) return 0.2f;
  if (a == Activation::kElu) return 1.0f;
  return 0.0f;
}

bool activation_needs_input(Activation a) {
  return a == Activation::kGelu || a == Activation::kGeluTanh || a == Activation::kSwish;
}

namespace {

void softmax_rows_serial(const float* x, float* y, int64_t rows, int64_t cols, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, xr[c]);
    if (!std::isfinite(mx)) mx = 0;  // all -inf (or inf/nan): let the arithmetic propagate
    double sum = 0;
    if (!log) {
      if (yr != xr) std::copy(xr, xr + cols, yr);
      sum = vmath::exp_shifted_sum(yr, cols, mx);
    } else {
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(xr[c] - mx);
    }
    if (log) {
      const float lse = mx + static_cast<float>(std::log(sum));
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
    } else {
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  }
}

void activation_serial(Activation act, float* y, int64_t rows, int64_t cols, float alpha) {
  const int64_t n = rows * cols;
  switch (act) {
    case Activation::kLinear:
      return;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i)
        y[i] = y[i] < 0.0f ? 0.0f : y[i];  // NaN propagates, as tf.nn.relu
      return;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = sigmoid_scalar(y[i]);
      return;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(y[i]);
      return;
    case Activation::kSoftmax:
      softmax_rows_serial(y, y, rows, cols, false);
      return;
    case Activation::kLogSoftmax:
      softmax_rows_serial(y, y, rows, cols, true);
      return;
    case Activation::kGelu:
      for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * y[i] * (1.0f + vmath::erf(y[i] * kSqrtHalf));
      return;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float x = y[i];
        y[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
      }
      return;
    case Activation::kSwish:
      for (int64_t i = 0; i < n; ++i) y[i] *= sigmoid_scalar(y[i]);
      return;
    case Activation::kLeakyRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] < 0.0f ? alpha * y[i] : y[i];
      return;
    case Activation::kElu:
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : alpha * std::expm1(y[i]);
      return;
    case Activation::kSelu:
      for (int64_t i = 0; i < n; ++i) {
        y[i] = y[i] > 0.0f ? kSeluScale * y[i] : kSeluScale * kSeluAlpha * std::expm1(y[i]);
      }
      return;
    case Activation::kSoftplus:
      // log(1 + eˣ) = max(x, 0) + log1p(e^−|x|), exact for large |x|.
      for (int64_t i = 0; i < n; ++i) {
        y[i] = std::max(y[i], 0.0f) + std::log1p(std::exp(-std::fabs(y[i])));
      }
      return;
    case Activation::kSoftsign:
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] / (1.0f + std::fabs(y[i]));
      return;
    case Activation::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
      return;
    case Activation::kExponential:
      for (int64_t i = 0; i < n; ++i) y[i] = std::exp(y[i]);
      return;
    case Activation::kRelu6:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i], 0.0f), 6.0f);
      return;
  }
}

void activation_backward_serial(Activation act, const float* y, const float* x, float* dz,
                                int64_t rows, int64_t cols, float alpha) {
  const int64_t n = rows * cols;
  switch (act) {
    case Activation::kLinear:
      return;
    case Activation::kRelu:
      // relu(x) > 0 exactly where x > 0, so the mask can be read from the output.
      for (int64_t i = 0; i < n; ++i) dz[i] = y[i] > 0.0f ? dz[i] : 0.0f;
      return;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) dz[i] *= y[i] * (1.0f - y[i]);
      return;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) dz[i] *= 1.0f - y[i] * y[i];
      return;
    case Activation::kSoftmax:
      for (int64_t r = 0; r < rows; ++r) {
        const float* yr = y + r * cols;
        float* dr = dz + r * cols;
        float dot = 0;
        for (int64_t c = 0; c < cols; ++c) dot += dr[c] * yr[c];
        for (int64_t c = 0; c < cols; ++c) dr[c] = yr[c] * (dr[c] - dot);
      }
      return;
    case Activation::kLogSoftmax:
      // y = x − logsumexp(x): dx = dy − softmax(x) Σ dy, softmax(x) = e^y.
      for (int64_t r = 0; r < rows; ++r) {
        const float* yr = y + r * cols;
        float* dr = dz + r * cols;
        float s = 0;
        for (int64_t c = 0; c < cols; ++c) s += dr[c];
        for (int64_t c = 0; c < cols; ++c) dr[c] -= std::exp(yr[c]) * s;
      }
      return;
    case Activation::kGelu:
      // d/dx x·Φ(x) = Φ(x) + x·φ(x), from x.
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[i];
        const float cdf = 0.5f * (1.0f + vmath::erf(xi * kSqrtHalf));
        dz[i] *= cdf + xi * kInvSqrt2Pi * vmath::exp_nonpositive(-0.5f * xi * xi);
      }
      return;
    case Activation::kGeluTanh:
      // u = √(2/π)(x + c·x³), t = tanh(u): d = 0.5(1 + t) + 0.5x(1 − t²)·√(2/π)(1 + 3c·x²).
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[i];
        const float t = std::tanh(kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi));
        dz[i] *= 0.5f * (1.0f + t) +
                 0.5f * xi * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * xi * xi);
      }
      return;
    case Activation::kSwish:
      // d/dx x·s(x) = s(1 + x(1 − s)), from x.
      for (int64_t i = 0; i < n; ++i) {
        const float s = sigmoid_scalar(x[i]);
        dz[i] *= s * (1.0f + x[i] * (1.0f - s));
      }
      return;
    case Activation::kLeakyRelu:
      // y > 0 exactly where x > 0 (α ≥ 0); else the slope α (TF's gradient at 0 too).
      for (int64_t i = 0; i < n; ++i) dz[i] = y[i] > 0.0f ? dz[i] : alpha * dz[i];
      return;
    case Activation::kElu:
      // x > 0: 1; else α·eˣ = y + α.
      for (int64_t i = 0; i < n; ++i) dz[i] = y[i] > 0.0f ? dz[i] : dz[i] * (y[i] + alpha);
      return;
    case Activation::kSelu:
      // x > 0: λ; else λα·eˣ = y + λα.
      for (int64_t i = 0; i < n; ++i) {
        dz[i] = y[i] > 0.0f ? dz[i] * kSeluScale : dz[i] * (y[i] + kSeluScale * kSeluAlpha);
      }
      return;
    case Activation::kSoftplus:
      // sigmoid(x) = 1 − e^−y.
      for (int64_t i = 0; i < n; ++i) dz[i] *= -std::expm1(-y[i]);
      return;
    case Activation::kSoftsign:
      // 1/(1 + |x|)² = (1 − |y|)².
      for (int64_t i = 0; i < n; ++i) {
        const float d = 1.0f - std::fabs(y[i]);
        dz[i] *= d * d;
      }
      return;
    case Activation::kHardSigmoid:
      // 1/6 on −3 < x < 3, i.e. 0 < y < 1.
      for (int64_t i = 0; i < n; ++i) {
        dz[i] = (y[i] > 0.0f && y[i] < 1.0f) ? dz[i] * (1.0f / 6.0f) : 0.0f;
      }
      return;
    case Activation::kExponential:
      for (int64_t i = 0; i < n; ++i) dz[i] *= y[i];
      return;
    case Activation::kRelu6:
      for (int64_t i = 0; i < n; ++i) dz[i] = (y[i] > 0.0f && y[i] < 6.0f) ? dz[i] : 0.0f;
      return;
  }
}

bool is_row_wise(Activation act) {
  return act == Activation::kSoftmax || act == Activation::kLogSoftmax;
}

// Work per element relative to a relu (for parallel_for's grain): the activations that call
// exp, erf, tanh or log1p cost about ten (8 keeps ranges whole cache lines).
int64_t activation_cost(Activation act) {
  switch (act) {
    case Activation::kLinear:
    case Activation::kRelu:
    case Activation::kLeakyRelu:
    case Activation::kRelu6:
    case Activation::kHardSigmoid:
    case Activation::kSoftsign:
      return 1;
    default:
      return 8;
  }
}

}  // namespace

// Rows are independent (the softmaxes reduce within a row only), so each range of rows runs the
// serial kernel: results do not depend on the thread count.
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols, bool log) {
  parallel_for(rows, grain_for(8 * cols), [&](int64_t begin, int64_t end) {
    softmax_rows_serial(x + begin * cols, y + begin * cols, end - begin, cols, log);
  });
}

// The softmaxes split over rows; every other activation is elementwise and splits over elements.
void activation_inplace(Activation act, float* y, int64_t rows, int64_t cols, float alpha) {
  if (act == Activation::kLinear) return;
  if (is_row_wise(act)) return softmax_rows(y, y, rows, cols, act == Activation::kLogSoftmax);
  parallel_for(rows * cols, grain_for(activation_cost(act)), [&](int64_t begin, int64_t end) {
    activation_serial(act, y + begin, 1, end - begin, alpha);
  });
}

void activation(Activation act, const float* x, float* y, int64_t rows, int64_t cols, float alpha) {
  if (act != Activation::kGelu) {
    std::copy_n(x, rows * cols, y);
    return activation_inplace(act, y, rows, cols, alpha);
  }
  // The exact GELU in one pass from x (activation_serial's expression, so the same bits).
  parallel_for(rows * cols, grain_for(activation_cost(act)), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float xi = x[i];
      y[i] = 0.5f * xi * (1.0f + vmath::erf(xi * kSqrtHalf));
    }
  });
}

void activation_backward_inplace(Activation act, const float* y, const float* x, float* dz,
                                 int64_t rows, int64_t cols, float alpha) {
  if (act == Activation::kLinear) return;
  const bool row_wise = is_row_wise(act);
  const int64_t n = row_wise ? rows : rows * cols, width = row_wise ? cols : 1;
  parallel_for(n, grain_for(activation_cost(act) * width), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * width;
    activation_backward_serial(act, y ? y + at : nullptr, x ? x + at : nullptr, dz + at,
                               row_wise ? end - begin : 1, row_wise ? cols : end - begin, alpha);
  });
}

void activation_backward_inplace(Activation act, const float* y, float* dz, int64_t rows,
                                 int64_t cols) {
  DTRAIN_INTERNAL_CHECK(!activation_needs_input(act), activation_name(act),
                        ": the backward pass needs the activation's input");
  activation_backward_inplace(act, y, nullptr, dz, rows, cols, default_activation_alpha(act));
}

void relu_general(const float* x, float* y, int64_t n, float max_value, float negative_slope,
                  float threshold) {
  const bool capped = max_value >= 0.0f;
  parallel_for(n, kParallelGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = x[i];
      float o = v > threshold ? v : negative_slope * (v - threshold);
      if (capped && v >= max_value) o = max_value;
      y[i] = o;
    }
  });
}

void relu_general_backward(const float* x, float* dz, int64_t n, float max_value,
                           float negative_slope, float threshold) {
  const bool capped = max_value >= 0.0f;
  parallel_for(n, kParallelGrainElements, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = x[i];
      float d = v > threshold ? 1.0f : negative_slope;
      if (capped && v >= max_value) d = 0.0f;
      dz[i] *= d;
    }
  });
}

void relu_backward_column_sum(const float* y, float* dz, int64_t rows, int64_t cols, float* sum) {
  // Split over columns: each thread masks its columns of every row and sums them over the rows
  // in order, the single-thread order.
  // The sums run in a local block of 64 columns: into sum[] itself (which may alias dz for the
  // compiler) every row stored and reloaded each sum, unvectorized.
  parallel_for(cols, std::max<int64_t>(16, grain_for(2 * rows)), [&](int64_t c0, int64_t c1) {
    constexpr int64_t kBlock = 64;
    for (int64_t b0 = c0; b0 < c1; b0 += kBlock) {
      const int64_t width = std::min(kBlock, c1 - b0);
      float acc[kBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const float* yr = y + r * cols + b0;
        float* dr = dz + r * cols + b0;
        for (int64_t c = 0; c < width; ++c) {
          const float v = yr[c] > 0.0f ? dr[c] : 0.0f;
          dr[c] = v;
          acc[c] += v;
        }
      }
      std::copy_n(acc, width, sum + b0);
    }
  });
}

}  // namespace dtrain::ops
