// Differentiable batch and layer normalization (tf.nn.batch_normalization with moments,
// keras.layers.BatchNormalization / LayerNormalization's math). gamma and beta may be
// undefined (scale=False / center=False: 1 and 0). Shape errors throw InvalidArgumentError
// naming the op and the shapes. Thread-safe for distinct tensors.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "dtrain/core/tensor.h"

namespace dtrain {

struct BatchNormMoments {
  Tensor mean;      // [C]
  Tensor variance;  // [C], biased (divided by the count)
};

// SyncBatchNormalization: sums per-channel statistics over every replica of every worker, in
// place, the same bits on every replica. Called from the replica's thread in the forward pass
// (Σx, Σx², count) and in the backward pass (Σdy, Σdy·x̂, count); every replica must call the
// op the same number of times.
struct BatchNormSync {
  std::function<void(std::span<double>)> all_reduce_sum;
};

// Training mode: y = (x − μ)·rsqrt(σ² + ε)·γ + β with μ, σ² the mean and biased variance of x
// over every axis but `axis` (negative counts from the end), differentiated through the
// moments. gamma, beta: [C] with C = x.dim(axis). Writes the batch moments (not
// differentiated) to *moments when given. With `sync`, the moments are those of the global
// batch (every replica's rows), and so is the backward.
Tensor batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, int axis,
                           float epsilon, BatchNormMoments* moments = nullptr,
                           const std::shared_ptr<const BatchNormSync>& sync = nullptr);

// Inference mode: the same with fixed moments mean, variance [C] (not differentiated).
Tensor batch_norm_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& mean, const Tensor& variance, int axis, float epsilon);

// Layer norm over the trailing axes [begin_axis, rank): each of the leading positions is
// normalized with its own mean and biased variance; gamma, beta have x's trailing dims (or
// their element count).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int begin_axis,
                  float epsilon);

}  // namespace dtrain
