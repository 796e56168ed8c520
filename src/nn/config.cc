// Keras config JSON helpers (config.h).
#include "config.h"

#include "dtrain/core/error.h"

namespace dtrain::nn::detail {

using nlohmann::json;

json base_config(const Layer& layer) {
  json c;
  c["name"] = layer.name();
  c["trainable"] = layer.trainable();
  c["dtype"] = "float32";
  return c;
}

json batch_shape_json(const Shape& s) {
  json j = json::array({nullptr});
  for (int64_t d : s) j.push_back(d);
  return j;
}

void add_batch_input_shape(const Layer& layer, json& c) {
  if (layer.input_shape()) c["batch_input_shape"] = batch_shape_json(*layer.input_shape());
}

std::string name_or_default(const std::string& name, const char* base) {
  return name.empty() ? unique_layer_name(base) : name;
}

Shape batch_shape_from_json(const json& j, const std::string& where) {
  DTRAIN_CHECK(j.is_array() && !j.empty(), where, ": expected a batch shape like [null, 784], got ",
               j.dump());
  Shape s;
  for (size_t i = 1; i < j.size(); ++i) {
    DTRAIN_CHECK(j[i].is_number_integer() && j[i].get<int64_t>() >= 0, where, ": dimension ", i,
                 " must be a non-negative integer, got ", j[i].dump());
    s.push_back(j[i].get<int64_t>());
  }
  return s;
}

std::optional<Shape> declared_input_shape(const json& c, const std::string& where) {
  for (const char* key : {"batch_input_shape", "batch_shape"}) {
    if (c.contains(key) && !c[key].is_null()) {
      return batch_shape_from_json(c[key], str_cat(where, ".", key));
    }
  }
  return std::nullopt;
}

std::string str_field(const json& c, const char* key, const std::string& where,
                      const std::string& fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  DTRAIN_CHECK(c[key].is_string(), where, ".", key, ": expected a string, got ", c[key].dump());
  return c[key].get<std::string>();
}

int64_t int_field(const json& c, const char* key, const std::string& where,
                  std::optional<int64_t> fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    DTRAIN_CHECK(fallback.has_value(), where, ".", key, ": missing (expected an integer)");
    return *fallback;
  }
  DTRAIN_CHECK(c[key].is_number_integer(), where, ".", key, ": expected an integer, got ",
               c[key].dump());
  return c[key].get<int64_t>();
}

double number_field(const json& c, const char* key, const std::string& where,
                    std::optional<double> fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    DTRAIN_CHECK(fallback.has_value(), where, ".", key, ": missing (expected a number)");
    return *fallback;
  }
  DTRAIN_CHECK(c[key].is_number(), where, ".", key, ": expected a number, got ", c[key].dump());
  return c[key].get<double>();
}

bool bool_field(const json& c, const char* key, const std::string& where, bool fallback) {
  if (!c.contains(key) || c[key].is_null()) return fallback;
  DTRAIN_CHECK(c[key].is_boolean(), where, ".", key, ": expected true or false, got ",
               c[key].dump());
  return c[key].get<bool>();
}

std::vector<int64_t> int_tuple_field(const json& c, const char* key, size_t n,
                                     const std::string& where,
                                     std::optional<std::vector<int64_t>> fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    DTRAIN_CHECK(fallback.has_value(), where, ".", key, ": missing (expected ", n, " integers)");
    return *fallback;
  }
  const json& v = c[key];
  if (v.is_number_integer()) return std::vector<int64_t>(n, v.get<int64_t>());
  DTRAIN_CHECK(v.is_array() && v.size() == n, where, ".", key, ": expected an integer or ", n,
               " integers, got ", v.dump());
  std::vector<int64_t> out;
  for (const json& e : v) {
    DTRAIN_CHECK(e.is_number_integer(), where, ".", key, ": expected integers, got ", v.dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::string initializer_json(const json& c, const char* key, const char* fallback) {
  if (!c.contains(key) || c[key].is_null()) return json(fallback).dump();
  return c[key].dump();
}

std::shared_ptr<Initializer> make_initializer(const std::string& spec,
                                              std::optional<uint64_t> seed) {
  const size_t first = spec.find_first_not_of(" \t\n");
  if (first != std::string::npos && (spec[first] == '{' || spec[first] == '"')) {
    return initializer_from_json(spec);
  }
  return initializer_from_name(spec, seed);
}

json initializer_config(const Initializer& init) {
  return {{"class_name", init.class_name()}, {"config", json::parse(init.config_json())}};
}

std::vector<int64_t> per_axis(const std::vector<int64_t>& v, int rank, const char* what,
                              const std::string& where) {
  if (v.size() == 1) return std::vector<int64_t>(static_cast<size_t>(rank), v[0]);
  DTRAIN_CHECK(v.size() == static_cast<size_t>(rank), where, ": ", what, " needs 1 or ", rank,
               " values, got ", v.size());
  return v;
}

bool parse_channels_first(const std::string& data_format, const std::string& where) {
  if (data_format.empty() || data_format == "channels_last") return false;
  if (data_format == "channels_first") return true;
  throw InvalidArgumentError(str_cat(where, ": unknown data_format '", data_format,
                                     "' (expected 'channels_last' or 'channels_first')"));
}

json int_list(const std::vector<int64_t>& v) {
  json out = json::array();
  for (int64_t x : v) out.push_back(x);
  return out;
}

std::string batch_shape_string(const Shape& s) {
  std::string out = "(None";
  for (int i = 0; i < s.rank(); ++i) out += ", " + std::to_string(s[i]);
  return out + ")";
}

}  // namespace dtrain::nn::detail
