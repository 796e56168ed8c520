// Kernels for attention: batched matrix products over OpenBLAS (one sgemm per matrix) and a
// fused masked softmax over the last axis with its backward. No autograd here (see
// dtrain/autograd/attention.h). Thread-safe for distinct outputs.
#pragma once

#include <cstdint>

#include "dtrain/core/tensor.h"

namespace dtrain::ops {

// One operand of a batched GEMM: matrix (i, j) of the batch starts at
// data + i·outer_stride + j·inner_stride and has leading dimension ld (row-major).
struct StridedMatrices {
  const float* data = nullptr;
  int64_t outer_stride = 0;
  int64_t inner_stride = 0;
  int64_t ld = 0;
};
struct StridedOutput {
  float* data = nullptr;
  int64_t outer_stride = 0;
  int64_t inner_stride = 0;
  int64_t ld = 0;
};

// For every (i, j) in [outer) × [inner): C_ij = alpha · op(A_ij) · op(B_ij) + beta · C_ij, with
// op(A) [m, k] and op(B) [k, n] as in gemm(). A zero stride reuses one matrix for the whole
// batch (with beta = 1 and a zero output stride, the products accumulate into one C).
void strided_batched_gemm(int64_t outer, int64_t inner, bool trans_a, bool trans_b, int64_t m,
                          int64_t n, int64_t k, float alpha, StridedMatrices a, StridedMatrices b,
                          float beta, StridedOutput c);

// a [..., m, k] · b [..., k, n] (op(a), op(b) with the transposes) → [..., m, n]. The batch
// dimensions must be equal, or one operand is rank 2 and is used for every batch entry.
// Throws InvalidArgumentError naming both shapes otherwise.
Tensor batch_matmul(const Tensor& a, const Tensor& b, bool transpose_a = false,
                    bool transpose_b = false);

// Keras adds this to masked-out scores before the softmax (keras.layers.Softmax), so a row
// with every position masked becomes uniform, as in Keras.
inline constexpr float kMaskedScore = -1e9f;

struct MaskedSoftmaxOptions {
  float scale = 1.0f;   // the scores are multiplied by this first
  bool causal = false;  // position (t, s) is masked when s > t + causal_offset (Keras's causal
                        // mask: lower-triangular, s > t)
  // Shifts the causal diagonal: incremental decoding puts query t at absolute position
  // t + (cached positions), which sees every key up to it.
  int64_t causal_offset = 0;
  bool additive = false;  // the mask is added to the scaled scores instead of selecting them
};

// y = softmax(scale · x + penalty) along the last axis, for x [..., T, S] (rank ≥ 2).
// `mask` (optional: undefined for none) broadcasts to x's shape as NumPy does (right-aligned,
// size-1 or missing dimensions repeat); by default it selects (nonzero: attend, zero: the
// score gets kMaskedScore added), with `additive` it is added (float32). Causal masking is
// computed from the indices, with no mask tensor. Throws InvalidArgumentError naming `who`
// and both shapes when the mask does not broadcast.
Tensor masked_softmax(const Tensor& x, const Tensor& mask, const MaskedSoftmaxOptions& options,
                      const char* who = "masked_softmax");
// The backward of masked_softmax given its output y: dx = scale · y ⊙ (dy − Σ_s dy·y), in
// place on dy [..., T, S].
void masked_softmax_backward_inplace(const Tensor& y, Tensor& dy, float scale);

}  // namespace dtrain::ops
