// Keras 3 model configs: a layer's config in the Keras 3 dialect, and the config of a Functional
// model, as keras/src/models/functional.py get_config and
// keras/src/saving/serialization_lib.py serialize it (Keras 3.10):
//  - the model: {"module": "keras.src.models.functional", "class_name": "Functional", "config",
//    "registered_name": "Functional", "build_config": {"input_shape": null}} (Functional is not a
//    public Keras class, so its module is its Python module and it is registered by name); the
//    legacy .h5 model_config has only {"class_name", "config"};
//  - its config: {"name", "trainable", "layers", "input_layers", "output_layers"}; a model with
//    one input (output) lists it as [name, node, tensor], as Keras serializes the single tensor
//    of keras.Model(inputs=x, outputs=y); several as a list of those;
//  - each layer: serialize_keras_object's {"module", "class_name", "config", "registered_name",
//    "build_config" (unless the class is built in its constructor)} then "name" and
//    "inbound_nodes": [{"args": [tensor or [tensors]], "kwargs": {}}], a tensor being
//    {"class_name": "__keras_tensor__", "config": {"shape", "dtype", "keras_history"}}.
// The variables go where saving_lib walks Functional.layers, the InputLayers included
// (saving_keras3.cc's walk_layers). docs/keras-files.md.
#include <regex>
#include <set>

#include "dtrain/nn/functional.h"
#include "dtrain/nn/normalization.h"
#include "saving_internal.h"

