// Keras losses (keras.losses): each returns the scalar loss of a batch with Keras's default
// reduction SUM_OVER_BATCH_SIZE (the mean of the per-example losses) and is built only from the
// differentiable ops of dtrain/autograd/functions.h, so a GradientTape differentiates it. The
// formulas follow Keras 2.12's backend functions, clipping epsilon 1e-7 included
// (docs/losses-and-metrics.md). Loss objects are immutable after construction: thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::nn {

// Keras's fuzz factor (keras.backend.epsilon()): probabilities are clipped to [kEpsilon,
// 1 − kEpsilon] before their logarithm is taken.
inline constexpr float kEpsilon = 1e-7f;

// What Keras's Loss.get_config() returns, enough to write the "loss" entry of a model's
// training_config: {"class_name": class_name, "config": {"reduction": ..., "name": ..., ...}}.
// Fields that a class does not have are empty.
struct LossConfig {
  std::string class_name = {};                // Keras class, e.g. "SparseCategoricalCrossentropy"
  std::string name = {};                      // e.g. "sparse_categorical_crossentropy"
  std::string reduction = "auto";             // Keras's default reduction (SUM_OVER_BATCH_SIZE)
  std::optional<bool> from_logits = {};       // the crossentropies
  std::optional<float> label_smoothing = {};  // CategoricalCrossentropy, BinaryCrossentropy
  std::optional<int> axis = {};               // CategoricalCrossentropy, BinaryCrossentropy: -1
  bool ignore_class_null = false;             // SparseCategoricalCrossentropy: "ignore_class": null
};

class Loss {
 public:
  virtual ~Loss() = default;

  // The scalar loss (shape []) of a batch: the mean over all per-example losses. y_pred is
  // float32; differentiable with respect to y_pred (y_true is never differentiated). Throws
  // InvalidArgumentError when the shapes do not fit (naming both) or a sparse label is out of
  // range (naming the label and the example).
  virtual Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const = 0;
  // Keras's loss of a masked output (fit and evaluate pass y_pred's mask, nn/output_mask.h):
  // without `mask` (undefined) the loss above; with it, the per-sample losses (per_sample)
  // weighted by mask · total / valid (total: their count, valid: the mask's nonzeros; 0 when
  // none is) and averaged over all of them, i.e. Σ loss · mask / valid — Keras 3's apply_mask
  // and reduce_weighted_values under SUM_OVER_BATCH_SIZE. `mask` (any numeric dtype, nonzero: a
  // real step) must have per_sample's shape; InvalidArgumentError naming both otherwise.
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred, const Tensor& mask) const;
  // The unreduced loss of every sample (Keras's Loss.call): y_pred's shape without the last
  // axis (the crossentropies: one per row of class scores; MeanSquaredError and
  // BinaryCrossentropy: the mean over the last axis, or each element of a rank-1 y_pred).
  // Differentiable like operator(). The default throws UnimplementedError (a custom loss that
  // cannot be masked).
  virtual Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const;
  // Keras's snake_case name, e.g. "sparse_categorical_crossentropy".
  virtual std::string name() const = 0;
  // Keras's class name and config.
  virtual LossConfig get_config() const = 0;
  // The config as Keras writes it: {"reduction": "auto", "name": ..., "from_logits": ...}.
  std::string config_json() const;
};

// mean((y_pred − y_true)²). y_true and y_pred of one shape, or [B] against [B, 1].
class MeanSquaredError : public Loss {
 public:
  using Loss::operator();
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const override;
  Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const override;
  std::string name() const override { return "mean_squared_error"; }
  LossConfig get_config() const override;
};

struct SparseCategoricalCrossentropyOptions {
  bool from_logits = false;  // y_pred holds logits rather than probabilities
};

