// Functional's model config in both Keras dialects (private declarations in
// functional_config.h). The formats, from the Keras sources:
//  - Keras 2 (tf_keras/engine/functional.py get_network_config, engine/node.py serialize): each
//    layer entry is {"class_name", "config", "name", "inbound_nodes"}; a node is the list of its
//    inputs [[layer_name, node_index, tensor_index, kwargs], ...]; "input_layers" and
//    "output_layers" list [layer_name, node_index, tensor_index]. Node indices count only the
//    nodes that belong to the model; a Functional layer's own first node comes first.
//  - Keras 3 (keras/src/models/functional.py get_config, keras/src/ops/node.py): a node is
//    {"args": [...], "kwargs": {...}} whose tensors are {"class_name": "__keras_tensor__",
//    "config": {"shape", "dtype", "keras_history": [layer_name, node_index, tensor_index]}};
//    a merge layer's inputs are one list argument (args: [[kt1, kt2]]); entries carry "module"
//    and "registered_name".
#include "functional_config.h"

#include <map>

#include "config.h"
#include "dtrain/nn/functional.h"
#include "layer_registry.h"

namespace dtrain::nn::detail {

using nlohmann::json;
using nlohmann::ordered_json;

KerasTensor input_tensor_of(std::shared_ptr<Layer> input_layer);  // functional.cc

namespace {

ordered_json coordinates(const Functional& model, const KerasTensor& x) {
  return ordered_json::array(
      {x.layer().name(), model.config_node_index(*x.node()), x.tensor_index()});
}

// Keras 3's dtype policy object.
ordered_json dtype_policy() {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", "float32"}}},
          {"registered_name", nullptr}};
}

// A Keras 2 layer config in the Keras 3 dialect: batch_input_shape → batch_shape (InputLayer
// only), dtype → DTypePolicy, initializers with module/registered_name, Keras 2-only keys
// dropped.
ordered_json keras3_layer_config(const Layer& layer, json c) {
  ordered_json out;
  const bool input = layer.class_name() == "InputLayer";
  for (auto& [key, value] : c.items()) {
    if (key == "ragged" || key == "batch_input_shape") continue;
    if (key == "dtype") {
      out["dtype"] = input ? ordered_json("float32") : dtype_policy();
    } else if (value.is_object() && value.contains("class_name") && value.contains("config") &&
               key.find("initializer") != std::string::npos) {
      out[key] = {{"module", "keras.initializers"},
                  {"class_name", value["class_name"]},
                  {"config", ordered_json::parse(value["config"].dump())},
                  {"registered_name", nullptr}};
    } else {
      out[key] = ordered_json::parse(value.dump());
    }
  }
  if (input)
    out["batch_shape"] = ordered_json::parse(batch_shape_json(*layer.input_shape()).dump());
  return out;
}

ordered_json keras_tensor_json(const Functional& model, const KerasTensor& x) {
  ordered_json shape = ordered_json::array({nullptr});
  for (int64_t d : x.shape()) shape.push_back(d);
  return {{"class_name", "__keras_tensor__"},
          {"config",
           {{"shape", shape}, {"dtype", "float32"}, {"keras_history", coordinates(model, x)}}}};
}

ordered_json functional_config(const Functional& model, bool keras3) {
  ordered_json config;
  config["name"] = model.name();
  config["trainable"] = model.trainable();
  ordered_json layers = ordered_json::array();
  for (const auto& layer : model.layers()) {
    ordered_json nodes = ordered_json::array();
    for (const auto& node : model.nodes()) {
      if (node->layer != layer || node->is_input()) continue;
      if (keras3) {
        ordered_json args = ordered_json::array();
        for (const KerasTensor& x : node->inputs) args.push_back(keras_tensor_json(model, x));
        if (node->list_input) args = ordered_json::array({args});
        nodes.push_back({{"args", args}, {"kwargs", ordered_json::object()}});
      } else {
        ordered_json entries = ordered_json::array();
        for (const KerasTensor& x : node->inputs) {
          ordered_json e = coordinates(model, x);
          e.push_back(ordered_json::object());
          entries.push_back(e);
        }
        nodes.push_back(entries);
      }
    }
    ordered_json entry;
    auto* sub = dynamic_cast<const Functional*>(layer.get());
    const json c = json::parse(layer->config_json());
    if (keras3) {
      entry["module"] = sub != nullptr ? "keras" : "keras.layers";
      entry["class_name"] = layer->class_name();
      entry["config"] =
          sub != nullptr ? functional_config(*sub, true) : keras3_layer_config(*layer, c);
      entry["registered_name"] = sub != nullptr ? json("Functional") : json(nullptr);
      if (layer->class_name() != "InputLayer") {
        ordered_json shapes = ordered_json::array();
        for (const auto& n : model.nodes()) {
          if (n->layer != layer) continue;
          for (const KerasTensor& x : n->inputs) {
            ordered_json s = ordered_json::array({nullptr});
            for (int64_t d : x.shape()) s.push_back(d);
            shapes.push_back(s);
          }
          break;
        }
        entry["build_config"] = {{"input_shape", shapes.size() == 1 ? shapes[0] : shapes}};
      }
    } else {
      entry["class_name"] = layer->class_name();
      entry["config"] =
          sub != nullptr ? functional_config(*sub, false) : ordered_json::parse(c.dump());
    }
    entry["name"] = layer->name();
    entry["inbound_nodes"] = nodes;
    layers.push_back(entry);
  }
  config["layers"] = layers;
  ordered_json ins = ordered_json::array(), outs = ordered_json::array();
  for (const KerasTensor& x : model.inputs()) ins.push_back(coordinates(model, x));
  for (const KerasTensor& y : model.outputs()) outs.push_back(coordinates(model, y));
  config["input_layers"] = ins;
  config["output_layers"] = outs;
  return config;
}

// --- Reading ---------------------------------------------------------------------------------

// [layer_name, node_index, tensor_index(, kwargs)] of `j` at `where`.
struct Coordinates {
  std::string layer;
  int node = 0;
  int tensor = 0;
};

Coordinates parse_coordinates(const json& j, const std::string& where) {
  DTRAIN_CHECK(j.is_array() && j.size() >= 3 && j[0].is_string() && j[1].is_number_integer() &&
                   j[2].is_number_integer(),
               where, ": expected [layer_name, node_index, tensor_index], got ", j.dump());
  return {j[0].get<std::string>(), j[1].get<int>(), j[2].get<int>()};
}

// A tuple wrapped as {"class_name": "__tuple__", "items": [...]} (tf_keras's json_utils
// encoder, SavedModel metadata) or {"class_name": "__tuple__", "config": {"value": [...]}}.
const json& unwrap_tuple(const json& j) {
  if (j.is_object() && j.value("class_name", json()) == "__tuple__") {
    if (j.contains("items")) return j["items"];
    if (j.contains("config") && j["config"].contains("value")) return j["config"]["value"];
  }
  return j;
}

bool is_keras_tensor(const json& j) {
  return j.is_object() && j.value("class_name", json()) == "__keras_tensor__";
}

// One inbound node: the coordinates of its inputs and whether they came as a list.
struct NodeSpec {
  std::vector<Coordinates> inputs;
  bool list_input = false;
};

NodeSpec parse_node(const json& node, const std::string& where) {
  NodeSpec spec;
  if (node.is_object()) {  // Keras 3
    DTRAIN_CHECK(node.contains("args"), where, ": expected {\"args\": [...], \"kwargs\": {...}}");
    const json& args = unwrap_tuple(node["args"]);
    DTRAIN_CHECK(args.is_array() && !args.empty(), where, ".args: expected a non-empty list");
    DTRAIN_CHECK(args.size() == 1, where, ".args: ", args.size(),
                 " positional arguments; dtrain layers take one (a tensor or a list)");
    const json& first = unwrap_tuple(args[0]);
    auto tensor = [&](const json& kt, const std::string& at) {
      DTRAIN_CHECK(
          is_keras_tensor(kt) && kt.contains("config") && kt["config"].contains("keras_history"),
          at, ": expected a __keras_tensor__ with a keras_history, got ", kt.dump());
      return parse_coordinates(kt["config"]["keras_history"], at + ".config.keras_history");
    };
    if (first.is_array()) {
      spec.list_input = true;
      for (size_t i = 0; i < first.size(); ++i) {
        spec.inputs.push_back(tensor(first[i], str_cat(where, ".args[0][", i, "]")));
      }
    } else {
      spec.inputs.push_back(tensor(first, where + ".args[0]"));
    }
    return spec;
  }
  DTRAIN_CHECK(node.is_array() && !node.empty(), where,
               ": expected a list of [layer_name, node_index, tensor_index, kwargs]");
  for (size_t i = 0; i < node.size(); ++i) {
    spec.inputs.push_back(parse_coordinates(node[i], str_cat(where, "[", i, "]")));
  }
  spec.list_input = node.size() > 1;
  return spec;
}

// The list of coordinates in input_layers / output_layers (a single [name, 0, 0] or a list).
std::vector<Coordinates> parse_endpoints(const json& config, const char* key,
                                         const std::string& where) {
  const std::string at = str_cat(where, ".", key);
  DTRAIN_CHECK(config.contains(key), where, ": missing \"", key, "\"");
  const json& j = unwrap_tuple(config[key]);
  DTRAIN_CHECK(j.is_array() && !j.empty(), at, ": expected a list of [layer_name, node, tensor]");
  std::vector<Coordinates> out;
  if (j[0].is_string()) {
    out.push_back(parse_coordinates(j, at));
  } else {
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(parse_coordinates(unwrap_tuple(j[i]), str_cat(at, "[", i, "]")));
    }
  }
  return out;
}

}  // namespace

