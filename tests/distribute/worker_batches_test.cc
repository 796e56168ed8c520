// distribute::worker_batches: each worker's rows of every global batch of
// from_tensor_slices.shuffle.batch, gathered from shuffled indices, bitwise; resumable.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/key_value_store.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kRows = 203;

// x: [kRows, 3] float32 with row i = (i, i + 0.25, -i); y: uint8 labels i % 251.
std::vector<Tensor> make_data() {
  Tensor x(Shape{kRows, 3});
  Tensor y(DType::kUInt8, Shape{kRows});
  for (int64_t i = 0; i < kRows; ++i) {
    x.data<float>()[i * 3] = static_cast<float>(i);
    x.data<float>()[i * 3 + 1] = static_cast<float>(i) + 0.25f;
    x.data<float>()[i * 3 + 2] = -static_cast<float>(i);
    y.data<uint8_t>()[i] = static_cast<uint8_t>(i % 251);
  }
  return {x, y};
}

data::Dataset global_batches(const std::vector<Tensor>& d, int64_t batch, bool shuffle) {
  data::Dataset ds = data::Dataset::from_tensor_slices(d);
  if (shuffle) ds = ds.shuffle(kRows, /*seed=*/99, /*reshuffle_each_iteration=*/true);
  return ds.batch(batch);
}

// For `workers` workers of `local` replicas each: every element of passes 0 and 1 is, per
// worker, its worker_rows of the global element (bitwise), with the global row count; the
// workers' rows of a pass cover each row exactly once.
void check_split(int workers, int local, int64_t batch, bool shuffle) {
  SCOPED_TRACE(std::to_string(workers) + " workers x " + std::to_string(local) + ", batch " +
               std::to_string(batch) + (shuffle ? ", shuffled" : ""));
  const std::vector<Tensor> d = make_data();
  const int n = workers * local;
  std::vector<data::Dataset> mine;
  for (int w = 0; w < workers; ++w) {
    mine.push_back(worker_batches(d, {.batch_size = batch, .shuffle = shuffle, .seed = 99}, n,
                                  w * local, w * local + local - 1));
    EXPECT_EQ(mine[w].cardinality(), global_batches(d, batch, shuffle).cardinality());
  }
  for (int64_t pass = 0; pass < 2; ++pass) {
    data::Iterator git = global_batches(d, batch, shuffle).iterator(pass);
    std::vector<data::Iterator> its;
    for (const auto& ds : mine) its.push_back(ds.iterator(pass));
    data::Element g, e;
    std::multiset<int64_t> seen;
    int64_t steps = 0;
    while (git.next(g)) {
      const int64_t rows = g[0].dim(0);
      for (int w = 0; w < workers; ++w) {
        ASSERT_TRUE(its[w].next(e)) << "worker " << w << " ended early at step " << steps;
        ASSERT_EQ(e.size(), 3u);
        EXPECT_EQ(e[2].dtype(), DType::kInt64);
        EXPECT_EQ(e[2].data<int64_t>()[0], rows);
        const auto [b, end] = worker_rows(rows, n, w * local, w * local + local - 1);
        EXPECT_TRUE(e[0].equals(g[0].slice(b, end))) << "worker " << w << " step " << steps;
        EXPECT_TRUE(e[1].equals(g[1].slice(b, end))) << "worker " << w << " step " << steps;
        for (int64_t r = 0; r < e[0].dim(0); ++r) {
          seen.insert(static_cast<int64_t>(e[0].data<float>()[r * 3]));
        }
      }
      ++steps;
    }
    for (int w = 0; w < workers; ++w) EXPECT_FALSE(its[w].next(e)) << "worker " << w;
    EXPECT_EQ(seen.size(), static_cast<size_t>(kRows));
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), static_cast<size_t>(kRows))
        << "a row was taken twice in pass " << pass;
  }
}

TEST(WorkerBatchesTest, EachWorkerGetsItsRowsOfEveryGlobalBatch) {
  for (bool shuffle : {true, false}) {
    check_split(1, 1, 64, shuffle);
    check_split(2, 1, 64, shuffle);  // the last batch: 11 rows, 6 + 5
    check_split(3, 1, 50, shuffle);
    check_split(2, 2, 7, shuffle);
    check_split(4, 1, 2, shuffle);  // 2 rows over 4 workers: two workers get none
  }
}

TEST(WorkerBatchesTest, ResumesAtAnIteratorPosition) {
  const std::vector<Tensor> d = make_data();
  const data::Dataset ds = worker_batches(d, {.batch_size = 16, .seed = 5}, 3, 1, 1);
  data::Iterator it = ds.iterator(1);
  data::Element e, r;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(it.next(e));
  data::Iterator resumed = ds.iterator_from(it.state());
  int64_t steps = 0;
  while (it.next(e)) {
    ASSERT_TRUE(resumed.next(r));
    EXPECT_TRUE(e[0].equals(r[0]) && e[1].equals(r[1]) && e[2].equals(r[2])) << steps;
    ++steps;
  }
  EXPECT_EQ(steps, 13 - 5);  // ceil(203 / 16) = 13 batches
  EXPECT_FALSE(resumed.next(r));
}

TEST(WorkerBatchesTest, RejectsBadArguments) {
  const std::vector<Tensor> d = make_data();
  EXPECT_THROW(worker_batches(d, {.batch_size = 0}, 2, 0, 0), InvalidArgumentError);
  EXPECT_THROW(worker_batches(d, {.batch_size = 8}, 2, 1, 2), InvalidArgumentError);
  EXPECT_THROW(worker_batches({d[0], Tensor(Shape{5})}, {.batch_size = 8}, 2, 0, 0),
               InvalidArgumentError);
  EXPECT_THROW(worker_batches({Tensor::scalar(1.0f)}, {.batch_size = 8}, 2, 0, 0),
               InvalidArgumentError);
}

// Workers as threads over one in-memory store: the Strategy overload picks each worker's
// replicas.
TEST(WorkerBatchesTest, StrategyOverloadUsesTheWorkersReplicas) {
  const std::vector<Tensor> d = make_data();
  auto store = std::make_shared<InMemoryKeyValueStore>();
  std::vector<std::vector<float>> first(2);
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errors(2);
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      try {
        ClusterSpec c;
        c.source = "test";
        c.jobs["worker"] = std::vector<std::string>(2, "127.0.0.1:0");
        c.worker_addresses = c.jobs["worker"];
        c.task_index = c.rank = r;
        c.num_workers = 2;
        c.host = "127.0.0.1";
        MultiWorkerMirroredStrategy s({.cluster = c, .store = store, .timeout = 10s});
        data::Element e;
        ASSERT_TRUE(worker_batches(d, {.batch_size = 10, .seed = 3}, s).iterator(0).next(e));
        first[r] = e[0].to_vector<float>();
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  data::Element g;
  ASSERT_TRUE(
      data::Dataset::from_tensor_slices(d).shuffle(kRows, 3, true).batch(10).iterator(0).next(g));
  std::vector<float> joined = first[0];
  joined.insert(joined.end(), first[1].begin(), first[1].end());
  EXPECT_EQ(joined, g[0].to_vector<float>());
}

}  // namespace
}  // namespace dtrain::distribute
