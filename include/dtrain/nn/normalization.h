// The normalization layers: BatchNormalization (and its synchronized form,
// SyncBatchNormalization) and LayerNormalization, with Keras's arguments, defaults and weights.
// Thread-safety as for Layer; BatchNormalization's training calls may run concurrently on the
// replica threads of a strategy (see dtrain/nn/state_updates.h).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/autograd/normalization.h"
#include "dtrain/nn/layer.h"
#include "dtrain/nn/state_updates.h"

namespace dtrain::nn {

struct BatchNormalizationOptions {
  int axis = -1;           // the channel axis (counting the batch; negative from the end)
  float momentum = 0.99f;  // moving = moving·momentum + batch·(1 − momentum)
  float epsilon = 1e-3f;   // added to the variance
  bool center = true;      // add beta
  bool scale = true;       // multiply by gamma
  std::string beta_initializer = "zeros";  // Keras identifiers or initializer JSON
  std::string gamma_initializer = "ones";
  std::string moving_mean_initializer = "zeros";
  std::string moving_variance_initializer = "ones";
  // Keras 3's synchronized=True (TF-Keras 2's SyncBatchNormalization): in training, the batch
  // moments are those of the global batch, all-reduced over every replica of every worker.
  bool synchronized = false;
  std::optional<Shape> input_shape = std::nullopt;  // per-example input shape (builds now)
  std::string name = {};                            // default "batch_normalization", ...
};

// keras.layers.BatchNormalization. Weights in Keras's order: gamma, beta (trainable; absent
// without scale / center), moving_mean, moving_variance (non-trainable). Training calls
// normalize with the batch's mean and biased variance and update the moving statistics with
// the biased variance (Keras 3); inference calls, and every call while the layer is not
// trainable (Keras ≥ 2), use the moving statistics.
class BatchNormalization : public Layer, public StatefulLayer {
 public:
  static constexpr int kMaxLocalReplicas = 64;

  explicit BatchNormalization(BatchNormalizationOptions options = {});
  std::string class_name() const override {
    return options_.synchronized ? "SyncBatchNormalization" : "BatchNormalization";
  }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

  const BatchNormalizationOptions& options() const { return options_; }
  // Valid once built (gamma/beta null without scale/center).
  Variable* gamma() { return gamma_; }
  Variable* beta() { return beta_; }
  Variable& moving_mean() { return *moving_mean_; }
  Variable& moving_variance() { return *moving_variance_; }

  // The collective of the strategy whose replicas run this layer (synchronized layers only;
  // the training step connects it, null disconnects). Used by training calls on replica
  // threads; elsewhere the local batch is the global one.
  void set_sync(std::shared_ptr<const BatchNormSync> sync) { sync_ = std::move(sync); }

  // StatefulLayer: [momentum^k, k-fold mean addend [C], variance addend [C]].
  int64_t pending_update_size() const override { return 1 + 2 * channels_; }
  void take_pending_update(int local, std::span<float> out) override;
  void apply_update(std::span<const float> update) override;

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  // Folds one training call's batch moments into `pending` ([factor, mean, var] addends).
  void fold(std::vector<float>& pending, const BatchNormMoments& m) const;

  BatchNormalizationOptions options_;
  int axis_ = -1;  // the channel axis of a batch (counting the batch), once built
  int64_t channels_ = 0;
  Variable* gamma_ = nullptr;
  Variable* beta_ = nullptr;
  Variable* moving_mean_ = nullptr;
  Variable* moving_variance_ = nullptr;
  // Per local replica: its pending update (empty: none).
  std::vector<std::vector<float>> pending_;
  std::vector<float> immediate_;  // the update of a call outside replicas
  std::shared_ptr<const BatchNormSync> sync_;
  std::shared_ptr<Initializer> beta_init_, gamma_init_, moving_mean_init_, moving_variance_init_;
};

struct LayerNormalizationOptions {
  // The normalized axes (counting the batch; negative from the end); they must be the
  // trailing axes (e.g. {-1} or {2, 3} for a rank-4 input).
  std::vector<int> axis = {-1};
  float epsilon = 1e-3f;
  bool center = true;
  bool scale = true;
  std::string beta_initializer = "zeros";
  std::string gamma_initializer = "ones";
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "layer_normalization", ...
};

// keras.layers.LayerNormalization: each example is normalized over `axis` with its own mean
// and biased variance, then scaled by gamma and shifted by beta (of the normalized dims' shape).
class LayerNormalization : public Layer {
 public:
  explicit LayerNormalization(LayerNormalizationOptions options = {});
  std::string class_name() const override { return "LayerNormalization"; }
  bool supports_masking() const override { return true; }  // passes the time mask on
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;
  Variable* gamma() { return gamma_; }
  Variable* beta() { return beta_; }

 protected:
  void build_impl(const Shape& input_shape) override;
  // Any shape with the built rank and normalized (trailing) axes: gamma and beta depend only on
  // them.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, static_cast<int>(built_axes_.size()));
  }

 private:
  LayerNormalizationOptions options_;
  int begin_axis_ = -1;          // first normalized axis of a batch, once built
  std::vector<int> built_axes_;  // positive, counting the batch, once built
  Variable* gamma_ = nullptr;
  Variable* beta_ = nullptr;
  std::shared_ptr<Initializer> beta_init_, gamma_init_;
};

}  // namespace dtrain::nn
