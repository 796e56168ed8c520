// Batch and layer normalization kernels on float32 buffers. Batch norm sees its input as
// [outer, channels, inner] (channels-last: inner = 1; channels-first NCHW: outer = N,
// inner = H·W) and reduces over outer and inner; layer norm sees [rows, features] and reduces
// each row. Moments are two-pass (mean, then the mean of squared deviations) with double
// accumulators; variances are biased (divided by the count), as Keras and PyTorch normalize.
// Nothing allocates in steady state (per-thread scratch that only grows). Thread-safe for
// distinct outputs.
#pragma once

#include <cstdint>

namespace dtrain::ops {

struct ChannelLayout {
  int64_t outer = 1;
  int64_t channels = 1;
  int64_t inner = 1;
  int64_t count() const { return outer * inner; }  // elements per channel
};

// Per-channel sums Σx and Σ(x − shift)² over outer and inner into sum, sq (double [channels]).
// With shift = null the second is not computed.
void channel_sums(const float* x, ChannelLayout l, double* sum, const float* shift, double* sq);

// mean, var [channels] ← the batch's mean and biased variance of x.
void batch_norm_moments(const float* x, ChannelLayout l, float* mean, float* var);

// y = (x − mean)·rsqrt(var + ε)·γ + β per channel; gamma/beta may be null (1 and 0). Used for
// training (batch moments) and inference (moving moments) alike. Writes rsqrt(var + ε) to
// inv_std [channels] when not null.
void batch_norm_apply(const float* x, ChannelLayout l, const float* mean, const float* var,
                      const float* gamma, const float* beta, float epsilon, float* y,
                      float* inv_std);

// Backward of training-mode batch norm (batch moments, which depend on x): given dy, x, the
// batch mean and inv_std, writes
//   dbeta = Σ dy, dgamma = Σ dy·x̂ (x̂ = (x − mean)·inv_std), both [channels] (null: skipped),
//   dx = γ·inv_std/M · (M·dy − Σdy − x̂·Σ(dy·x̂))  (null: skipped).
// With `sums` given ([2·channels]: Σdy then Σdy·x̂ over every replica, SyncBatchNormalization)
// and `count` the global M, dx uses those instead of the local sums.
void batch_norm_backward(const float* dy, const float* x, ChannelLayout l, const float* mean,
                         const float* inv_std, const float* gamma, float* dx, float* dgamma,
                         float* dbeta, const double* sums = nullptr, int64_t count = 0);
// Σdy and Σdy·x̂ per channel into sums [2·channels] (the part SyncBatchNormalization reduces).
void batch_norm_backward_sums(const float* dy, const float* x, ChannelLayout l, const float* mean,
                              const float* inv_std, double* sums);

// Inference-mode backward (fixed moments): dx = dy·γ·inv_std; dgamma = Σ dy·x̂; dbeta = Σ dy.
void batch_norm_inference_backward(const float* dy, const float* x, ChannelLayout l,
                                   const float* mean, const float* inv_std, const float* gamma,
                                   float* dx, float* dgamma, float* dbeta);

// Layer norm of each row of x [rows, d]: y = (x − μ)·rsqrt(σ² + ε)·γ + β with γ, β [d] (null: 1
// and 0); stats [rows, 2] ← (μ, rsqrt(σ² + ε)) when not null.
void layer_norm_forward(const float* x, int64_t rows, int64_t d, const float* gamma,
                        const float* beta, float epsilon, float* y, float* stats);
// dx = inv/d · (d·ĝ − Σĝ − x̂·Σ(ĝ·x̂)) with ĝ = dy·γ; dgamma = Σ_rows dy·x̂; dbeta = Σ_rows dy
// (null outputs skipped; dgamma/dbeta are overwritten).
void layer_norm_backward(const float* dy, const float* x, int64_t rows, int64_t d,
                         const float* stats, const float* gamma, float* dx, float* dgamma,
                         float* dbeta);

}  // namespace dtrain::ops
