// Collectives with ranks as threads over an in-memory store (Gloo's test/base_test.h pattern),
// on loopback TCP: results, bitwise agreement, bucketing, errors and timeouts.
#include "dtrain/distribute/collectives.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include "dtrain/core/error.h"
#include "testutil/ranks.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;

using testutil::run_ranks;

std::vector<float> rank_values(int rank, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(rank + 1) + 1e-3f * i;
  return v;
}

class AllReduceTest : public ::testing::TestWithParam<std::tuple<int, AllreduceAlgorithm>> {};

TEST_P(AllReduceTest, SumsAndAgreesBitwise) {
  const auto [size, algorithm] = GetParam();
  // Mixed sizes: several small tensors share a bucket, one is bigger than a bucket, and an
  // int64 tensor forms its own bucket.
  const std::vector<int64_t> sizes = {3, 100, 1, 5000, 7};
  std::vector<std::vector<std::vector<float>>> results(size);
  std::vector<int64_t> counts(size);
  run_ranks(size,
            [&](int r, Collectives& c) {
              for (int step = 0; step < 3; ++step) {  // buckets are reused across calls
                std::vector<Tensor> ts;
                for (int64_t n : sizes) ts.push_back(Tensor::from_vector(rank_values(r, n), {n}));
                ts.push_back(Tensor::from_vector<int64_t>({int64_t{r}, 10}, {2}));
                c.all_reduce(ts, ReduceOp::kSum);
                results[r].clear();
                for (size_t k = 0; k < sizes.size(); ++k)
                  results[r].push_back(ts[k].to_vector<float>());
                counts[r] = ts.back().to_vector<int64_t>()[0];
                EXPECT_EQ(ts.back().to_vector<int64_t>()[1], 10 * size);
              }
            },
            {.bucket_bytes = 4096, .algorithm = algorithm});
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int64_t i = 0; i < sizes[k]; ++i) {
      double expect = 0;
      for (int r = 0; r < size; ++r) expect += rank_values(r, sizes[k])[i];
      ASSERT_NEAR(results[0][k][i], expect, 1e-4 * std::abs(expect) + 1e-6);
    }
    for (int r = 1; r < size; ++r) {
      // Same bits everywhere, not merely close.
      ASSERT_EQ(std::memcmp(results[r][k].data(), results[0][k].data(), sizes[k] * 4), 0)
          << "tensor " << k << " differs between rank 0 and rank " << r;
    }
  }
  EXPECT_EQ(counts[0], size * (size - 1) / 2);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllReduceTest,
                         ::testing::Values(std::make_tuple(2, AllreduceAlgorithm::kAuto),
                                           std::make_tuple(3, AllreduceAlgorithm::kAuto),
                                           std::make_tuple(4, AllreduceAlgorithm::kAuto),
                                           std::make_tuple(2, AllreduceAlgorithm::kRing),
                                           std::make_tuple(3, AllreduceAlgorithm::kRingChunked),
                                           std::make_tuple(3, AllreduceAlgorithm::kHalvingDoubling),
                                           std::make_tuple(3, AllreduceAlgorithm::kReduceScatter)));

TEST(CollectivesTest, MeanScalarBroadcastGatherBarrier) {
  run_ranks(3, [](int r, Collectives& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.peers().size(), 3u);
    Tensor t = Tensor::full({4}, r * 3.0);
    std::vector<Tensor> ts{t};
    c.all_reduce(ts, ReduceOp::kMean);
    EXPECT_FLOAT_EQ(t.to_vector<float>()[2], 3.0f);
    EXPECT_DOUBLE_EQ(c.all_reduce_scalar(r + 1.0, ReduceOp::kSum), 6.0);
    EXPECT_DOUBLE_EQ(c.all_reduce_scalar(r + 1.0, ReduceOp::kMean), 2.0);

    std::vector<Tensor> vars{Tensor::full({2, 3}, r + 10.0), Tensor::full({5000}, -r - 1.0)};
    c.broadcast(vars, 1);
    EXPECT_EQ(vars[0].to_vector<float>(), std::vector<float>(6, 11.0f));
    EXPECT_EQ(vars[1].to_vector<float>(), std::vector<float>(5000, -2.0f));

    Tensor local = Tensor::from_vector<int64_t>({r, r * 10}, {2});
    Tensor all(DType::kInt64, {3, 2});
    c.all_gather(local, all);
    EXPECT_EQ(all.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 10, 2, 20}));
    c.barrier();
  });
}

