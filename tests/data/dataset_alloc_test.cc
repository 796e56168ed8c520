// Counts global operator new calls over a steady-state pass: from_tensor_slices -> shuffle ->
// batch (-> prefetch) must not allocate per element. This file replaces operator new/delete for
// the whole test executable, which is why it is a test of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/data/dataset.h"
#include "testutil/count_new.h"

namespace {
long new_count() { return dtrain::testutil::new_calls(); }
}  // namespace

namespace dtrain::data {
namespace {

struct PassCost {
  long news = 0;
  uint64_t system_allocations = 0;
  int64_t batches = 0;
};

// Runs pass `iteration` reusing `e`, and reports the allocations it made.
PassCost run_pass(const Dataset& ds, int64_t iteration, Element& e) {
  const uint64_t sys0 = allocator_stats().system_allocations;
  const long news0 = new_count();
  PassCost cost;
  {
    Iterator it = ds.iterator(iteration);
    while (it.next(e)) ++cost.batches;
  }
  cost.news = new_count() - news0;
  cost.system_allocations = allocator_stats().system_allocations - sys0;
  return cost;
}

Dataset make_pipeline(bool prefetch) {
  Philox rng(1);
  Tensor x(DType::kFloat32, Shape{1000, 8});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.data<float>()[i] = rng.uniform();
  Tensor y(DType::kInt32, Shape{1000});
  for (int32_t i = 0; i < 1000; ++i) y.data<int32_t>()[i] = i % 10;
  Dataset ds = Dataset::from_tensor_slices({x, y}).shuffle(1000, 5).batch(32);
  return prefetch ? ds.prefetch(2) : ds;
}

class AllocTest : public ::testing::TestWithParam<bool> {};

TEST_P(AllocTest, SecondPassAllocatesNothingPerElement) {
  const Dataset ds = make_pipeline(GetParam());
  if (GetParam()) {
    // With prefetch, how many batches are alive at once (consumer + ring + one being built:
    // at most buffer_size + 2) depends on thread timing, so a first pass need not reach the
    // high-water mark. Warm the cache to it, so the check below is deterministic.
    std::vector<Tensor> warm;
    for (int i = 0; i < 2 + 2; ++i) {
      warm.emplace_back(DType::kFloat32, Shape{32, 8});
      warm.emplace_back(DType::kInt32, Shape{32});
    }
  }
  Element e;
  const PassCost first = run_pass(ds, 0, e);
  EXPECT_EQ(first.batches, 32);
  const PassCost second = run_pass(ds, 1, e);
  EXPECT_EQ(second.batches, 32);
  std::printf("operator new calls: first pass %ld, second pass %ld\n", first.news, second.news);
  // Per pass: the iterator chain, the shuffle buffer, a few reused containers (and the
  // prefetch ring and thread). Nothing per element or per batch: 1000 elements, 32 batches.
  EXPECT_LE(second.news, 16) << "operator new calls in a steady-state pass";
  EXPECT_EQ(second.system_allocations, 0u) << "tensor buffers must come from the cache";
  const PassCost third = run_pass(ds, 2, e);
  EXPECT_EQ(third.news, second.news);
  EXPECT_EQ(third.system_allocations, 0u);
}

INSTANTIATE_TEST_SUITE_P(Dataset, AllocTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Prefetch" : "Plain"; });

}  // namespace
}  // namespace dtrain::data
