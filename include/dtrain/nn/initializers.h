// Keras weight initializers (keras.initializers), seeded through Philox. An initializer with no
// seed draws one from dtrain::next_seed() when it is created, so a program that calls
// dtrain::set_random_seed() is reproducible. Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::nn {

class Initializer {
 public:
  virtual ~Initializer() = default;
  // A new float32 tensor of `shape`. For kernels [fan_in, fan_out], as Keras computes fans.
  virtual Tensor operator()(const Shape& shape) = 0;
  // Keras's class name, e.g. "GlorotUniform".
  virtual std::string class_name() const = 0;
  // Keras's config as a JSON object string, e.g. {"seed": null}.
  virtual std::string config_json() const = 0;
};

// Keras identifiers: "glorot_uniform", "glorot_normal", "he_normal", "he_uniform",
// "lecun_normal", "lecun_uniform", "zeros", "ones", "random_normal", "random_uniform",
// "truncated_normal", and the Keras class names ("GlorotUniform", ...). Throws
// InvalidArgumentError naming the unknown identifier.
std::shared_ptr<Initializer> initializer_from_name(const std::string& name,
                                                   std::optional<uint64_t> seed = std::nullopt);
// From Keras's {"class_name": ..., "config": {...}} JSON.
std::shared_ptr<Initializer> initializer_from_json(const std::string& json);
// A constant initializer (keras.initializers.Constant).
std::shared_ptr<Initializer> constant_initializer(float value);

}  // namespace dtrain::nn
