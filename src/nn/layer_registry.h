// Which Keras layer classes dtrain can rebuild from a config, and how (model_from_json, the
// Functional config, Keras files). Each layer family registers its classes from its own .cc
// (register_core_layers in layers.cc, ...); layer_registry.cc lists the families. Private to nn.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"

namespace dtrain::nn::detail {

// Builds a layer from its Keras config object; `where` names the config in errors
// ("model_from_json: layers[2]"). The name, trainable flag and dtype are handled by the caller.
using LayerFactory = std::shared_ptr<Layer> (*)(const nlohmann::json& config,
                                                const std::string& where);

class LayerRegistry {
 public:
  // Registers a Keras class name; a second registration of a name throws InternalError.
  void add(const std::string& class_name, LayerFactory factory);
  // The factory for a class name, or null.
  LayerFactory find(const std::string& class_name) const;
  // Every registered class name, sorted.
  std::vector<std::string> class_names() const;

 private:
  std::map<std::string, LayerFactory> factories_;
};

// The registry with every family registered (built once, thread-safe).
const LayerRegistry& layer_registry();

// One per family, each defined next to its layers.
void register_core_layers(LayerRegistry& registry);           // layers.cc
void register_convolutional_layers(LayerRegistry& registry);  // convolutional.cc
void register_pooling_layers(LayerRegistry& registry);        // pooling.cc
void register_activation_layers(LayerRegistry& registry);     // activations.cc
void register_normalization_layers(LayerRegistry& registry);  // normalization.cc
void register_reshaping_layers(LayerRegistry& registry);      // reshaping.cc
void register_merging_layers(LayerRegistry& registry);        // merging.cc
void register_embedding_layers(LayerRegistry& registry);      // embedding.cc
void register_attention_layers(LayerRegistry& registry);      // attention.cc
void register_recurrent_layers(LayerRegistry& registry);      // recurrent.cc
// "Functional" and "Model" (nested models), in functional_config.cc.
void register_functional_layers(LayerRegistry& registry);
// TransformerBlock and GPT, in transformer.cc.
void register_transformer_layers(LayerRegistry& registry);

// Rebuilds one layer from {"class_name": ..., "config": {...}} in either Keras dialect: checks
// the dtype is float32, looks the class up, applies "trainable". Throws InvalidArgumentError
// naming `where` and the class for an unknown class or a bad field.
std::shared_ptr<Layer> layer_from_json(const nlohmann::json& layer_json, const std::string& where);

}  // namespace dtrain::nn::detail