std::string functional_to_json(const Functional& model) {
  ordered_json j;
  j["class_name"] = "Functional";
  j["config"] = functional_config(model, false);
  j["keras_version"] = "2.12.0";
  j["backend"] = "tensorflow";
  return j.dump();
}

std::string functional_to_json_keras3(const Functional& model) {
  ordered_json j;
  j["module"] = "keras";
  j["class_name"] = "Functional";
  j["config"] = functional_config(model, true);
  j["registered_name"] = "Functional";
  j["build_config"] = {{"input_shape", nullptr}};
  return j.dump();
}

std::string functional_config_json(const Functional& model) {
  return functional_config(model, false).dump();
}

std::unique_ptr<Functional> functional_from_config(const json& config, const std::string& where) {
  DTRAIN_CHECK(config.is_object(), where, ".config: expected an object");
  DTRAIN_CHECK(config.contains("layers") && config["layers"].is_array(), where,
               ".config.layers: expected a list of layers");
  const json& layers = config["layers"];
  struct Pending {
    std::shared_ptr<Layer> layer;
    std::string where;
    std::vector<NodeSpec> nodes;
    size_t next = 0;  // nodes made so far
  };
  std::vector<Pending> pending;
  // Layer name → outputs of each of its nodes, by config node index.
  std::map<std::string, std::vector<std::vector<KerasTensor>>> made;
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string at = str_cat(where, ".config.layers[", i, "]");
    const json& lj = layers[i];
    auto layer = layer_from_json(lj, at);
    const std::string name = lj.contains("name") && lj["name"].is_string()
                                 ? lj["name"].get<std::string>()
                                 : layer->name();
    DTRAIN_CHECK(layer->name() == name, at, ": the entry's name '", name,
                 "' differs from its config's '", layer->name(), "'");
    DTRAIN_CHECK(!made.count(name), at, ": two layers are named '", name, "'");
    auto& outputs = made[name];
    Pending p{layer, at, {}, 0};
    if (layer->class_name() == "InputLayer") {
      outputs.push_back({input_tensor_of(layer)});
    } else {
      // A Functional layer's node 0 is its own (inputs to outputs), not listed.
      if (dynamic_cast<Functional*>(layer.get()) != nullptr) outputs.emplace_back();
      const json nodes = lj.value("inbound_nodes", json::array());
      DTRAIN_CHECK(nodes.is_array(), at, ".inbound_nodes: expected a list");
      for (size_t k = 0; k < nodes.size(); ++k) {
        p.nodes.push_back(parse_node(nodes[k], str_cat(at, ".inbound_nodes[", k, "]")));
      }
    }
    pending.push_back(std::move(p));
  }
  auto lookup = [&](const Coordinates& c) -> const KerasTensor* {
    auto it = made.find(c.layer);
    if (it == made.end() || c.node < 0 || static_cast<size_t>(c.node) >= it->second.size()) {
      return nullptr;
    }
    const auto& outs = it->second[static_cast<size_t>(c.node)];
    if (c.tensor < 0 || static_cast<size_t>(c.tensor) >= outs.size()) return nullptr;
    return &outs[static_cast<size_t>(c.tensor)];
  };
  // As Keras does: make each layer's nodes in order, as soon as their inputs exist; repeat until
  // nothing is left or nothing can be made.
  for (bool progress = true; progress;) {
    progress = false;
    for (Pending& p : pending) {
      while (p.next < p.nodes.size()) {
        const NodeSpec& spec = p.nodes[p.next];
        std::vector<KerasTensor> inputs;
        for (const Coordinates& c : spec.inputs) {
          const KerasTensor* x = lookup(c);
          if (x == nullptr) break;
          inputs.push_back(*x);
        }
        if (inputs.size() < spec.inputs.size()) break;
        try {
          made[p.layer->name()].push_back(p.layer->symbolic_call(inputs, spec.list_input));
        } catch (const InvalidArgumentError& e) {
          throw InvalidArgumentError(str_cat(p.where, ".inbound_nodes[", p.next, "]: ", e.what()));
        }
        ++p.next;
        progress = true;
      }
    }
  }
  for (const Pending& p : pending) {
    if (p.next == p.nodes.size()) continue;
    for (const Coordinates& c : p.nodes[p.next].inputs) {
      if (lookup(c) == nullptr) {
        throw InvalidArgumentError(str_cat(p.where, ".inbound_nodes[", p.next, "]: the input [\"",
                                           c.layer, "\", ", c.node, ", ", c.tensor,
                                           "] is not produced by any layer"));
      }
    }
  }
  auto endpoints = [&](const char* key) {
    std::vector<KerasTensor> out;
    const std::vector<Coordinates> cs = parse_endpoints(config, key, where + ".config");
    for (size_t i = 0; i < cs.size(); ++i) {
      const KerasTensor* x = lookup(cs[i]);
      DTRAIN_CHECK(x != nullptr, where, ".config.", key, "[", i, "]: [\"", cs[i].layer, "\", ",
                   cs[i].node, ", ", cs[i].tensor, "] is not produced by any layer");
      out.push_back(*x);
    }
    return out;
  };
  const std::vector<KerasTensor> inputs = endpoints("input_layers");
  const std::vector<KerasTensor> outputs = endpoints("output_layers");
  try {
    return std::make_unique<Functional>(
        inputs, outputs,
        FunctionalOptions{.name = str_field(config, "name", where + ".config"),
                          .trainable = bool_field(config, "trainable", where + ".config", true)});
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(str_cat(where, ": ", e.what()));
  }
}

namespace {
std::shared_ptr<Layer> functional_layer_from_config(const json& c, const std::string& where) {
  return std::shared_ptr<Functional>(functional_from_config(c, where));
}
}  // namespace

void register_functional_layers(LayerRegistry& registry) {
  registry.add("Functional", functional_layer_from_config);
  registry.add("Model", functional_layer_from_config);
}

}  // namespace dtrain::nn::detail

namespace dtrain::nn {

std::string Functional::to_json() const { return detail::functional_to_json(*this); }
std::string Functional::to_json_keras3() const { return detail::functional_to_json_keras3(*this); }
std::string Functional::config_json() const { return detail::functional_config_json(*this); }

}  // namespace dtrain::nn
