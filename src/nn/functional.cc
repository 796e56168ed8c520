// The Functional API: symbolic calls of layers, and Functional's graph (mapped as Keras's
// functional._map_graph_network does, so that layers() has Keras's order) and its execution.
// summary() is in functional_summary.cc, the JSON configs in functional_config.cc.
#include "dtrain/nn/functional.h"

#include <algorithm>
#include <map>
#include <set>

#include "config.h"
#include "dtrain/nn/layers.h"
#include "masking.h"

namespace dtrain::nn {

namespace detail {
bool SymbolicNode::is_input() const { return inputs.empty(); }
}  // namespace detail

std::string KerasTensor::to_string() const {
  if (!defined()) return "<undefined KerasTensor>";
  return str_cat(layer().name(), "[", node_index(), "][", tensor_index_, "]");
}

namespace {

std::shared_ptr<const detail::SymbolicNode> make_input_node(std::shared_ptr<Layer> input_layer) {
  auto node = std::make_shared<detail::SymbolicNode>();
  node->output_shapes = {*input_layer->input_shape()};
  node->layer = std::move(input_layer);
  return node;
}

}  // namespace

namespace detail {
// The symbolic tensor of an existing InputLayer (configs rebuild their inputs this way).
KerasTensor input_tensor_of(std::shared_ptr<Layer> input_layer) {
  return KerasTensor(make_input_node(std::move(input_layer)), 0);
}
}  // namespace detail

KerasTensor Input(const Shape& shape, InputOptions options) {
  std::string name = options.name;
  if (name.empty()) {
    // Keras 2 numbers inputs from 1: input_1, input_2, ...
    const std::string n = unique_layer_name("input");
    const int k = n == "input" ? 0 : std::stoi(n.substr(6));
    name = str_cat("input_", k + 1);
  }
  return detail::input_tensor_of(
      std::make_shared<InputLayer>(shape, InputLayerOptions{.name = name}));
}

// ---------------------------------------------------------------------------------------------
// Symbolic calls.

std::vector<KerasTensor> Layer::symbolic_call(const std::vector<KerasTensor>& xs, bool list_input) {
  std::shared_ptr<Layer> self = weak_from_this().lock();
  if (self == nullptr) {
    throw FailedPreconditionError(str_cat(
        class_name(), " '", name_,
        "': a layer called on KerasTensors must be owned by a shared_ptr (the model keeps it): "
        "create it with nn::shared(...) or call it with nn::call(layer, inputs)"));
  }
  DTRAIN_CHECK(!xs.empty(), class_name(), " '", name_, "': called on an empty list of inputs");
  std::vector<Shape> shapes;
  shapes.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    DTRAIN_CHECK(xs[i].defined(), class_name(), " '", name_, "': input ", i,
                 " is an undefined KerasTensor");
    shapes.push_back(xs[i].shape());
  }
  build_list(shapes);
  auto node = std::make_shared<detail::SymbolicNode>();
  node->output_shapes = compute_output_shapes(shapes);
  node->layer = std::move(self);
  node->node_index = symbolic_calls_++;
  node->inputs = xs;
  node->list_input = list_input;
  std::vector<KerasTensor> out;
  for (size_t i = 0; i < node->output_shapes.size(); ++i)
    out.emplace_back(node, static_cast<int>(i));
  return out;
}

KerasTensor Layer::operator()(const KerasTensor& x) {
  std::vector<KerasTensor> out = symbolic_call({x}, /*list_input=*/false);
  DTRAIN_CHECK(out.size() == 1, class_name(), " '", name_, "' has ", out.size(),
               " outputs; use symbolic_call() to get them all");
  return out[0];
}

KerasTensor Layer::operator()(const std::vector<KerasTensor>& xs) {
  std::vector<KerasTensor> out = symbolic_call(xs, /*list_input=*/true);
  DTRAIN_CHECK(out.size() == 1, class_name(), " '", name_, "' has ", out.size(),
               " outputs; use symbolic_call() to get them all");
  return out[0];
}

KerasTensor call(const LayerRef& layer, const KerasTensor& x) { return (*layer.get())(x); }
KerasTensor call(const LayerRef& layer, const std::vector<KerasTensor>& xs) {
  return (*layer.get())(xs);
}

// ---------------------------------------------------------------------------------------------
// Mapping the graph.

namespace {

using NodePtr = std::shared_ptr<const detail::SymbolicNode>;

struct GraphMap {
  const std::string& model;
  const std::set<const detail::SymbolicNode*>& input_nodes;
  std::vector<NodePtr> post_order;  // Keras's nodes_in_decreasing_depth
  std::set<const detail::SymbolicNode*> finished;
  std::map<const Layer*, int> layer_indices;  // traversal order, for sorting within a depth
  std::vector<std::shared_ptr<Layer>> layers_seen;