namespace dtrain::train::detail {

using nlohmann::ordered_json;

// keras.src.utils.naming.to_snake_case: "MaxPooling2D" -> "max_pooling2d".
std::string snake_case(const std::string& name) {
  static const std::regex non_word(R"(\W+)"), cap_word("(.)([A-Z][a-z]+)"),
      lower_upper("([a-z])([A-Z])");
  std::string s = std::regex_replace(name, non_word, "");
  s = std::regex_replace(s, cap_word, "$1_$2");
  s = std::regex_replace(s, lower_upper, "$1_$2");
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

ordered_json batch_shape(const Shape& s) {
  ordered_json j = ordered_json::array({nullptr});
  for (int64_t d : s) j.push_back(d);
  return j;
}

ordered_json dtype_policy(const std::string& name) {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", name}}},
          {"registered_name", nullptr}};
}

// {"class_name", "config"} → Keras 3's {"module", "class_name", "config", "registered_name"}.
ordered_json keras3_object(const ordered_json& j, const char* module) {
  if (!j.is_object() || !j.contains("class_name")) return j;
  ordered_json out;
  out["module"] = module;
  out["class_name"] = j["class_name"];
  out["config"] = j.value("config", ordered_json::object());
  out["registered_name"] = nullptr;
  return out;
}

// Classes whose Keras 3 constructor sets built = True, so that Keras writes no build_config.
bool built_at_construction(const std::string& cls) {
  static const std::set<std::string> kBuilt = {"InputLayer",
                                               "Dropout",
                                               "SpatialDropout1D",
                                               "SpatialDropout2D",
                                               "Activation",
                                               "ReLU",
                                               "LeakyReLU",
                                               "Softmax",
                                               "ELU",
                                               "MaxPooling1D",
                                               "MaxPooling2D",
                                               "AveragePooling1D",
                                               "AveragePooling2D",
                                               "Rescaling",
                                               "GlobalAveragePooling1D",
                                               "GlobalAveragePooling2D",
                                               "GlobalMaxPooling1D",
                                               "GlobalMaxPooling2D"};
  return kBuilt.count(cls) != 0;
}

// A layer's config_json() (Keras 2 dialect) in the Keras 3 dialect.
ordered_json keras3_layer_config(const nn::Layer& layer) {
  ordered_json k2 = ordered_json::parse(layer.config_json());
  const std::string cls = layer.class_name();
  if (cls == "InputLayer") {
    ordered_json c;
    c["batch_shape"] = k2.contains("batch_input_shape") ? k2["batch_input_shape"] : ordered_json();
    c["dtype"] = k2.value("dtype", "float32");
    c["sparse"] = k2.value("sparse", false);
    c["ragged"] = k2.value("ragged", false);
    c["name"] = layer.name();
    return c;
  }
  ordered_json c;
  for (auto it = k2.begin(); it != k2.end(); ++it) {
    const std::string& key = it.key();
    if (key == "batch_input_shape") continue;  // Keras 3 declares inputs with an InputLayer
    if (key == "dtype" && it.value().is_string()) {
      c[key] = dtype_policy(it.value().get<std::string>());
    } else if (key.size() > 12 && key.compare(key.size() - 12, 12, "_initializer") == 0) {
      c[key] = keras3_object(it.value(), "keras.initializers");
    } else if (key.size() > 12 && key.compare(key.size() - 12, 12, "_regularizer") == 0) {
      // Keras 3's Dense does not list a None activity_regularizer.
      if (key == "activity_regularizer" && it.value().is_null() && cls == "Dense") continue;
      c[key] = keras3_object(it.value(), "keras.regularizers");
    } else if (key.size() > 11 && key.compare(key.size() - 11, 11, "_constraint") == 0) {
      c[key] = keras3_object(it.value(), "keras.constraints");
    } else {
      c[key] = it.value();
    }
  }
  if (const auto* bn = dynamic_cast<const nn::BatchNormalization*>(&layer); bn != nullptr) {
    // Keras 3 keeps the axis as given (an int) and always writes synchronized, last.
    c["axis"] = bn->options().axis;
    c["synchronized"] = bn->options().synchronized;
  }
  return c;
}

std::string keras3_class_name(const nn::Layer& layer) {
  // Keras 3 has no SyncBatchNormalization: it is BatchNormalization(synchronized=True).
  const std::string cls = layer.class_name();
  return cls == "SyncBatchNormalization" ? "BatchNormalization" : cls;
}

namespace {

ordered_json coordinates(const nn::Functional& model, const nn::KerasTensor& x) {
  return ordered_json::array(
      {x.layer().name(), model.config_node_index(*x.node()), x.tensor_index()});
}

ordered_json keras_tensor(const nn::Functional& model, const nn::KerasTensor& x) {
  ordered_json config;
  config["shape"] = batch_shape(x.shape());
  config["dtype"] = "float32";
  config["keras_history"] = coordinates(model, x);
  ordered_json j;
  j["class_name"] = "__keras_tensor__";
  j["config"] = std::move(config);
  return j;
}

ordered_json endpoints(const nn::Functional& model, const std::vector<nn::KerasTensor>& xs) {
  if (xs.size() == 1) return coordinates(model, xs[0]);
  ordered_json out = ordered_json::array();
  for (const nn::KerasTensor& x : xs) out.push_back(coordinates(model, x));
  return out;
}

ordered_json functional_config(const nn::Functional& model, bool archive);

// The serialized model object around `config`.
ordered_json functional_object(ordered_json config, bool archive) {
  ordered_json j;
  if (archive) j["module"] = "keras.src.models.functional";
  j["class_name"] = "Functional";
  j["config"] = std::move(config);
  if (archive) {
    j["registered_name"] = "Functional";
    j["build_config"] = {{"input_shape", nullptr}};
  }
  return j;
}

ordered_json functional_config(const nn::Functional& model, bool archive) {
  ordered_json layers = ordered_json::array();
  for (const auto& layer : model.layers()) {
    // This model's calls of the layer, in the order it made them.
    std::vector<const nn::detail::SymbolicNode*> calls;
    for (const auto& node : model.nodes()) {
      if (node->layer == layer && !node->is_input()) calls.push_back(node.get());
    }
    ordered_json inbound = ordered_json::array();
    for (const nn::detail::SymbolicNode* node : calls) {
      ordered_json args = ordered_json::array();
      for (const nn::KerasTensor& x : node->inputs) args.push_back(keras_tensor(model, x));
      if (node->list_input) args = ordered_json::array({args});
      inbound.push_back({{"args", std::move(args)}, {"kwargs", ordered_json::object()}});
    }
    const auto* sub = dynamic_cast<const nn::Functional*>(layer.get());
    const std::string cls = keras3_class_name(*layer);
    ordered_json e;
    if (sub != nullptr) {
      e = functional_object(functional_config(*sub, archive), archive);
    } else {
      if (archive) e["module"] = "keras.layers";
      e["class_name"] = cls;
      e["config"] = keras3_layer_config(*layer);
      if (archive) {
        e["registered_name"] = nullptr;
        // The shapes of the first call (Layer._build_shapes_dict): a list for a list input.
        if (!built_at_construction(cls) && !calls.empty()) {
          ordered_json shapes = ordered_json::array();
          for (const nn::KerasTensor& x : calls.front()->inputs) {
            shapes.push_back(batch_shape(x.shape()));
          }
          e["build_config"] = {
              {"input_shape", calls.front()->list_input ? shapes : shapes.front()}};
        }
      }
    }
    e["name"] = layer->name();
    e["inbound_nodes"] = std::move(inbound);
    layers.push_back(std::move(e));
  }
  ordered_json config;
  config["name"] = model.name();
  config["trainable"] = model.trainable();
  config["layers"] = std::move(layers);
  config["input_layers"] = endpoints(model, model.inputs());
  config["output_layers"] = endpoints(model, model.outputs());
  return config;
}

}  // namespace

ordered_json keras3_functional_config(const nn::Functional& model, bool archive) {
  return functional_object(functional_config(model, archive), archive);
}

}  // namespace dtrain::train::detail
