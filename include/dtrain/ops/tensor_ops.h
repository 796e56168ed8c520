// Kernels on float32 tensors, without autograd: the building blocks that the autograd layer
// records and differentiates, that optimizers and metrics call directly. Functions return new
// tensors (from the caching allocator) unless named *_inplace. Thread-safe for distinct outputs.
#pragma once

#include <optional>
#include <string>

#include "dtrain/core/tensor.h"
#include "dtrain/ops/activations.h"

namespace dtrain::ops {

// kGreaterEqual / kLessEqual give 1.0 where the comparison holds, else 0.0.
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMaximum, kMinimum, kGreaterEqual, kLessEqual };
// NumPy broadcasting of two shapes; throws InvalidArgumentError naming both when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Elementwise a op b with broadcasting (float32).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// Sums g [broadcast shape] over the broadcast dimensions so it has `shape` (the backward of
// broadcasting).
Tensor reduce_to_shape(const Tensor& g, const Shape& shape);

enum class UnaryOp { kNeg, kExp, kLog, kSqrt, kSquare, kAbs, kRelu, kSigmoid, kTanh };
Tensor unary(UnaryOp op, const Tensor& x);
// x * alpha + beta, elementwise.
Tensor affine(const Tensor& x, float alpha, float beta);
// Clamps into [lo, hi].
Tensor clip(const Tensor& x, float lo, float hi);

// a [m, k] · b [k, n] (or transposed operands), both rank 2.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// y [rows, cols] += b [cols], in place.
void bias_add_inplace(Tensor& y, const Tensor& b);
// out [cols] = Σ_rows x [rows, cols].
void column_sum(const float* x, int64_t rows, int64_t cols, float* out);

// Sum over `axis` (negative counts from the end), or over every element when axis is empty.
Tensor reduce_sum(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
Tensor reduce_mean(const Tensor& x, std::optional<int> axis = std::nullopt, bool keepdims = false);
// Broadcasts g (x reduced over `axis` without keepdims) back to `shape` (the backward of sums).
Tensor expand_reduced(const Tensor& g, const Shape& shape, std::optional<int> axis);

// Along the last axis, numerically stable (max subtracted).
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// Index of the largest value along the last axis, int64; first index wins ties.
Tensor argmax(const Tensor& x);
// Converts between numeric dtypes.
Tensor cast(const Tensor& x, DType dtype);

// Label i of a label tensor of any integer or float dtype, as an integer.
int64_t label_at(const Tensor& labels, int64_t i);
// Element i (row-major) of a numeric tensor of any dtype cast() handles, as a double; no
// allocation. Throws InvalidArgumentError for other dtypes.
double value_at(const Tensor& x, int64_t i);

// Per-example −log softmax(logits)[label]: logits [B, C], labels [B] (any numeric dtype) →
// loss [B]. Writes softmax(logits) to *probs when given. Throws InvalidArgumentError naming
// the example and the label when a label is outside [0, C).
Tensor sparse_softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* probs);
// Per-example −Σ_c y_c log softmax(logits)_c: logits, labels [B, C] → [B].
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Tensor* probs);
// x [B, C], labels [B] → x[b, labels[b]] as [B]; labels checked as above.
Tensor pick(const Tensor& x, const Tensor& labels);

// True if every element is finite.
bool all_finite(const Tensor& x);

}  // namespace dtrain::ops