  void visit(const NodePtr& node, const std::string& consumer) {
    if (finished.count(node.get())) return;
    const Layer* layer = node->layer.get();
    if (!layer_indices.count(layer)) {
      layer_indices[layer] = static_cast<int>(layer_indices.size());
      layers_seen.push_back(node->layer);
    }
    if (node->is_input()) {
      if (!input_nodes.count(node.get())) {
        throw InvalidArgumentError(str_cat(
            "Functional '", model, "': graph disconnected: cannot obtain the value of tensor '",
            KerasTensor(node, 0).to_string(), "' (", layer->class_name(), " '", layer->name(),
            "') needed by ", consumer, ": it is not one of the model's inputs"));
      }
    } else {
      // A node's inputs exist before it, so the recursion cannot meet a cycle.
      for (const KerasTensor& x : node->inputs) {
        visit(x.node(), str_cat("layer '", layer->name(), "'"));
      }
    }
    finished.insert(node.get());
    post_order.push_back(node);
  }
};

}  // namespace

Functional::Functional(const std::vector<KerasTensor>& inputs,
                       const std::vector<KerasTensor>& outputs, FunctionalOptions options)
    : Model(detail::name_or_default(options.name, "model")), inputs_(inputs), outputs_(outputs) {
  set_trainable(options.trainable);
  DTRAIN_CHECK(!inputs.empty(), "Functional '", name(), "': needs at least one input");
  DTRAIN_CHECK(!outputs.empty(), "Functional '", name(), "': needs at least one output");
  std::set<const detail::SymbolicNode*> input_nodes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const KerasTensor& x = inputs[i];
    DTRAIN_CHECK(x.defined(), "Functional '", name(), "': inputs[", i, "] is undefined");
    DTRAIN_CHECK(x.node()->is_input(), "Functional '", name(), "': inputs[", i, "] ('",
                 x.to_string(), "') is not an Input() tensor but the output of ",
                 x.layer().class_name(), " '", x.layer().name(), "'");
    DTRAIN_CHECK(input_nodes.insert(x.node().get()).second, "Functional '", name(), "': input '",
                 x.layer().name(), "' is listed twice");
  }
  GraphMap map{name(), input_nodes, {}, {}, {}, {}};
  for (size_t i = 0; i < outputs.size(); ++i) {
    DTRAIN_CHECK(outputs[i].defined(), "Functional '", name(), "': outputs[", i, "] is undefined");
    map.visit(outputs[i].node(), str_cat("outputs[", i, "]"));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTRAIN_CHECK(map.finished.count(inputs[i].node().get()), "Functional '", name(), "': inputs[",
                 i, "] ('", inputs[i].layer().name(), "') is not connected to any output");
  }
  nodes_ = map.post_order;
  // Every node's outputs get consecutive slots of one flat vector in call_list.
  std::map<const detail::SymbolicNode*, size_t> offset;
  for (const auto& node : nodes_) {
    offset[node.get()] = num_slots_;
    output_offsets_.push_back(num_slots_);
    num_slots_ += node->output_shapes.size();
  }
  auto slot_of = [&](const KerasTensor& x) {
    return offset.at(x.node().get()) + static_cast<size_t>(x.tensor_index());
  };
  for (const KerasTensor& x : inputs_) input_slots_.push_back(slot_of(x));
  for (const KerasTensor& y : outputs_) output_slots_.push_back(slot_of(y));
  for (const auto& node : nodes_) {
    arg_slots_.emplace_back();
    for (const KerasTensor& x : node->inputs) arg_slots_.back().push_back(slot_of(x));
  }
  // Depths as Keras computes them: outputs at 0, a node one deeper than its deepest consumer,
  // a layer as deep as its deepest node.
  std::map<const detail::SymbolicNode*, int> node_depth;
  std::map<const Layer*, int> layer_depth;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    const detail::SymbolicNode* node = it->get();
    int depth = node_depth[node];
    depth = std::max(depth, layer_depth[node->layer.get()]);
    layer_depth[node->layer.get()] = depth;
    node_depth[node] = depth;
    for (const KerasTensor& x : node->inputs) {
      int& d = node_depth[x.node().get()];
      d = std::max(d, depth + 1);
    }
  }
  std::vector<std::shared_ptr<Layer>> ordered = map.layers_seen;
  std::stable_sort(ordered.begin(), ordered.end(), [&](const auto& a, const auto& b) {
    const int da = layer_depth[a.get()], db = layer_depth[b.get()];
    if (da != db) return da > db;
    return map.layer_indices[a.get()] < map.layer_indices[b.get()];
  });
  for (auto& l : ordered) {
    DTRAIN_CHECK(l.get() != this, "Functional '", name(), "': the model is one of its own layers");
    track(l);
  }
  mark_built(inputs.size() == 1 ? std::optional<Shape>(inputs[0].shape()) : std::nullopt);
}

