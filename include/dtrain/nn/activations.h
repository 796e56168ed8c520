// The activation layers (keras.layers.ReLU, LeakyReLU, Softmax, ELU). The Activation layer,
// which applies any named activation, is in dtrain/nn/layers.h. Thread-safety as for Layer.
#pragma once

#include <optional>
#include <string>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct ReLUOptions {
  std::optional<float> max_value = std::nullopt;  // none: unbounded
  float negative_slope = 0.0f;
  float threshold = 0.0f;
  std::string name = {};  // default "re_lu", "re_lu_1", ...
};

// x ≥ max_value → max_value; threshold < x < max_value → x; else negative_slope·(x − threshold).
class ReLU : public Layer {
 public:
  explicit ReLU(ReLUOptions options = {});
  std::string class_name() const override { return "ReLU"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 private:
  ReLUOptions options_;
};

struct LeakyReLUOptions {
  float negative_slope = 0.3f;  // Keras's default (Keras 2 calls it alpha)
  std::string name = {};        // default "leaky_re_lu", ...
};

// x > 0 ? x : negative_slope·x.
class LeakyReLU : public Layer {
 public:
  explicit LeakyReLU(LeakyReLUOptions options = {});
  std::string class_name() const override { return "LeakyReLU"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 private:
  float negative_slope_;
};

struct SoftmaxOptions {
  int axis = -1;  // only the last axis (or, equivalently, its positive index) is supported
  std::string name = {};
};

// Softmax along the last axis.
class Softmax : public Layer {
 public:
  explicit Softmax(SoftmaxOptions options = {});
  std::string class_name() const override { return "Softmax"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  int axis_;
};

struct ELUOptions {
  float alpha = 1.0f;
  std::string name = {};
};

// x > 0 ? x : alpha·(eˣ − 1).
class ELU : public Layer {
 public:
  explicit ELU(ELUOptions options = {});
  std::string class_name() const override { return "ELU"; }
  Tensor call(const Tensor& x, bool training) override;
  std::string config_json() const override;

 private:
  float alpha_;
};

}  // namespace dtrain::nn
