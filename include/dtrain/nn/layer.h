// Layer: the Keras layer contract. A layer owns its weights (Variables named
// "<layer name>/<weight name>", as Keras names them), is built lazily from the shape of its
// first input (or eagerly via build()), and maps a batch tensor to a batch tensor. Shapes given
// to build() and compute_output_shape() exclude the batch dimension. Not thread-safe: replicas
// that share a layer must not build it concurrently (build before distributing).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/tensor.h"
#include "dtrain/nn/initializers.h"

namespace dtrain::nn {

class KerasTensor;  // dtrain/nn/functional.h

// Layers derive from enable_shared_from_this so that a layer owned by a shared_ptr can be
// called on symbolic tensors (the graph shares its ownership).
class Layer : public std::enable_shared_from_this<Layer> {
 public:
  // An empty name gets a unique Keras-style default from the class ("dense", "dense_1", ...).
  explicit Layer(std::string name = {});
  virtual ~Layer();
  Layer(Layer&&) = default;
  Layer& operator=(Layer&&) = default;

  const std::string& name() const { return name_; }
  // Keras's class name ("Dense").
  virtual std::string class_name() const = 0;

  // Applies the layer: builds it from x's shape on the first call, checks the shape on later
  // ones against accepts_input_shape() (InvalidArgumentError naming the layer and both shapes),
  // then runs call().
  Tensor operator()(const Tensor& x, bool training = false);
  // The computation; x includes the batch dimension.
  virtual Tensor call(const Tensor& x, bool training) = 0;
  // The computation given the input's mask (defined); see call_masked().
  virtual Tensor call_with_mask(const Tensor& x, const Tensor& /*mask*/, bool training) {
    return call(x, training);
  }

  // The Functional API (dtrain/nn/functional.h): records a call of this layer on symbolic
  // tensors, building the layer from their shapes (build_list) and giving the symbolic outputs
  // (compute_output_shapes). The layer must be owned by a shared_ptr (FailedPreconditionError
  // otherwise); shape problems throw InvalidArgumentError naming the layer. The list form is a
  // multi-input call (Add()({a, b})) and gives the layer's only output; symbolic_call gives
  // every output.
  KerasTensor operator()(const KerasTensor& x);
  KerasTensor operator()(const std::vector<KerasTensor>& xs);
  std::vector<KerasTensor> symbolic_call(const std::vector<KerasTensor>& xs, bool list_input);

  // Keras masking: Embedding(mask_zero=true) gives a mask [batch, time] (float32, 1 for a real
  // step, 0 for padding) that Sequential and Functional carry beside each value. call_masked()
  // is operator() with the input's mask (undefined: none): it builds and checks as operator()
  // and runs call_with_mask(), which layers that use masks override (MultiHeadAttention,
  // LSTM/GRU, Bidirectional, GlobalAveragePooling1D); the default ignores the mask.
  // compute_mask() is the output's mask (Keras's compute_mask): by default the input's mask
  // when supports_masking() (layers that keep the time axis: Dense, Dropout, LayerNormalization,
  // Activation, TimeDistributed, merging layers), else none.
  Tensor call_masked(const Tensor& x, const Tensor& mask, bool training);
  virtual Tensor compute_mask(const Tensor& x, const Tensor& mask) const;
  virtual bool supports_masking() const { return false; }
  // The same for several inputs and outputs (one mask per input, undefined for none). The
  // default call ignores the masks; the default masks are compute_mask() for one input, for
  // several the logical and of the defined masks when supports_masking(), and none for the
  // outputs after the first.
  virtual std::vector<Tensor> call_list_masked(std::span<const Tensor> inputs,
                                               std::span<const Tensor> masks, bool training);
  virtual std::vector<Tensor> compute_masks(std::span<const Tensor> inputs,
                                            std::span<const Tensor> masks,
                                            size_t num_outputs) const;

  // Layers with several inputs or outputs (merging layers, attention, RNNs returning states)
  // are called by the Functional API through these. The defaults take exactly one input and
  // give one output through operator() / build() / compute_output_shape(); a multi-input layer
  // overrides all three (building itself and calling mark_built()). Shapes exclude the batch.
  virtual std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training);
  virtual void build_list(std::span<const Shape> input_shapes);
  virtual std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const;

  // Creates the weights for inputs of `input_shape` (without batch). Idempotent for a shape the
  // built layer accepts (accepts_input_shape); another shape throws InvalidArgumentError.
  void build(const Shape& input_shape);
  bool built() const { return built_; }
  // The per-example input shape it was built for (or was declared with input_shape).
  const std::optional<Shape>& input_shape() const { return input_shape_; }
  // The per-example output shape for a per-example input shape.
  virtual Shape compute_output_shape(const Shape& input_shape) const { return input_shape; }

  // Weights in creation order; for models, of all sub-layers in tracking order.
  virtual std::vector<Variable*> weights();
  // Models also honour each sub-layer's trainable flag (a frozen layer's weights are
  // non-trainable), as Keras does.
  virtual std::vector<Variable*> trainable_weights();
  virtual std::vector<Variable*> non_trainable_weights();
  int64_t count_params();

  bool trainable() const { return trainable_; }
  void set_trainable(bool t);

  // Keras's layer config as a JSON object string ({"name": ..., "trainable": ..., ...}).
  virtual std::string config_json() const;

 protected:
  // Subclasses create weights here.
  virtual void build_impl(const Shape& /*input_shape*/) {}
  // Whether a layer built for per-example shape `built_for` takes inputs of `input_shape` (both
  // without batch), as Keras's None dimensions: the default takes only `built_for`; layers whose
  // weights depend only on trailing axes take other sizes of the leading ones (Dense: same rank
  // and last axis, so a model built on 128 tokens runs on 37). docs/decisions.md.
  virtual bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const;
  // Same rank and the same sizes on the last `trailing` axes.
  static bool same_rank_and_trailing(const Shape& built_for, const Shape& input_shape,
                                     int trailing);
  // Creates a weight "<name()>/<weight_name>" initialized by `init`.
  Variable& add_weight(const std::string& weight_name, const Shape& shape, Initializer& init,
                       bool trainable = true);
  // Declares the expected input shape before building (Keras's input_shape argument).
  void set_input_shape(const Shape& s) { input_shape_ = s; }
  // For layers that build themselves in build_list(): marks the layer built (input_shape()
  // stays unset when there is no single input shape).
  void mark_built(std::optional<Shape> input_shape = std::nullopt);
  // Renames after construction (models that take a user-given name).
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  // operator()'s lazy build, or its shape check once built.
  void build_or_check_for(const Tensor& x);
  std::string name_;
  bool built_ = false;
  bool trainable_ = true;
  std::optional<Shape> input_shape_;
  std::vector<std::unique_ptr<Variable>> weights_;
  int symbolic_calls_ = 0;  // nodes recorded by symbolic_call (Keras's len(_inbound_nodes))
};

// Keras's unique default names: the first layer of base "dense" is "dense", then "dense_1",...
std::string unique_layer_name(const std::string& base);
// Resets the default-name counters (keras.backend.clear_session()).
void clear_session();
// "Dense" → "dense", "MyModel" → "my_model".
std::string to_snake_case(const std::string& class_name);

}  // namespace dtrain::nn
