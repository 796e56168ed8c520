// MirroredStrategy and OneDeviceStrategy: replica threads, per-replica values, fixed-order
// reductions, BLAS thread sizing, errors.
#include "dtrain/distribute/mirrored_strategy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "dtrain/core/cpus.h"
#include "dtrain/core/error.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::distribute {
namespace {

TEST(MirroredStrategyTest, RunsEveryReplicaOnItsOwnThread) {
  MirroredStrategy s(3);
  EXPECT_EQ(s.num_replicas_in_sync(), 3);
  EXPECT_EQ(s.name(), "MirroredStrategy");
  for (int step = 0; step < 20; ++step) {
    std::mutex mu;
    std::set<std::thread::id> ids;
    std::atomic<int> arrived{0};
    std::vector<int> seen(3, -1);
    s.run([&](int r) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      seen[r] = current_local_replica();
      EXPECT_EQ(current_strategy(), &s);
      // Replicas may wait for each other: all run at once.
      ++arrived;
      while (arrived < 3) std::this_thread::yield();
    });
    EXPECT_EQ(ids.size(), 3u);
    EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  }
  EXPECT_EQ(current_local_replica(), -1);
}

TEST(MirroredStrategyTest, PerReplicaValuesAndFixedOrderReduce) {
  MirroredStrategy s(4);
  PerReplica values = s.run([](int r) {
    return Tensor::from_vector<float>({1e8f, 1.0f + r, 0.1f * r}, {3});
  });
  ASSERT_EQ(values.size(), 4u);
  Tensor sum = s.reduce(ReduceOp::kSum, values);
  // Replica order: ((v0 + v1) + v2) + v3, in float.
  for (int i = 0; i < 3; ++i) {
    float expect = values[0].data<float>()[i];
    for (int r = 1; r < 4; ++r) expect += values[r].data<float>()[i];
    EXPECT_EQ(sum.data<float>()[i], expect);
  }
  Tensor mean = s.reduce(ReduceOp::kMean, values);
  EXPECT_FLOAT_EQ(mean.data<float>()[1], 2.5f);
  EXPECT_THROW(s.reduce(ReduceOp::kSum, PerReplica(values.begin(), values.begin() + 2)),
               InvalidArgumentError);
}

TEST(MirroredStrategyTest, ReduceGradientsSumsInReplicaOrderInPlace) {
  MirroredStrategy s(3);
  std::vector<std::vector<Tensor>> grads(3);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> big(1001);
    for (size_t i = 0; i < big.size(); ++i) big[i] = 1.0f / (r + 1 + i);
    grads[r] = {Tensor::from_vector(big, {1001}), Tensor::full({2, 2}, r + 1.0)};
  }
  std::vector<Tensor> expect = {grads[0][0].clone(), grads[0][1].clone()};
  for (size_t v = 0; v < 2; ++v) {
    float* e = expect[v].data<float>();
    for (int64_t i = 0; i < expect[v].num_elements(); ++i) {
      e[i] = (grads[0][v].data<float>()[i] + grads[1][v].data<float>()[i]) +
             grads[2][v].data<float>()[i];
    }
  }
  std::vector<Tensor> out = grads[0];  // aliases replica 0's gradients
  s.reduce_gradients(grads, out, ReduceOp::kSum);
  EXPECT_TRUE(out[0].equals(expect[0]));
  EXPECT_TRUE(out[1].equals(expect[1]));
  EXPECT_TRUE(grads[0][0].equals(expect[0]));  // written in place
}

TEST(MirroredStrategyTest, RethrowsLowestReplicaErrorAndStaysUsable) {
  MirroredStrategy s(3);
  try {
    s.run([](int r) {
      if (r >= 1) throw InvalidArgumentError("replica " + std::to_string(r));
    });
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "replica 1");
  }
  std::atomic<int> n{0};
  s.run([&](int) { ++n; });
  EXPECT_EQ(n, 3);
  EXPECT_THROW(s.run([&](int r) {
    if (r == 0) s.run([](int) {});
  }),
               FailedPreconditionError);
}

TEST(MirroredStrategyTest, SizesBlasThreadsAndRestoresThem) {
  ops::set_num_threads(2);
  {
    MirroredStrategy s(2);
    EXPECT_EQ(ops::num_threads(), std::max(1, usable_cpus() / 2));
  }
  EXPECT_EQ(ops::num_threads(), 2);
  {
    MirroredStrategy s(2, {.blas_threads = -1});
    EXPECT_EQ(ops::num_threads(), 2);
  }
}

TEST(OneDeviceStrategyTest, RunsOnCallingThread) {
  OneDeviceStrategy s;
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  EXPECT_TRUE(s.is_chief());
  const auto me = std::this_thread::get_id();
  PerReplica v = s.run([&](int r) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(current_local_replica(), 0);
    return Tensor::full({2}, r + 5.0);
  });
  EXPECT_EQ(s.reduce(ReduceOp::kMean, v).to_vector<float>(), std::vector<float>(2, 5.0f));
  auto guard = s.scope();
  EXPECT_EQ(current_strategy(), &s);
}

}  // namespace
}  // namespace dtrain::distribute
