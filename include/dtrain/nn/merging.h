// The Keras merging layers: Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate, Dot.
// Each takes a list of inputs through the multi-input interface (call_list / build_list /
// compute_output_shapes), as in the Functional API: nn::call(nn::Add(), {a, b}). Elementwise
// merges need inputs of one rank whose dimensions agree or are 1 (broadcast). Errors name the
// layer: a single input, mismatched shapes, a concatenation axis out of range. Thread-safety as
// for Layer.
#pragma once

#include <array>
#include <string>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct MergeOptions {
  std::string name = {};  // default "add", "add_1", ... after the class
};

// The shared base: checks and builds from the input shapes, folds the inputs pairwise.
class Merge : public Layer {
 public:
  // A merge needs a list of inputs; the single-tensor call throws InvalidArgumentError.
  Tensor call(const Tensor& x, bool training) override;
  std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training) override;
  // The output mask is the logical and of the inputs' masks (Keras's _Merge.compute_mask).
  bool supports_masking() const override { return true; }
  void build_list(std::span<const Shape> input_shapes) override;
  std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const override;

 protected:
  explicit Merge(std::string name) : Layer(std::move(name)) {}
  // The output for the inputs (each with the batch dimension), shapes already checked.
  virtual Tensor merge(std::span<const Tensor> inputs) const = 0;
  // The output shape for per-example input shapes; throws InvalidArgumentError naming the layer.
  virtual Shape merged_shape(std::span<const Shape> input_shapes) const;
  // Exactly this many inputs (0: two or more).
  virtual size_t arity() const { return 0; }
};

#define DTRAIN_ELEMENTWISE_MERGE(Name)                           \
  class Name : public Merge {                                    \
   public:                                                       \
    explicit Name(MergeOptions options = {});                    \
    std::string class_name() const override { return #Name; }    \
                                                                 \
   protected:                                                    \
    Tensor merge(std::span<const Tensor> inputs) const override; \
  };

// x_0 + x_1 + ... (keras.layers.Add).
DTRAIN_ELEMENTWISE_MERGE(Add)
// x_0 ⊙ x_1 ⊙ ... (keras.layers.Multiply).
DTRAIN_ELEMENTWISE_MERGE(Multiply)
// (x_0 + x_1 + ...) / n (keras.layers.Average).
DTRAIN_ELEMENTWISE_MERGE(Average)
// Elementwise max / min (keras.layers.Maximum, Minimum).
DTRAIN_ELEMENTWISE_MERGE(Maximum)
DTRAIN_ELEMENTWISE_MERGE(Minimum)
#undef DTRAIN_ELEMENTWISE_MERGE

// x_0 − x_1: exactly two inputs (keras.layers.Subtract).
class Subtract : public Merge {
 public:
  explicit Subtract(MergeOptions options = {});
  std::string class_name() const override { return "Subtract"; }

 protected:
  Tensor merge(std::span<const Tensor> inputs) const override;
  size_t arity() const override { return 2; }
};

struct ConcatenateOptions {
  int axis = -1;          // axis of the batched tensor (0, the batch, is not allowed)
  std::string name = {};  // default "concatenate", ...
};

// Joins its inputs along `axis` (keras.layers.Concatenate); the other dimensions must agree.
class Concatenate : public Merge {
 public:
  explicit Concatenate(ConcatenateOptions options = {});
  std::string class_name() const override { return "Concatenate"; }
  // Along the features only: a time mask does not survive a concatenation along time.
  bool supports_masking() const override { return axis_ == -1 || axis_ >= 2; }
  std::string config_json() const override;
  int axis() const { return axis_; }

 protected:
  Tensor merge(std::span<const Tensor> inputs) const override;
  Shape merged_shape(std::span<const Shape> input_shapes) const override;

 private:
  int axis_;
};

struct DotOptions {
  // The axes (of the batched tensors; negative from the end) contracted in the first and the
  // second input; Keras's axes=k is {k, k}. The batch axis 0 cannot be contracted.
  std::array<int, 2> axes = {-1, -1};
  bool normalize = false;  // L2-normalize both inputs along their axes first (cosine proximity)
  std::string name = {};   // default "dot", ...
};

// The batched dot product of two inputs (keras.layers.Dot, Keras's batch_dot): for x [B, ...]
// and y [B, ...], the sum over x's axes[0] and y's axes[1] (of equal size), the output holding
// x's other dimensions, then y's: [B, m, k]·[B, n, k] with axes {2, 2} gives [B, m, n]; two
// [B, k] give [B, 1]. With normalize, each input is first divided by its L2 norm along the
// axis (at least 1e-6, as Keras's l2_normalize with epsilon 1e-12 on the squared sum).
class Dot : public Merge {
 public:
  explicit Dot(DotOptions options = {});
  std::string class_name() const override { return "Dot"; }
  std::string config_json() const override;
  const DotOptions& options() const { return options_; }

 protected:
  Tensor merge(std::span<const Tensor> inputs) const override;
  Shape merged_shape(std::span<const Shape> input_shapes) const override;
  size_t arity() const override { return 2; }

 private:
  // The contracted axes of per-example shapes (0-based, without the batch), checked.
  std::array<int, 2> example_axes(std::span<const Shape> shapes) const;
  DotOptions options_;
};

}  // namespace dtrain::nn
