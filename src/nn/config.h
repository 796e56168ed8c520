// Keras config JSON helpers shared by the nn layer's .cc files (private). Layer configs are
// read in both dialects Keras writes: Keras 2 ("batch_input_shape", "dtype": "float32") and
// Keras 3 ("batch_shape", "dtype": {"class_name": "DTypePolicy", ...}, "module",
// "registered_name"). dtrain writes the Keras 2 dialect from config_json(); the Keras 3 writer
// translates.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/initializers.h"
#include "dtrain/nn/layer.h"

namespace dtrain::nn::detail {

// {"name", "trainable", "dtype"} plus "batch_input_shape" [null, ...] when the layer declares
// an input shape, as Keras writes every layer config.
nlohmann::json base_config(const Layer& layer);
// Adds "batch_input_shape" when the layer declares an input shape.
void add_batch_input_shape(const Layer& layer, nlohmann::json& c);
// [null, d1, d2, ...]
nlohmann::json batch_shape_json(const Shape& s);
// `name` or Keras's unique default from `base` ("dense", "dense_1", ...).
std::string name_or_default(const std::string& name, const char* base);

// Keras batch shape [null, d1, ...] → per-example Shape; throws InvalidArgumentError naming
// `where`.
Shape batch_shape_from_json(const nlohmann::json& j, const std::string& where);
// The per-example input shape a layer config declares: "batch_input_shape" (Keras 2) or
// "batch_shape" (Keras 3), or none.
std::optional<Shape> declared_input_shape(const nlohmann::json& c, const std::string& where);

// c[key] as a string, `fallback` when absent or null; InvalidArgumentError naming
// where.key otherwise.
std::string str_field(const nlohmann::json& c, const char* key, const std::string& where,
                      const std::string& fallback = {});
// c[key] as an integer (required unless `fallback` is given).
int64_t int_field(const nlohmann::json& c, const char* key, const std::string& where,
                  std::optional<int64_t> fallback = std::nullopt);
// c[key] as a number (required unless `fallback` is given).
double number_field(const nlohmann::json& c, const char* key, const std::string& where,
                    std::optional<double> fallback = std::nullopt);
bool bool_field(const nlohmann::json& c, const char* key, const std::string& where, bool fallback);
// Keras's int-or-tuple arguments (kernel_size=3 or (3, 3)) as exactly `n` integers.
std::vector<int64_t> int_tuple_field(const nlohmann::json& c, const char* key, size_t n,
                                     const std::string& where,
                                     std::optional<std::vector<int64_t>> fallback = std::nullopt);
// An initializer in a config (identifier or {"class_name", "config"}) as the JSON text the
// layer options take; `fallback` (an identifier) when absent or null.
std::string initializer_json(const nlohmann::json& c, const char* key, const char* fallback);
// A Keras identifier ("glorot_uniform") or a Keras initializer config as JSON
// ({"class_name": "GlorotUniform", "config": {"seed": 3}}), as model JSON carries it.
std::shared_ptr<Initializer> make_initializer(const std::string& spec,
                                              std::optional<uint64_t> seed);
// Keras's per-axis arguments: one value for every axis, or exactly `rank` values;
// InvalidArgumentError naming `where` and `what` otherwise.
std::vector<int64_t> per_axis(const std::vector<int64_t>& v, int rank, const char* what,
                              const std::string& where);
// "channels_last" (or empty) → false, "channels_first" → true; InvalidArgumentError otherwise.
bool parse_channels_first(const std::string& data_format, const std::string& where);
// [d1, d2, ...] as a JSON list.
nlohmann::json int_list(const std::vector<int64_t>& v);
// "(None, 28, 28, 1)" for a per-example shape, as Keras prints batch shapes.
std::string batch_shape_string(const Shape& s);
// {"class_name": ..., "config": ...} of an initializer, as Keras writes it.
nlohmann::json initializer_config(const Initializer& init);

}  // namespace dtrain::nn::detail
