// MultiWorkerMirroredStrategy with workers as threads over one in-memory store: broadcast from
// the chief, gradient reduction across workers and local replicas, verify_sync, data split.
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"

#include <gtest/gtest.h>

#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/sync_check.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;

ClusterSpec worker_cluster(int rank, int n) {
  ClusterSpec c;
  c.source = "test";
  c.jobs["worker"] = std::vector<std::string>(n, "127.0.0.1:0");
  c.worker_addresses = c.jobs["worker"];
  c.task_index = c.rank = rank;
  c.num_workers = n;
  c.host = "127.0.0.1";
  return c;
}

void run_workers(int n, int local, const std::function<void(MultiWorkerMirroredStrategy&)>& fn) {
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        MultiWorkerMirroredStrategy s({.cluster = worker_cluster(r, n),
                                       .store = store,
                                       .timeout = 10s,
                                       .local_replicas = local});
        fn(s);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

TEST(MultiWorkerMirroredStrategyTest, BroadcastReduceAndVerifySync) {
  run_workers(3, 2, [](MultiWorkerMirroredStrategy& s) {
    EXPECT_EQ(s.num_replicas_in_sync(), 6);
    EXPECT_EQ(s.is_chief(), s.worker_rank() == 0);
    EXPECT_EQ(s.replica_id(1), s.worker_rank() * 2 + 1);
    Tensor w = Tensor::full({3, 3}, s.worker_rank() + 1.0);
    std::vector<Tensor> vars{w};
    s.broadcast_from_chief(vars);
    EXPECT_EQ(w.to_vector<float>(), std::vector<float>(9, 1.0f));
    const NamedTensor named[] = {{"w", w}};
    verify_sync(s, named, 0);

    std::vector<std::vector<Tensor>> grads(2);
    for (int r = 0; r < 2; ++r) grads[r] = {Tensor::full({3, 3}, s.replica_id(r))};
    std::vector<Tensor> out{Tensor::zeros({3, 3})};
    s.reduce_gradients(grads, out, ReduceOp::kSum);
    EXPECT_EQ(out[0].to_vector<float>(), std::vector<float>(9, 15.0f));  // 0 + 1 + ... + 5
    Tensor mean =
        s.reduce(ReduceOp::kMean,
                 s.run([&](int r) { return Tensor::scalar(static_cast<float>(s.replica_id(r))); }));
    EXPECT_FLOAT_EQ(static_cast<float>(mean.item()), 2.5f);

    if (s.worker_rank() == 2) w.data<float>()[4] = 7;  // diverge
    try {
      verify_sync(s, named, 12);
      ADD_FAILURE() << "verify_sync missed a divergence";
    } catch (const InternalError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("at step 12: replicas diverged: variable 'w'"), std::string::npos) << m;
      EXPECT_NE(m.find("worker(s) 2"), std::string::npos) << m;
    }
  });
}

TEST(MultiWorkerMirroredStrategyTest, RejectsTasksThatDoNotAllReduce) {
  ClusterSpec c = worker_cluster(0, 1);
  c.task_type = "ps";
  EXPECT_THROW(MultiWorkerMirroredStrategy({.cluster = c}), InvalidArgumentError);
}

TEST(InputTest, ReplicaRowsFollowTfRebatching) {
  EXPECT_EQ(replica_rows(64, 2, 1), (std::pair<int64_t, int64_t>{32, 64}));
  EXPECT_EQ(replica_rows(10, 4, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(replica_rows(10, 4, 1), (std::pair<int64_t, int64_t>{3, 6}));
  EXPECT_EQ(replica_rows(10, 4, 3), (std::pair<int64_t, int64_t>{8, 10}));
  EXPECT_EQ(replica_rows(1, 3, 2), (std::pair<int64_t, int64_t>{1, 1}));
  EXPECT_THROW(replica_rows(4, 2, 2), InvalidArgumentError);
}

TEST(InputTest, WorkersTogetherSeeExactlyTheGlobalBatches) {
  const int64_t n = 200;
  std::vector<float> xs(n);
  for (int64_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i);
  auto global = data::Dataset::from_tensor_slices({Tensor::from_vector(xs, {n})})
                    .shuffle(n, /*seed=*/11)
                    .batch(64);
  std::vector<std::vector<std::vector<float>>> seen(2);  // [worker][step] rows
  run_workers(2, 1, [&](MultiWorkerMirroredStrategy& s) {
    auto it = distribute_dataset(global, s).iterator(1);
    data::Element e;
    while (it.next(e)) {
      Tensor mine = replica_slice(e, s, 0)[0];
      EXPECT_TRUE(mine.equals(e[0]));  // one local replica: the whole worker part
      seen[s.worker_rank()].push_back(e[0].to_vector<float>());
    }
  });
  auto it = global.iterator(1);
  data::Element e;
  size_t step = 0;
  while (it.next(e)) {
    std::vector<float> joined = seen[0].at(step);
    joined.insert(joined.end(), seen[1].at(step).begin(), seen[1].at(step).end());
    EXPECT_EQ(joined, e[0].to_vector<float>()) << "step " << step;
    ++step;
  }
  EXPECT_EQ(step, 4u);  // 64, 64, 64, 8: the partial batch splits 4 + 4
  EXPECT_EQ(seen[0].back().size(), 4u);
}

TEST(InputTest, LocalReplicaSlicesOfWorkerBatchEqualGlobalSlices) {
  // 7 rows over 2 workers x 2 replicas: replicas get 2, 2, 2, 1 rows of the global batch.
  Tensor global = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5, 6}, {7});
  run_workers(2, 2, [&](MultiWorkerMirroredStrategy& s) {
    const auto [wb, we] = worker_rows(7, s);
    Tensor worker = global.slice(wb, we);
    for (int l = 0; l < 2; ++l) {
      const auto [b, e] = replica_rows(7, 4, s.replica_id(l));
      Tensor mine = replica_slice(worker, s, l);
      EXPECT_TRUE(mine.equals(global.slice(b, e))) << "replica " << s.replica_id(l);
      EXPECT_TRUE(mine.shares_buffer_with(global));  // a view, no copy
    }
  });
}

}  // namespace
}  // namespace dtrain::distribute
