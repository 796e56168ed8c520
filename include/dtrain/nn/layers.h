// The core Keras layers: InputLayer, Dense, Flatten, Dropout, Activation, Masking.
// Thread-safety as for Layer.
#pragma once

#include <array>
#include <atomic>
#include <optional>
#include <string>

#include "dtrain/core/random.h"
#include "dtrain/nn/layer.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::nn {

struct InputLayerOptions {
  std::string name = {};  // default "input_1"-style name
};

// Declares the per-example input shape of a Sequential model (keras.layers.InputLayer).
class InputLayer : public Layer {
 public:
  explicit InputLayer(const Shape& shape, InputLayerOptions options = {});
  std::string class_name() const override { return "InputLayer"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;
};

struct DenseOptions {
  std::string activation = "linear";                  // linear, relu, sigmoid, tanh, softmax
  bool use_bias = true;                               // add a bias vector
  std::string kernel_initializer = "glorot_uniform";  // Keras identifier
  std::string bias_initializer = "zeros";             // Keras identifier
  std::optional<uint64_t> seed = std::nullopt;        // kernel initializer seed
  std::optional<Shape> input_shape = std::nullopt;    // per-example input shape (builds now)
  std::string name = {};                              // default "dense", "dense_1", ...
};

// y = activation(x · kernel + bias), kernel [in, units] (Keras orientation). Inputs of rank > 2
// are transformed along their last axis.
class Dense : public Layer {
 public:
  explicit Dense(int64_t units, DenseOptions options = {});
  std::string class_name() const override { return "Dense"; }
  bool supports_masking() const override { return true; }  // passes the time mask on
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

  int64_t units() const { return units_; }
  ops::Activation activation() const { return activation_; }
  // Valid once built.
  Variable& kernel() { return *kernel_; }
  Variable* bias() { return bias_; }

 protected:
  void build_impl(const Shape& input_shape) override;
  // Any shape with the built rank and last axis (the kernel depends only on it).
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 1);
  }

 private:
  int64_t units_;
  ops::Activation activation_;
  bool use_bias_;
  std::shared_ptr<Initializer> kernel_init_;
  std::shared_ptr<Initializer> bias_init_;
  Variable* kernel_ = nullptr;
  Variable* bias_ = nullptr;
};

struct FlattenOptions {
  std::optional<Shape> input_shape = std::nullopt;  // per-example input shape
  std::string name = {};
};

// [batch, d1, d2, ...] → [batch, d1·d2·...].
class Flatten : public Layer {
 public:
  explicit Flatten(FlattenOptions options = {});
  std::string class_name() const override { return "Flatten"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;
};

struct DropoutOptions {
  std::optional<uint64_t> seed = std::nullopt;  // default: drawn from dtrain::next_seed()
  std::string name = {};
};

// During training, zeroes each element with probability `rate` and scales the rest by
// 1/(1 − rate); the identity at inference. The RNG state is exposed for checkpoints.
//
// Draws: call k (counting training calls) takes its mask from the Philox stream of the layer's
// seed starting at value k·2^32. Under a strategy with several replicas in sync, each replica
// counts its own calls and draws from a stream keyed by the seed and its global replica id
// (core/random.h: current_replica_stream), so a replica's masks depend neither on the order in
// which replica threads arrive nor on which worker runs it, and no two replicas share masks.
class Dropout : public Layer {
 public:
  // Local replicas with their own call counter; more fall back to one shared counter
  // (race-free, but then which replica gets which call index depends on timing).
  static constexpr int kMaxLocalReplicas = 64;

  explicit Dropout(float rate, DropoutOptions options = {});
  // Movable (layers are handed to models by value); the counters' values move with it.
  Dropout(Dropout&& other) noexcept;
  std::string class_name() const override { return "Dropout"; }
  bool supports_masking() const override { return true; }  // passes the time mask on
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;
  float rate() const { return rate_; }
  // {seed, training calls so far} (of local replica 0 under a strategy: all replicas make the
  // same calls).
  RngState rng_state() const { return {seed_value_, calls_[0].load(std::memory_order_relaxed)}; }
  // Sets the seed and every replica's call count.
  void set_rng_state(RngState s);

 protected:
  // No weights: any shape of the built rank.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 0);
  }

 private:
  float rate_;
  std::optional<uint64_t> seed_;
  uint64_t seed_value_;
  // Training calls so far: [0] outside strategies and for local replica 0, [r] for local
  // replica r. Atomic, so that threads calling one layer concurrently never share a call index.
  std::array<std::atomic<uint64_t>, kMaxLocalReplicas> calls_{};
};

struct ActivationOptions {
  std::string name = {};
};

// Applies a named activation (keras.layers.Activation).
class Activation : public Layer {
 public:
  explicit Activation(const std::string& activation, ActivationOptions options = {});
  std::string class_name() const override { return "Activation"; }
  bool supports_masking() const override { return true; }  // passes the time mask on
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 protected:
  // No weights: any shape of the built rank.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 0);
  }

 private:
  ops::Activation activation_;
};

struct MaskingOptions {
  std::optional<Shape> input_shape = std::nullopt;  // per-example [time, features] (builds now)
  std::string name = {};                            // default "masking", "masking_1", ...
};

// Marks padding in a sequence of feature vectors (keras.layers.Masking): a step whose features
// all equal mask_value is masked. The output is the input with the masked steps zeroed, and its
// mask ([batch, time], 1 where any feature differs from mask_value, as Keras's not_equal: a NaN
// mask_value masks nothing) goes to the layers after it (LSTM/GRU skip the masked steps,
// GlobalAveragePooling1D and MultiHeadAttention leave them out). Takes inputs of rank 3 [batch,
// time, features] only: dtrain's masks are [batch, time] (Keras also accepts other ranks).
class Masking : public Layer {
 public:
  explicit Masking(float mask_value = 0.0f, MaskingOptions options = {});
  std::string class_name() const override { return "Masking"; }
  bool supports_masking() const override { return true; }
  Tensor call(const Tensor& x, bool training) override;
  // The mask made from `x`; an incoming mask is replaced, as Keras's Masking does.
  Tensor compute_mask(const Tensor& x, const Tensor& mask) const override;
  std::string config_json() const override;
  float mask_value() const { return mask_value_; }

 protected:
  void build_impl(const Shape& input_shape) override;
  // No weights: any [time, features].
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 0);
  }

 private:
  // 1 where any feature of a step differs from mask_value: float32 [batch, time].
  Tensor step_mask(const Tensor& x) const;
  float mask_value_;
};

}  // namespace dtrain::nn
