// random_tensor(shape, seed): a float32 tensor of uniform values in [-1, 1) from Philox(seed), the
// same values for the same seed on every machine (the kernels' tests compare paths on it).
#pragma once

#include <cstdint>

#include "dtrain/core/random.h"
#include "dtrain/core/tensor.h"

namespace dtrain::testutil {

inline Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Philox rng(seed);
  Tensor t(shape);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = rng.uniform(-1.0f, 1.0f);
  return t;
}

}  // namespace dtrain::testutil
