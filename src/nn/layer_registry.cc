// The layer registry and layer_from_json.
#include "layer_registry.h"

#include "config.h"
#include "dtrain/core/error.h"

namespace dtrain::nn::detail {

using nlohmann::json;

void LayerRegistry::add(const std::string& class_name, LayerFactory factory) {
  const bool inserted = factories_.emplace(class_name, factory).second;
  if (!inserted) throw InternalError(str_cat("layer class '", class_name, "' registered twice"));
}

LayerFactory LayerRegistry::find(const std::string& class_name) const {
  auto it = factories_.find(class_name);
  return it == factories_.end() ? nullptr : it->second;
}

std::vector<std::string> LayerRegistry::class_names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : factories_) out.push_back(name);
  return out;
}

const LayerRegistry& layer_registry() {
  static const LayerRegistry registry = [] {
    LayerRegistry r;
    register_core_layers(r);
    register_convolutional_layers(r);
    register_pooling_layers(r);
    register_activation_layers(r);
    register_normalization_layers(r);
    register_reshaping_layers(r);
    register_merging_layers(r);
    register_functional_layers(r);
    register_embedding_layers(r);
    register_attention_layers(r);
    register_recurrent_layers(r);
    register_transformer_layers(r);
    return r;
  }();
  return registry;
}

namespace {

// Keras 2: "dtype": "float32"; Keras 3: a DTypePolicy object {"config": {"name": "float32"}}.
std::string dtype_name(const json& c, const std::string& where) {
  if (!c.contains("dtype") || c["dtype"].is_null()) return "float32";
  const json& d = c["dtype"];
  if (d.is_string()) return d.get<std::string>();
  if (d.is_object() && d.contains("config") && d["config"].is_object() &&
      d["config"].contains("name") && d["config"]["name"].is_string()) {
    return d["config"]["name"].get<std::string>();
  }
  throw InvalidArgumentError(
      str_cat(where, ".dtype: expected a dtype name or a DTypePolicy, got ", d.dump()));
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::shared_ptr<Layer> layer_from_json(const json& lj, const std::string& where) {
  DTRAIN_CHECK(lj.is_object() && lj.contains("class_name") && lj["class_name"].is_string(), where,
               ": expected {\"class_name\": ..., \"config\": ...}");
  const std::string cls = lj["class_name"].get<std::string>();
  const json c = lj.value("config", json::object());
  DTRAIN_CHECK(c.is_object(), where, ".config: expected an object");
  const std::string dtype = dtype_name(c, where + ".config");
  DTRAIN_CHECK(dtype == "float32", where, " (", cls, "): dtype '", dtype,
               "' is not supported (dtrain computes in float32)");
  const LayerFactory factory = layer_registry().find(cls);
  if (factory == nullptr) {
    throw InvalidArgumentError(str_cat(where, ": unknown layer class '", cls, "' (supported: ",
                                       joined(layer_registry().class_names()), ")"));
  }
  std::shared_ptr<Layer> layer;
  try {
    layer = factory(c, str_cat(where, " (", cls, ")"));
  } catch (const json::exception& e) {
    // A field of the wrong JSON type ("units": "x", "kernel_initializer": {"class_name": {}}).
    throw InvalidArgumentError(str_cat(where, " (", cls, "): malformed config: ", e.what()));
  } catch (const InvalidArgumentError& e) {
    // An error from a part that does not know the layer (an initializer's config) gets its name.
    const std::string message = e.what();
    if (message.find(where) != std::string::npos) throw;
    throw InvalidArgumentError(str_cat(where, " (", cls, "): ", message));
  }
  if (c.contains("trainable") && c["trainable"].is_boolean()) {
    layer->set_trainable(c["trainable"].get<bool>());
  }
  return layer;
}

}  // namespace dtrain::nn::detail