// Two workers run buffers up to 512 KiB on sync-mode pairs (Gloo's sync mode, where both
// ranks write before reading) and larger ones up to 1 MiB on the event-loop pairs: sizes on
// both sides of that line (the MLP's 101,770 floats among them) complete and agree.
TEST(CollectivesTest, SyncPairRingCompletesUpToItsLargestBuffer) {
  // Blocking reads (the default) and busy-polling ones (DTRAIN_GLOO_BUSY_POLL=1).
  for (const char* busy_poll : {"0", "1"}) {
    setenv("DTRAIN_GLOO_BUSY_POLL", busy_poll, 1);
    for (int64_t n : {int64_t{25000}, int64_t{101770}, int64_t{200000}, int64_t{262144}}) {
      std::vector<std::vector<float>> results(2);
      run_ranks(2,
                [&](int rank, Collectives& c) {
                  std::vector<Tensor> ts{Tensor::from_vector<float>(rank_values(rank, n), {n})};
                  for (int round = 0; round < 3; ++round) c.all_reduce(ts, ReduceOp::kSum);
                  results[rank] = ts[0].to_vector<float>();
                },
                {.timeout = 20s, .shared_memory = false});  // the Gloo pairs
      ASSERT_EQ(results[0].size(), static_cast<size_t>(n));
      EXPECT_EQ(results[0], results[1]) << n << " busy poll " << busy_poll;
      // Three rounds of (v0 + v1): 4 × (v0 + v1) after the second and third doublings.
      const std::vector<float> v0 = rank_values(0, n), v1 = rank_values(1, n);
      EXPECT_FLOAT_EQ(results[0][n - 1], 4.0f * (v0[n - 1] + v1[n - 1])) << n;
    }
  }
  unsetenv("DTRAIN_GLOO_BUSY_POLL");
}

TEST(CollectivesTest, SingleWorkerIsLocal) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  auto c = Collectives::connect(store, {});
  Tensor t = Tensor::full({3}, 2.0);
  std::vector<Tensor> ts{t};
  c->all_reduce(ts, ReduceOp::kSum);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, 2.0f));
  EXPECT_EQ(c->all_reduce_scalar(5, ReduceOp::kMean), 5);
  Tensor all(DType::kFloat32, {1, 3});
  c->all_gather(t, all);
  EXPECT_EQ(all.to_vector<float>(), std::vector<float>(3, 2.0f));
  c->barrier();
}

TEST(CollectivesTest, RejectsUnsupportedInput) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  auto c = Collectives::connect(store, {});
  std::vector<Tensor> ints{Tensor::from_vector<int32_t>({1}, {1})};
  EXPECT_THROW(c->all_reduce(ints, ReduceOp::kMean), InvalidArgumentError);
  std::vector<Tensor> bytes{Tensor(DType::kUInt8, {2})};
  EXPECT_THROW(c->all_reduce(bytes, ReduceOp::kSum), InvalidArgumentError);
  EXPECT_THROW(c->broadcast(ints, 1), InvalidArgumentError);
}

TEST(CollectivesTest, PeerThatNeverArrivesTimesOutWithClearError) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  const auto start = std::chrono::steady_clock::now();
  try {
    Collectives::connect(store, {.rank = 0, .world_size = 3, .timeout = 300ms});
    FAIL() << "expected DeadlineExceededError";
  } catch (const DeadlineExceededError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank(s) 1, 2"), std::string::npos) << m;
    EXPECT_NE(m.find("never arrived"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(CollectivesTest, MismatchedWorldSizesAreNamed) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::string m0, m1;
  std::thread t([&] {
    try {
      Collectives::connect(store, {.rank = 1, .world_size = 3, .timeout = 2s, .generation = 0});
    } catch (const InvalidArgumentError& e) {
      m1 = e.what();
    } catch (const std::exception& e) {
      m1 = std::string("wrong type: ") + e.what();
    }
  });
  try {
    Collectives::connect(store, {.rank = 0, .world_size = 2, .timeout = 2s, .generation = 0});
  } catch (const InvalidArgumentError& e) {
    m0 = e.what();
  }
  t.join();
  EXPECT_NE(m0.find("mismatched world sizes"), std::string::npos) << m0;
  EXPECT_NE(m0.find("with 3"), std::string::npos) << m0;
  EXPECT_NE(m1.find("mismatched world sizes"), std::string::npos) << m1;
}

TEST(CollectivesTest, StalledPeerGivesDeadlineExceededAndBreaksContext) {
  std::atomic<bool> done{false};
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::string message;
  bool broken_after = false, precondition_after = false;
  std::thread peer([&] {
    auto c = Collectives::connect(store, {.rank = 1, .world_size = 2, .timeout = 300ms});
    while (!done) std::this_thread::sleep_for(5ms);  // never joins the all-reduce
  });
  {
    auto c = Collectives::connect(store, {.rank = 0, .world_size = 2, .timeout = 300ms});
    std::vector<Tensor> ts{Tensor::full({10}, 1.0)};
    try {
      c->all_reduce(ts, ReduceOp::kSum);
    } catch (const DeadlineExceededError& e) {
      message = e.what();
    }
    broken_after = c->broken();
    try {
      c->barrier();
    } catch (const FailedPreconditionError&) {
      precondition_after = true;
    }
  }
  done = true;
  peer.join();
  EXPECT_NE(message.find("all_reduce on rank 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out after 300 ms"), std::string::npos) << message;
  EXPECT_TRUE(broken_after);
  EXPECT_TRUE(precondition_after);
}

}  // namespace
}  // namespace dtrain::distribute
