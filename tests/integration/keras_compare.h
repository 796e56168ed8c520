// For the tests whose jobs save a Keras 3 file: two .keras archives hold the same config and
// bit-identical variables (weights, moving statistics, optimizer variables).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "dtrain/checkpoint/keras_v3.h"

namespace dtrain::testing {

// Expects `got` to equal `want` bit for bit; `what` says which run differs in the messages.
// Returns how many variables were compared.
inline int expect_same_keras(const checkpoint::KerasV3Contents& got,
                             const checkpoint::KerasV3Contents& want, const std::string& what) {
  EXPECT_EQ(got.config_json, want.config_json) << what;
  EXPECT_EQ(got.vars.size(), want.vars.size()) << what;
  if (got.vars.size() != want.vars.size()) return 0;
  int compared = 0;
  for (size_t i = 0; i < want.vars.size(); ++i) {
    EXPECT_EQ(got.vars[i].path, want.vars[i].path) << what;
    EXPECT_EQ(got.vars[i].values.size(), want.vars[i].values.size()) << want.vars[i].path;
    if (got.vars[i].values.size() != want.vars[i].values.size()) continue;
    for (size_t k = 0; k < want.vars[i].values.size(); ++k, ++compared) {
      EXPECT_TRUE(got.vars[i].values[k].equals(want.vars[i].values[k]))
          << want.vars[i].path << "/vars/" << k << " differs " << what;
    }
  }
  return compared;
}

}  // namespace dtrain::testing