int Functional::config_node_index(const detail::SymbolicNode& node) const {
  // Keras: a Functional layer's own first node (its inputs to its outputs) comes first.
  int index = dynamic_cast<const Functional*>(node.layer.get()) != nullptr ? 1 : 0;
  bool found = false;
  std::vector<int> calls;
  for (const auto& n : nodes_) {
    if (n->layer != node.layer) continue;
    calls.push_back(n->node_index);
    if (n.get() == &node) found = true;
  }
  if (!found) return -1;
  for (int c : calls) index += c < node.node_index ? 1 : 0;
  return index;
}

// ---------------------------------------------------------------------------------------------
// Running the graph.

std::vector<Tensor> Functional::call_list(std::span<const Tensor> inputs, bool training) {
  DTRAIN_CHECK(inputs.size() == inputs_.size(), "Functional '", name(), "': expects ",
               inputs_.size(), " inputs, got ", inputs.size());
  std::vector<Tensor> values(num_slots_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    const Shape& want = inputs_[i].shape();
    DTRAIN_CHECK(x.defined() && x.rank() == want.rank() + 1 && x.shape().without_first() == want,
                 "Functional '", name(), "': input ", i, " ('", inputs_[i].layer().name(),
                 "') expects shape [batch", want.rank() ? ", " : "", want.to_string().substr(1),
                 ", got ", x.defined() ? x.shape().to_string() : std::string("undefined"));
    values[input_slots_[i]] = x;
  }
  // Keras masks (Layer::call_masked) travel beside the values, one per slot.
  std::vector<Tensor> masks(num_slots_);
  std::vector<Tensor> args, arg_masks;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const detail::SymbolicNode& node = *nodes_[i];
    if (node.is_input()) continue;
    const size_t out = output_offsets_[i];
    if (!node.list_input && arg_slots_[i].size() == 1 && node.output_shapes.size() == 1) {
      const size_t in = arg_slots_[i][0];
      values[out] = node.layer->call_masked(values[in], masks[in], training);
      masks[out] = node.layer->compute_mask(values[in], masks[in]);
      continue;
    }
    args.clear();
    arg_masks.clear();
    bool any_mask = false;
    for (size_t s : arg_slots_[i]) {
      args.push_back(values[s]);
      arg_masks.push_back(masks[s]);
      any_mask = any_mask || masks[s].defined();
    }
    std::vector<Tensor> ys = any_mask ? node.layer->call_list_masked(args, arg_masks, training)
                                      : node.layer->call_list(args, training);
    DTRAIN_CHECK(ys.size() == node.output_shapes.size(), "Functional '", name(), "': layer '",
                 node.layer->name(), "' gave ", ys.size(), " outputs, expected ",
                 node.output_shapes.size());
    std::vector<Tensor> ms = node.layer->compute_masks(args, arg_masks, ys.size());
    for (size_t k = 0; k < ys.size(); ++k) {
      values[out + k] = std::move(ys[k]);
      if (k < ms.size()) masks[out + k] = std::move(ms[k]);
    }
  }
  std::vector<Tensor> result;
  result.reserve(outputs_.size());
  for (size_t s : output_slots_) result.push_back(values[s]);
  if (output_slots_.size() == 1) detail::report_output_mask(this, masks[output_slots_[0]]);
  return result;
}

Tensor Functional::call(const Tensor& x, bool training) {
  DTRAIN_CHECK(inputs_.size() == 1 && outputs_.size() == 1, "Functional '", name(), "' has ",
               inputs_.size(), " inputs and ", outputs_.size(),
               " outputs; call it with call_list() on a list of tensors");
  return call_list(std::span<const Tensor>(&x, 1), training)[0];
}

void Functional::build_list(std::span<const Shape> input_shapes) {
  check_input_shapes(input_shapes);
}

void Functional::check_input_shapes(std::span<const Shape> input_shapes) const {
  DTRAIN_CHECK(input_shapes.size() == inputs_.size(), "Functional '", name(), "': expects ",
               inputs_.size(), " inputs, got ", input_shapes.size());
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    DTRAIN_CHECK(input_shapes[i] == inputs_[i].shape(), "Functional '", name(), "': input ", i,
                 " ('", inputs_[i].layer().name(), "') has shape ", inputs_[i].shape().to_string(),
                 ", got ", input_shapes[i].to_string());
  }
}

std::vector<Shape> Functional::compute_output_shapes(std::span<const Shape> input_shapes) const {
  check_input_shapes(input_shapes);
  std::vector<Shape> out;
  for (const KerasTensor& y : outputs_) out.push_back(y.shape());
  return out;
}

Shape Functional::compute_output_shape(const Shape& input_shape) const {
  DTRAIN_CHECK(outputs_.size() == 1, "Functional '", name(), "' has ", outputs_.size(), " outputs");
  return compute_output_shapes(std::span<const Shape>(&input_shape, 1))[0];
}

}  // namespace dtrain::nn
