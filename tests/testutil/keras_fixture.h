// Test helpers for the Keras 2.12 fixture (../shared/fixtures/keras_h5/mnist_mlp_keras212): its
// path and the CSVs of its weights written beside it by Keras.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::testutil {

// Tests run from the repository root, with ../shared beside it.
inline const std::string kKerasFixtureDir = "../shared/fixtures/keras_h5/mnist_mlp_keras212/";
inline const std::string kKerasFixture = kKerasFixtureDir + "mnist_model.h5";

// A CSV of numbers as rows of columns (an unreadable file fails the test and gives no rows).
inline std::vector<std::vector<double>> read_csv(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<double> row;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) row.push_back(std::stod(cell));
    rows.push_back(std::move(row));
  }
  return rows;
}

// The largest |t[k] − csv[k]| over the float32 tensor's elements in row-major order; infinity
// when the CSV holds a different number of values.
inline double max_abs_diff_to_csv(const Tensor& t, const std::string& csv) {
  const float* p = t.data<float>();
  size_t k = 0;
  double diff = 0;
  for (const auto& row : read_csv(csv)) {
    for (double v : row) {
      if (k >= static_cast<size_t>(t.num_elements()))
        return std::numeric_limits<double>::infinity();
      diff = std::max(diff, std::abs(static_cast<double>(p[k++]) - v));
    }
  }
  return k == static_cast<size_t>(t.num_elements()) ? diff
                                                    : std::numeric_limits<double>::infinity();
}

}  // namespace dtrain::testutil
