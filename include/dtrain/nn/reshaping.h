// The reshaping layers (keras.layers.Reshape, Permute, ZeroPadding2D, UpSampling2D) and the
// two that keep the shape (Rescaling, SpatialDropout2D), with Keras's arguments. Shapes exclude
// the batch dimension, as Keras's target_shape and dims do. Thread-safety as for Layer;
// SpatialDropout2D's training calls may run concurrently on a strategy's replica threads.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"
#include "dtrain/nn/layers.h"

namespace dtrain::nn {

struct ReshapeOptions {
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "reshape", ...
};

// Reshapes each example to target_shape; one entry may be -1 (inferred).
class Reshape : public Layer {
 public:
  explicit Reshape(std::vector<int64_t> target_shape, ReshapeOptions options = {});
  std::string class_name() const override { return "Reshape"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  // Checks that the input shape fits target_shape.
  void build_impl(const Shape& input_shape) override { compute_output_shape(input_shape); }

 private:
  std::vector<int64_t> target_;
};

struct PermuteOptions {
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "permute", ...
};

// Permutes the per-example axes; dims is 1-based as in Keras ((2, 1) swaps the two axes after
// the batch).
class Permute : public Layer {
 public:
  explicit Permute(std::vector<int> dims, PermuteOptions options = {});
  std::string class_name() const override { return "Permute"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override { compute_output_shape(input_shape); }

 private:
  std::vector<int> dims_;
  std::vector<int> perm_;  // 0-based, with the batch axis
};

enum class DataFormat { kChannelsLast, kChannelsFirst };
// "channels_last" / "channels_first"; InvalidArgumentError naming `where` otherwise.
DataFormat data_format_from_name(const std::string& name, const std::string& where);
const char* data_format_name(DataFormat f);

struct ZeroPadding2DOptions {
  // ((top, bottom), (left, right)).
  std::array<std::array<int64_t, 2>, 2> padding = {{{1, 1}, {1, 1}}};
  DataFormat data_format = DataFormat::kChannelsLast;
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "zero_padding2d", ...
};

// Zero rows and columns around images [batch, rows, cols, channels] (channels_first:
// [batch, channels, rows, cols]).
class ZeroPadding2D : public Layer {
 public:
  explicit ZeroPadding2D(ZeroPadding2DOptions options = {});
  std::string class_name() const override { return "ZeroPadding2D"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  ZeroPadding2DOptions options_;
};

struct UpSampling2DOptions {
  std::array<int64_t, 2> size = {2, 2};  // rows, cols factors
  DataFormat data_format = DataFormat::kChannelsLast;
  std::string interpolation = "nearest";  // only "nearest"
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "up_sampling2d", ...
};

// Repeats rows and columns (nearest-neighbour upsampling).
class UpSampling2D : public Layer {
 public:
  explicit UpSampling2D(UpSampling2DOptions options = {});
  std::string class_name() const override { return "UpSampling2D"; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  UpSampling2DOptions options_;
};

struct RescalingOptions {
  float offset = 0.0f;
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};  // default "rescaling", ...
};

// y = x·scale + offset (e.g. scale = 1/255 for image pixels).
class Rescaling : public Layer {
 public:
  explicit Rescaling(float scale, RescalingOptions options = {});
  std::string class_name() const override { return "Rescaling"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 private:
  float scale_;
  float offset_;
};

struct SpatialDropout2DOptions {
  DataFormat data_format = DataFormat::kChannelsLast;
  std::optional<uint64_t> seed = std::nullopt;  // default: drawn from dtrain::next_seed()
  std::string name = {};                        // default "spatial_dropout2d", ...
};

// Dropout of whole feature maps: during training each (example, channel) of images
// [batch, rows, cols, channels] is zeroed with probability `rate` and the rest scaled by
// 1/(1 − rate); the identity at inference. A Dropout whose mask has shape [batch, 1, 1, C]
// (channels_first: [batch, C, 1, 1]), drawn exactly as Dropout draws (per call and replica),
// so its RNG state is checkpointed like Dropout's.
class SpatialDropout2D : public Dropout {
 public:
  explicit SpatialDropout2D(float rate, SpatialDropout2DOptions options = {});
  std::string class_name() const override { return "SpatialDropout2D"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  DataFormat data_format_;
};

}  // namespace dtrain::nn