// Integer labels against class scores: y_pred [B, C] (or [..., C]), y_true [B] or [B, 1] of
// any integer or float dtype holding class indices. From logits: the fused
// sparse_softmax_cross_entropy_with_logits. From probabilities (Keras): p clipped to [ε, 1 − ε],
// then −log softmax(log p)[label], i.e. −log(p[label] / Σ p) of the clipped p.
class SparseCategoricalCrossentropy : public Loss {
 public:
  explicit SparseCategoricalCrossentropy(SparseCategoricalCrossentropyOptions options = {})
      : options_(options) {}
  using Loss::operator();
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const override;
  Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const override;
  std::string name() const override { return "sparse_categorical_crossentropy"; }
  LossConfig get_config() const override;
  const SparseCategoricalCrossentropyOptions& options() const { return options_; }

 private:
  SparseCategoricalCrossentropyOptions options_;
};

struct CategoricalCrossentropyOptions {
  bool from_logits = false;     // y_pred holds logits rather than probabilities
  float label_smoothing = 0.0;  // y_true ← y_true·(1 − s) + s / classes
};

// One-hot (or probability) labels y_true against y_pred, both [B, C] (or [..., C]). From
// logits: the fused softmax_cross_entropy_with_logits. From probabilities (Keras): p divided
// by its row sum, clipped to [ε, 1 − ε], then −Σ_c y_c log p_c.
class CategoricalCrossentropy : public Loss {
 public:
  // Throws InvalidArgumentError unless 0 <= label_smoothing <= 1.
  explicit CategoricalCrossentropy(CategoricalCrossentropyOptions options = {});
  using Loss::operator();
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const override;
  Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const override;
  std::string name() const override { return "categorical_crossentropy"; }
  LossConfig get_config() const override;
  const CategoricalCrossentropyOptions& options() const { return options_; }

 private:
  CategoricalCrossentropyOptions options_;
};

struct BinaryCrossentropyOptions {
  bool from_logits = false;     // y_pred holds logits rather than probabilities
  float label_smoothing = 0.0;  // y_true ← y_true·(1 − s) + s / 2
};

// Elementwise binary crossentropy, averaged over all elements: y_true and y_pred of one shape
// ([B, k], or [B] against [B, 1]). From logits: the fused sigmoid_cross_entropy_with_logits.
// From probabilities (Keras): p clipped to [ε, 1 − ε], then −(y log(p + ε) + (1 − y) log(1 − p +
// ε)).
class BinaryCrossentropy : public Loss {
 public:
  // Throws InvalidArgumentError unless 0 <= label_smoothing <= 1.
  explicit BinaryCrossentropy(BinaryCrossentropyOptions options = {});
  using Loss::operator();
  Tensor operator()(const Tensor& y_true, const Tensor& y_pred) const override;
  Tensor per_sample(const Tensor& y_true, const Tensor& y_pred) const override;
  std::string name() const override { return "binary_crossentropy"; }
  LossConfig get_config() const override;
  const BinaryCrossentropyOptions& options() const { return options_; }

 private:
  BinaryCrossentropyOptions options_;
};

// A loss with Keras's default options from the strings Keras's compile() accepts: "mse",
// "mean_squared_error", "sparse_categorical_crossentropy", "categorical_crossentropy",
// "binary_crossentropy", or a Keras class name ("MeanSquaredError", ...). Throws
// InvalidArgumentError naming the unknown name and listing the known ones.
std::shared_ptr<Loss> loss_from_name(const std::string& name);
// The loss a config describes (the inverse of Loss::get_config()). Throws InvalidArgumentError
// for an unknown class name.
std::shared_ptr<Loss> loss_from_config(const LossConfig& config);
// From Keras's serialized form: a JSON string such as "\"mse\"", or an object
// {"class_name": "CategoricalCrossentropy", "config": {"from_logits": true, ...}}. Throws
// InvalidArgumentError for malformed JSON or an unknown loss.
std::shared_ptr<Loss> loss_from_json(const std::string& json);

}  // namespace dtrain::nn
