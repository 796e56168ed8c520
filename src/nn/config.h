// Keras config JSON helpers shared by the nn layer's .cc files (private).
#pragma once

#include <nlohmann/json.hpp>

#include "dtrain/nn/layer.h"

namespace dtrain::nn::detail {

// {"name", "trainable", "dtype"} plus "batch_input_shape" [null, ...] when the layer declares
// an input shape, as Keras writes every layer config.
nlohmann::json base_config(const Layer& layer);

// Keras batch shape [null, d1, ...] → per-example Shape; throws InvalidArgumentError naming
// `where`.
Shape batch_shape_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace dtrain::nn::detail
