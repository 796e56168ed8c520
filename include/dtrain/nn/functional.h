// The Keras Functional API: symbolic tensors (KerasTensor) made by Input(), layers called on them
// to record a graph of nodes, and Functional, a model that runs that graph (a DAG: residual
// connections, shared layers, several inputs and outputs):
//
//   nn::KerasTensor x = nn::Input(Shape{784});
//   auto dense = nn::shared(nn::Dense(64, {.activation = "relu"}));
//   nn::KerasTensor h = (*dense)(x);
//   nn::KerasTensor y = nn::call(nn::Dense(64), h);        // the same with a fresh layer
//   nn::KerasTensor s = nn::call(nn::Add(), {h, y});       // a residual connection
//   nn::Functional model({x}, {nn::call(nn::Dense(10), s)}, {.name = "resnet"});
//
// A layer called on KerasTensors must be owned by a shared_ptr (nn::shared or nn::call do it),
// since the graph and then the model own it. Not thread-safe while recording; a finished
// Functional is called like any model (thread-compatible as Layer).
#pragma once

#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/nn/model.h"

namespace dtrain::nn {

class KerasTensor;
class Functional;

namespace detail {
// One call of a layer on symbolic tensors (Keras's Node). An input node (made by Input()) has
// no inputs.
struct SymbolicNode {
  std::shared_ptr<Layer> layer;
  int node_index = 0;                // the layer's how-manieth symbolic call (0 for the first)
  std::vector<KerasTensor> inputs;   // what it was called on
  bool list_input = false;           // called with a list (merging layers) rather than a tensor
  std::vector<Shape> output_shapes;  // per example
  bool is_input() const;
};
}  // namespace detail

// A symbolic tensor: the per-example shape of a value, and which call of which layer produces
// it (Keras's _keras_history: layer, node index, tensor index).
class KerasTensor {
 public:
  KerasTensor() = default;
  KerasTensor(std::shared_ptr<const detail::SymbolicNode> node, int tensor_index)
      : node_(std::move(node)), tensor_index_(tensor_index) {}

  bool defined() const { return node_ != nullptr; }
  // The per-example shape (without the batch dimension).
  const Shape& shape() const { return node_->output_shapes[static_cast<size_t>(tensor_index_)]; }
  Layer& layer() const { return *node_->layer; }
  int node_index() const { return node_->node_index; }
  int tensor_index() const { return tensor_index_; }
  const std::shared_ptr<const detail::SymbolicNode>& node() const { return node_; }
  // "input_1[0][0]"-style coordinates as Keras prints them.
  std::string to_string() const;

 private:
  std::shared_ptr<const detail::SymbolicNode> node_;
  int tensor_index_ = 0;
};

struct InputOptions {
  std::string name = {};  // default "input_1", "input_2", ... (Keras 2's names)
};

// A symbolic input of per-example shape `shape` (keras.Input): an InputLayer and its node.
KerasTensor Input(const Shape& shape, InputOptions options = {});

// `layer` (taken by value, or a shared_ptr to share it) owned by a shared_ptr, so it can be
// called on KerasTensors: auto dense = nn::shared(nn::Dense(64)); auto h = (*dense)(x);
template <class L, class = std::enable_if_t<std::is_base_of_v<Layer, std::decay_t<L>>>>
std::shared_ptr<std::decay_t<L>> shared(L&& layer) {
  return std::make_shared<std::decay_t<L>>(std::forward<L>(layer));
}

// Calls `layer` on symbolic tensors (Layer::operator() on a layer the graph then owns):
// nn::call(nn::Dense(10), x), nn::call(nn::Concatenate(), {a, b}).
KerasTensor call(const LayerRef& layer, const KerasTensor& x);
KerasTensor call(const LayerRef& layer, const std::vector<KerasTensor>& xs);

struct FunctionalOptions {
  std::string name = {};  // default "model", "model_1", ... (Keras 2's names)
  bool trainable = true;  // the model's trainable flag
};

// A model defined by a graph of layer calls from `inputs` to `outputs` (keras.Model(inputs,
// outputs); Keras's class "Functional"). layers() lists every layer once, InputLayers included,
// in Keras's order (by depth from the inputs, then by traversal order), which is also the order
// of the checkpoint keys layer-<i> / layer_with_weights-<j>. Throws InvalidArgumentError naming
// the model when an input is not an Input() tensor or is listed twice, an output needs an input
// that is not listed ("graph disconnected"), an input does not reach any output, or two layers
// share a name.
class Functional : public Model {
 public:
  Functional(const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs,
             FunctionalOptions options = {});
  std::string class_name() const override { return "Functional"; }

  const std::vector<KerasTensor>& inputs() const { return inputs_; }
  const std::vector<KerasTensor>& outputs() const { return outputs_; }
  const std::vector<std::shared_ptr<const detail::SymbolicNode>>& nodes() const { return nodes_; }

  // One input, one output (fit/evaluate/predict use this). InvalidArgumentError otherwise.
  Tensor call(const Tensor& x, bool training) override;
  // Inputs in the order of inputs(), outputs in the order of outputs(); shapes are checked
  // against the inputs' (InvalidArgumentError naming the model and the input).
  std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training) override;
  void build_list(std::span<const Shape> input_shapes) override;
  std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const override;
  Shape compute_output_shape(const Shape& input_shape) const override;

  using Model::summary;
  // Keras 2's Functional table, with the "Connected to" column (or the Sequential-like table
  // for a chain of single-input layers, as Keras prints it).
  void summary(std::ostream& os) const override;
  // Keras 2's model JSON: {"class_name": "Functional", "config": {"name", "trainable",
  // "layers": [{..., "inbound_nodes": [[["input_1", 0, 0, {}]]]}], "input_layers",
  // "output_layers"}, "keras_version", "backend"}.
  std::string to_json() const override;
  // Keras 3's config of the same model ({"module": "keras", "class_name": "Functional", ...}):
  // inbound nodes as {"args": [...], "kwargs": {}} of __keras_tensor__ objects.
  std::string to_json_keras3() const;
  // The "config" object of to_json() (a nested Functional's layer config).
  std::string config_json() const override;

  // The index, among this model's calls of `node.layer`, of `node` (Keras's node_conversion_map
  // for configs); -1 when the node is not part of the model.
  int config_node_index(const detail::SymbolicNode& node) const;

 private:
  void check_input_shapes(std::span<const Shape> input_shapes) const;

  std::vector<KerasTensor> inputs_;
  std::vector<KerasTensor> outputs_;
  // Every node in the model in an execution order (inputs before their consumers).
  std::vector<std::shared_ptr<const detail::SymbolicNode>> nodes_;
  // call_list keeps every node's outputs in one flat vector: node i's outputs start at
  // output_offsets_[i]; arg_slots_[i] are where its arguments are.
  size_t num_slots_ = 0;
  std::vector<size_t> output_offsets_;
  std::vector<std::vector<size_t>> arg_slots_;
  std::vector<size_t> input_slots_;
  std::vector<size_t> output_slots_;
};

}  // namespace dtrain::nn
