// The Keras convolution layers (keras.layers.Conv1D, Conv2D, DepthwiseConv2D, Conv2DTranspose).
// Channels-last (NHWC) by default as in Keras; data_format = "channels_first" is accepted and
// computed by transposing to channels-last and back. Weights as Keras lays them out:
//   Conv1D           kernel [k, in / groups, filters],        bias [filters]
//   Conv2D           kernel [kh, kw, in / groups, filters],   bias [filters]   (HWIO)
//   DepthwiseConv2D  depthwise_kernel [kh, kw, in, depth_multiplier], bias [in · depth_multiplier]
//   Conv2DTranspose  kernel [kh, kw, filters, in],           bias [filters]
// Thread-safety as for Layer.
//
//   model.add_layer(nn::Conv2D(32, {3, 3}, {.activation = "relu", .input_shape = Shape{28, 28,
//   1}}));
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"
#include "dtrain/ops/convolution.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::nn {

struct ConvOptions {
  std::vector<int64_t> strides = {1};         // one value for every axis, or one per axis
  std::string padding = "valid";              // valid, same (Conv1D: also causal)
  std::string data_format = "channels_last";  // or channels_first
  std::vector<int64_t> dilation_rate = {1};   // as strides
  int64_t groups = 1;                         // Conv1D/Conv2D: input channels split in groups
  int64_t depth_multiplier = 1;               // DepthwiseConv2D only
  // Conv2DTranspose only: extra rows/columns at the end of the output, each < its stride (one
  // value for every axis, or one per axis); empty: none (Keras's None).
  std::vector<int64_t> output_padding = {};
  std::string activation = "linear";  // any ops::activation_from_name name
  bool use_bias = true;
  std::string kernel_initializer = "glorot_uniform";  // Keras identifier or config JSON
  std::string bias_initializer = "zeros";
  std::optional<uint64_t> seed = std::nullopt;      // kernel initializer seed
  std::optional<Shape> input_shape = std::nullopt;  // per-example input shape (builds now)
  std::string name = {};                            // default "conv2d", "conv2d_1", ...
};

// The shared machinery of the four layers (not a Keras class itself).
class BaseConv : public Layer {
 public:
  enum class Kind { kConv, kDepthwise, kTranspose };

  // Keras's class name (set by the subclass, so that building from the constructor can name it).
  std::string class_name() const override { return class_name_; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

  int64_t filters() const { return filters_; }
  const std::vector<int64_t>& kernel_size() const { return kernel_size_; }
  ops::Padding padding() const { return attrs_->padding; }
  bool channels_first() const { return channels_first_; }
  ops::Activation activation() const { return activation_; }
  // "kernel" (or "depthwise_kernel") and "bias"; valid once built.
  Variable& kernel() { return *kernel_; }
  Variable* bias() { return bias_; }

 protected:
  BaseConv(Kind kind, int rank, int64_t filters, std::vector<int64_t> kernel_size,
           const ConvOptions& options, const char* default_name);
  void build_impl(const Shape& input_shape) override;

 private:
  // The channel count of a per-example shape, after checking its rank (errors name the layer).
  int64_t channels_of(const Shape& s) const;
  std::string where() const;

  std::string class_name_;
  Kind kind_;
  int rank_;
  int64_t filters_;  // DepthwiseConv2D: in · depth_multiplier once built
  int64_t depth_multiplier_;
  std::vector<int64_t> kernel_size_, strides_, dilation_;
  bool channels_first_;
  ops::Activation activation_;
  bool use_bias_;
  std::shared_ptr<Initializer> kernel_init_, bias_init_;
  std::shared_ptr<ops::Conv2DAttrs> attrs_;
  std::vector<int64_t> output_padding_;           // Conv2DTranspose; empty: none
  std::shared_ptr<ops::Conv2DAttrs> full_attrs_;  // attrs_ under valid padding (output_padding)
  Variable* kernel_ = nullptr;
  Variable* bias_ = nullptr;
};

// 1-D convolution over [batch, steps, channels].
class Conv1D : public BaseConv {
 public:
  Conv1D(int64_t filters, std::vector<int64_t> kernel_size, ConvOptions options = {});
};

// 2-D convolution over [batch, height, width, channels].
class Conv2D : public BaseConv {
 public:
  Conv2D(int64_t filters, std::vector<int64_t> kernel_size, ConvOptions options = {});
};

// One filter bank per input channel (options.depth_multiplier outputs each).
class DepthwiseConv2D : public BaseConv {
 public:
  explicit DepthwiseConv2D(std::vector<int64_t> kernel_size, ConvOptions options = {});
};

// The transposed ("deconvolution") 2-D convolution. With output_padding p the output size along
// an axis is (in − 1)·stride + k_d − 2·pad + p (k_d the dilated kernel size, pad 0 for valid and
// k_d / 2 for same), as Keras's deconv_output_length and tf.nn.conv2d_transpose compute it.
class Conv2DTranspose : public BaseConv {
 public:
  Conv2DTranspose(int64_t filters, std::vector<int64_t> kernel_size, ConvOptions options = {});
};

}  // namespace dtrain::nn
