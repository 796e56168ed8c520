// The Keras pooling layers (keras.layers.MaxPooling1D/2D, AveragePooling1D/2D,
// GlobalAveragePooling1D/2D, GlobalMaxPooling2D). Channels-last by default; channels_first is
// computed by transposing to channels-last and back. strides default to pool_size as in Keras.
// "same" average pooling divides by the number of input elements in each window (TF).
// Thread-safety as for Layer.
//
//   model.add_layer(nn::MaxPooling2D({.pool_size = {2, 2}}));
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"
#include "dtrain/ops/pooling.h"

namespace dtrain::nn {

struct PoolOptions {
  std::vector<int64_t> pool_size = {2};  // one value for every axis, or one per axis
  std::vector<int64_t> strides = {};     // empty: pool_size
  std::string padding = "valid";         // valid or same
  std::string data_format = "channels_last";
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};
};

// The shared machinery of MaxPooling1D/2D and AveragePooling1D/2D.
class BasePool : public Layer {
 public:
  std::string class_name() const override { return class_name_; }
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  BasePool(ops::PoolKind kind, int rank, const PoolOptions& options, const char* default_name,
           const char* class_name);
  void build_impl(const Shape& input_shape) override;

 private:
  void check_rank(const Shape& s) const;
  ops::PoolKind kind_;
  int rank_;
  std::vector<int64_t> pool_, strides_;
  bool channels_first_;
  std::shared_ptr<ops::Pool2DAttrs> attrs_;
  std::string class_name_;
};

class MaxPooling1D : public BasePool {
 public:
  explicit MaxPooling1D(PoolOptions options = {});
};
class MaxPooling2D : public BasePool {
 public:
  explicit MaxPooling2D(PoolOptions options = {});
};
class AveragePooling1D : public BasePool {
 public:
  explicit AveragePooling1D(PoolOptions options = {});
};
class AveragePooling2D : public BasePool {
 public:
  explicit AveragePooling2D(PoolOptions options = {});
};

struct GlobalPoolOptions {
  std::string data_format = "channels_last";
  bool keepdims = false;  // keep the pooled axes with size 1
  std::optional<Shape> input_shape = std::nullopt;
  std::string name = {};
};

// Max or mean over every spatial axis: [batch, ..., channels] → [batch, channels].
class BaseGlobalPool : public Layer {
 public:
  std::string class_name() const override { return class_name_; }
  Tensor call(const Tensor& x, bool training) override;
  // GlobalAveragePooling1D: the mean over the unmasked steps (Keras's masked mean; a fully
  // masked row gives 0, where Keras divides by zero). Other global pools ignore the mask.
  Tensor call_with_mask(const Tensor& x, const Tensor& mask, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::string config_json() const override;

 protected:
  BaseGlobalPool(ops::PoolKind kind, int rank, const GlobalPoolOptions& options,
                 const char* default_name, const char* class_name);
  void build_impl(const Shape& input_shape) override;

 private:
  std::string class_name_;
  ops::PoolKind kind_;
  int rank_;
  bool channels_first_;
  bool keepdims_;
};

class GlobalAveragePooling1D : public BaseGlobalPool {
 public:
  explicit GlobalAveragePooling1D(GlobalPoolOptions options = {});
};
class GlobalAveragePooling2D : public BaseGlobalPool {
 public:
  explicit GlobalAveragePooling2D(GlobalPoolOptions options = {});
};
class GlobalMaxPooling2D : public BaseGlobalPool {
 public:
  explicit GlobalMaxPooling2D(GlobalPoolOptions options = {});
};

}  // namespace dtrain::nn
