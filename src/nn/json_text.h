// Private to src/nn: the parse-and-build pattern of the public *_from_json functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::nn::detail {

// Parses `text` and returns build(the JSON): invalid JSON, and a field of the wrong JSON type that
// `build` meets (nlohmann's exceptions), are InvalidArgumentError starting with `what`.
template <class Build>
auto from_json_text(const std::string& text, const std::string& what, const Build& build) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(str_cat(what, ": invalid JSON: ", e.what()));
  }
  try {
    return build(j);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(str_cat(what, ": malformed config: ", e.what()));
  }
}

}  // namespace dtrain::nn::detail
