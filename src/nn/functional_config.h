// Functional's Keras model config, written and read in both dialects (functional_config.cc).
// Private to nn.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/nn/functional.h"

namespace dtrain::nn::detail {

// {"class_name": "Functional", "config": ..., "keras_version", "backend"} (Keras 2).
std::string functional_to_json(const Functional& model);
// {"module": "keras", "class_name": "Functional", "config": ..., "registered_name", ...}.
std::string functional_to_json_keras3(const Functional& model);
// The "config" object alone (Keras 2), as a nested Functional layer's config.
std::string functional_config_json(const Functional& model);

// Rebuilds a Functional model from the "config" object of class Functional (or Model) in
// either dialect. Throws InvalidArgumentError naming `where` and the JSON path of the problem.
std::unique_ptr<Functional> functional_from_config(const nlohmann::json& config,
                                                   const std::string& where);

}  // namespace dtrain::nn::detail
