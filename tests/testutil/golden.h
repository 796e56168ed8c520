// PyTorch goldens for the tests: tools/golden/gen_*.py write tests/golden/*.json, whose tensors
// are {"shape": [...], "data": [...]} (with "dtype" when not float32); tests read them here and
// compare elementwise within rtol·|torch| + atol.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::testutil {

// tests/golden/<file>, parsed once per process.
inline const nlohmann::json& golden_file(const std::string& file) {
  static std::map<std::string, nlohmann::json> docs;
  auto it = docs.find(file);
  if (it == docs.end()) {
    const std::string path = std::string(DTRAIN_SOURCE_DIR "/tests/golden/") + file;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    it = docs.emplace(file, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

inline Shape golden_shape(const nlohmann::json& t) {
  return Shape(t.at("shape").get<std::vector<int64_t>>());
}

// A tensor from {"shape", "data"[, "dtype": float32|int32|int64|uint8]}.
inline Tensor golden_tensor(const nlohmann::json& t) {
  const std::string dtype = t.value("dtype", "float32");
  const Shape shape = golden_shape(t);
  const nlohmann::json& d = t.at("data");
  if (dtype == "float32") return Tensor::from_vector(d.get<std::vector<float>>(), shape);
  if (dtype == "int32") return Tensor::from_vector(d.get<std::vector<int32_t>>(), shape);
  if (dtype == "int64") return Tensor::from_vector(d.get<std::vector<int64_t>>(), shape);
  if (dtype == "uint8") return Tensor::from_vector(d.get<std::vector<uint8_t>>(), shape);
  throw std::runtime_error("golden: unknown dtype " + dtype);
}

struct GoldenTolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

// Expects the float32 `actual` to equal the golden tensor `expected` within the tolerance,
// reporting the first five elements that differ. Returns the largest |diff| / tolerance seen
// (≤ 1 passes), for tests that log how close they are.
inline double expect_close_to_golden(const Tensor& actual, const nlohmann::json& expected,
                                     const std::string& what, GoldenTolerance tol = {}) {
  if (!actual.defined()) {
    ADD_FAILURE() << what << ": undefined";
    return 0;
  }
  if (actual.shape() != golden_shape(expected)) {
    ADD_FAILURE() << what << ": shape " << actual.shape().to_string() << ", torch "
                  << golden_shape(expected).to_string();
    return 0;
  }
  const std::vector<double> e = expected.at("data").get<std::vector<double>>();
  const float* a = actual.data<float>();
  int failures = 0;
  double worst = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double bound = tol.rtol * std::fabs(e[i]) + tol.atol;
    const double diff = std::fabs(a[i] - e[i]);
    worst = std::max(worst, diff / bound);
    if (diff > bound && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: dtrain " << a[i] << ", torch " << e[i] << " (|diff| "
                    << diff << " > " << bound << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << e.size() << " elements differ";
  return worst;
}

}  // namespace dtrain::testutil
