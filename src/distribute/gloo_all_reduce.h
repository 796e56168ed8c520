// Private to distribute: the Gloo all-reduce algorithms behind Collectives::all_reduce, with the
// persistent bucket an old-style algorithm is bound to.
#pragma once

#include <gloo/algorithm.h>
#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/collectives.h"

namespace dtrain::distribute {

// A persistent buffer (tensors packed back to back) and the old-style algorithm bound to it.
struct Bucket {
  std::vector<double> storage;  // 8-byte aligned bytes
  DType dtype = DType::kInvalid;
  size_t count = 0;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::unique_ptr<gloo::Algorithm> algo;  // bound to (storage.data(), count, dtype)
  const void* algo_ptr = nullptr;

  void* data() { return storage.data(); }
  void reserve_bytes(size_t n) {
    const size_t words = (n + 7) / 8;
    if (storage.size() < words) {
      storage.resize(words);
      algo.reset();  // storage moved
    }
  }
};

// Gloo's old-style algorithm `a` (kRing, kRingChunked, kHalvingDoubling) summing `count`
// elements of dtype `d` (float32, float64, int32, int64) at `ptr` in place.
std::unique_ptr<gloo::Algorithm> make_old_style(const std::shared_ptr<gloo::Context>& ctx,
                                                AllreduceAlgorithm a, DType d, void* ptr,
                                                size_t count);

// gloo::allreduce (the reduce-scatter + all-gather ring) of `count` elements at `ptr`, in place.
void new_style_allreduce(const std::shared_ptr<gloo::Context>& ctx, DType d, void* ptr,
                         size_t count, std::chrono::milliseconds timeout);

}  // namespace dtrain::distribute
