// ParameterServer, place_variables, ParameterServerStrategy and ClusterCoordinator in one
// process: servers and workers are threads on loopback ports (the multi-process tests are in
// tests/integration/ps_training_test.cc).
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "testutil/free_port.h"

namespace dtrain::distribute {
namespace {

using std::chrono::milliseconds;
using testutil::free_port;

optim::OptimizerConfig sgd(double lr) {
  return {.class_name = "SGD", .name = "", .hyperparameters = {{"learning_rate", lr}}};
}

struct Cluster {
  std::vector<std::unique_ptr<ParameterServer>> servers;
  ClusterSpec spec;

  explicit Cluster(int num_ps, int num_workers = 1) {
    spec.source = "test";
    spec.jobs["chief"] = {"127.0.0.1:" + std::to_string(free_port())};
    for (int i = 0; i < num_ps; ++i) {
      servers.push_back(std::make_unique<ParameterServer>(
          ParameterServerOptions{.address = "127.0.0.1:0", .sync_to_disk = false}));
      spec.jobs["ps"].push_back(servers.back()->address());
    }
    for (int i = 0; i < num_workers; ++i) {
      spec.jobs["worker"].push_back("127.0.0.1:" + std::to_string(free_port()));
    }
  }
  ClusterSpec task(const std::string& type, int index) const {
    ClusterSpec s = spec;
    s.task_type = type;
    s.task_index = index;
    return s;
  }
};

TEST(PlaceVariables, BalancesBySizeAndSplitsLargeVariables) {
  Variable big("big", Tensor::zeros(Shape{10, 100}));     // 4000 bytes
  Variable mid("mid", Tensor::zeros(Shape{30, 10}));      // 1200 bytes
  Variable small("small", Tensor::zeros(Shape{10}));      // 40 bytes
  Variable small2("small2", Tensor::zeros(Shape{5, 2}));  // 40 bytes
  std::vector<Variable*> vars = {&small, &big, &mid, &small2};
  auto p = place_variables(vars, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[1].shards[0].ps, 0);  // the largest first, onto server 0
  EXPECT_EQ(p[2].shards[0].ps, 1);  // then onto the emptier server
  EXPECT_EQ(p[0].shards[0].ps, 1);
  EXPECT_EQ(p[3].shards[0].ps, 1);
  // FixedShardsPartitioner(3) on "big": rows 4, 3, 3 (np.array_split), names part_i.
  p = place_variables(vars, 2, {.num_shards = 3, .min_bytes = 2000});
  ASSERT_EQ(p[1].shards.size(), 3u);
  EXPECT_EQ(p[1].shards[0].name, "big/part_0");
  EXPECT_EQ(p[1].shards[0].row_end, 4);
  EXPECT_EQ(p[1].shards[1].shape, (Shape{3, 100}));
  EXPECT_EQ(p[2].shards.size(), 1u);  // under min_bytes
  EXPECT_THROW(place_variables(vars, 0), InvalidArgumentError);
  Variable dup("big", Tensor::zeros(Shape{1}));
  std::vector<Variable*> dups = {&big, &dup};
  EXPECT_THROW(place_variables(dups, 1), InvalidArgumentError);
}

TEST(ParameterServerStrategy, RejectsClustersItCannotRun) {
  Cluster c(1);
  ClusterSpec no_ps = c.task("chief", 0);
  no_ps.jobs.erase("ps");
  EXPECT_THROW(ParameterServerStrategy({.cluster = no_ps}), InvalidArgumentError);
  ClusterSpec no_chief = c.task("worker", 0);
  no_chief.jobs.erase("chief");
  EXPECT_THROW(ParameterServerStrategy({.cluster = no_chief}), InvalidArgumentError);
  EXPECT_THROW(ParameterServerStrategy({.cluster = c.task("ps", 0)}), InvalidArgumentError);
  ParameterServerStrategy ok({.cluster = c.task("chief", 0)});
  EXPECT_TRUE(ok.is_chief());
  EXPECT_EQ(ok.num_ps(), 1);
}

TEST(ParameterServerStrategy, UnreachableServerNamesItsAddress) {
  Cluster c(0);
  c.spec.jobs["ps"] = {"127.0.0.1:" + std::to_string(free_port())};
  ParameterServerStrategy s({.cluster = c.task("chief", 0), .connect_timeout = milliseconds(300)});
  Variable v("v", Tensor::zeros(Shape{2}));
  std::vector<Variable*> vars = {&v};
  try {
    s.create_variables(vars, sgd(1.0));
    FAIL() << "no error";
  } catch (const UnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find(c.spec.jobs["ps"][0]), std::string::npos) << e.what();
  }
}

TEST(ParameterServerStrategy, PullPushAsyncWithShardsAndDuplicates) {
  Cluster c(2);
  ParameterServerStrategy chief(
      {.cluster = c.task("chief", 0), .partitioner = {.num_shards = 2, .min_bytes = 16}});
  Variable w("w", Tensor::full(Shape{4, 2}, 1.0));
  Variable b("b", Tensor::full(Shape{2}, 5.0));
  std::vector<Variable*> vars = {&w, &b};
  chief.create_variables(vars, sgd(0.5));
  // A worker with its own copies pulls, pushes gradients of ones, pulls again.
  ParameterServerStrategy worker(
      {.cluster = c.task("worker", 0), .partitioner = {.num_shards = 2, .min_bytes = 16}});
  Variable ww("w", Tensor::zeros(Shape{4, 2}));
  Variable wb("b", Tensor::zeros(Shape{2}));
  std::vector<Variable*> wvars = {&ww, &wb};
  worker.attach_variables(wvars);
  PullToken token = worker.pull(wvars);
  EXPECT_FLOAT_EQ(ww.tensor().data<float>()[7], 1.0f);
  EXPECT_FLOAT_EQ(wb.tensor().data<float>()[1], 5.0f);
  std::vector<Tensor> grads = {Tensor::ones(Shape{4, 2}), Tensor::ones(Shape{2})};
  worker.push(token, grads, {.closure_id = 42});
  const PushResult again = worker.push(token, grads, {.closure_id = 42});  // ignored
  EXPECT_EQ(again.staleness, 1);
  worker.pull(wvars);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(ww.tensor().data<float>()[i], 0.5f);
  EXPECT_FLOAT_EQ(wb.tensor().data<float>()[0], 4.5f);
  int64_t duplicates = 0, versions = 0;
  for (const auto& s : chief.server_stats()) {
    duplicates += s.duplicates;
    versions += s.version;
  }
  EXPECT_GE(duplicates, 1);
  EXPECT_EQ(versions, 2);  // one update on each server
}

TEST(ParameterServerStrategy, ShapeMismatchNamesTheVariable) {
  Cluster c(1);
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  Variable w("w", Tensor::zeros(Shape{4, 2}));
  std::vector<Variable*> vars = {&w};
  chief.create_variables(vars, sgd(0.1));
  ParameterServerStrategy worker({.cluster = c.task("worker", 0)});
  Variable other("w", Tensor::zeros(Shape{4, 3}));
  std::vector<Variable*> wvars = {&other};
  worker.attach_variables(wvars);
  try {
    worker.pull(wvars);
    FAIL() << "no error";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 3] on the worker but float32 [4, 2]"),
              std::string::npos)
        << e.what();
  }
}

TEST(ParameterServerStrategy, SynchronousStepAppliesOnceAllPartsArrived) {
  Cluster c(1, 2);
  ParameterServerStrategy chief({.cluster = c.task("chief", 0), .synchronous = true});
  Variable w("w", Tensor::full(Shape{2}, 1.0));
  std::vector<Variable*> vars = {&w};
  chief.create_variables(vars, sgd(1.0));
  const PullToken t = chief.pull(vars);
  chief.push(t, std::vector<Tensor>{Tensor::full(Shape{2}, 0.25)},
             {.step = 0, .part = 1, .num_parts = 2});
  EXPECT_EQ(chief.server_stats()[0].version, 0);
  chief.push(t, std::vector<Tensor>{Tensor::full(Shape{2}, 0.25)},
             {.step = 0, .part = 1, .num_parts = 2});
  EXPECT_EQ(chief.server_stats()[0].version, 0);  // the same part twice counts once
  chief.push(t, std::vector<Tensor>{Tensor::full(Shape{2}, 0.5)},
             {.step = 0, .part = 0, .num_parts = 2});
  EXPECT_EQ(chief.server_stats()[0].version, 1);
  chief.pull(vars);
  EXPECT_FLOAT_EQ(w.tensor().data<float>()[0], 0.25f);  // 1 - (0.5 + 0.25)
}

TEST(ParameterServerStrategy, SaveMergesShardsAndRestoreRollsBack) {
  Cluster c(2);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("ps_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  Variable a("a", Tensor::full(Shape{8, 4}, 1.0));
  Variable b("b", Tensor::full(Shape{3}, 2.0));
  std::vector<Variable*> vars = {&a, &b};
  chief.create_variables(vars, {.class_name = "Adam", .name = "", .hyperparameters = {}});
  PullToken t = chief.pull(vars);
  chief.push(t, std::vector<Tensor>{Tensor::ones(Shape{8, 4}), Tensor::ones(Shape{3})});
  chief.save(dir + "/ckpt-1");
  {
    const checkpoint::BundleReader r(dir + "/ckpt-1");
    EXPECT_EQ(r.num_shards(), 2);
    EXPECT_TRUE(r.contains("a"));
    EXPECT_TRUE(r.contains("Adam/m/a"));
    EXPECT_TRUE(r.contains("Adam/v/b"));
    EXPECT_TRUE(r.contains("iteration"));
    EXPECT_NE(r.entry("a").shard_id, r.entry("b").shard_id);
    for (const std::string& k : r.keys()) EXPECT_NO_THROW(r.read(k)) << k;
    EXPECT_EQ(r.read("iteration").data<int64_t>()[0], 1);
  }
  chief.pull(vars);
  const float saved = a.tensor().data<float>()[0];
  t = chief.pull(vars);
  chief.push(t, std::vector<Tensor>{Tensor::ones(Shape{8, 4}), Tensor::ones(Shape{3})});
  chief.pull(vars);
  EXPECT_NE(a.tensor().data<float>()[0], saved);
  chief.restore(dir + "/ckpt-1");
  chief.pull(vars);
  EXPECT_EQ(a.tensor().data<float>()[0], saved);
  EXPECT_THROW(chief.restore(dir + "/missing"), NotFoundError);
  std::filesystem::remove_all(dir);
}

TEST(ClusterCoordinator, RunsClosuresOnWorkersAndJoins) {
  Cluster c(1, 2);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<ParameterServerStrategy>> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(std::make_unique<ParameterServerStrategy>(
        ParameterServerStrategyOptions{.cluster = c.task("worker", w)}));
    workers.back()->register_function("square", [w](std::span<const int64_t> args) {
      EXPECT_GE(ParameterServerStrategy::current_closure_id(), 1);
      return std::vector<double>{static_cast<double>(args[0] * args[0]), static_cast<double>(w)};
    });
    workers.back()->register_function("fail", [](std::span<const int64_t>) -> std::vector<double> {
      throw InvalidArgumentError("bad closure");
    });
    threads.emplace_back([s = workers.back().get()] { s->serve(); });
  }
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  {
    ClusterCoordinator coordinator(chief);
    std::vector<RemoteValue> values;
    for (int64_t i = 0; i < 40; ++i) values.push_back(coordinator.schedule("square", {i}));
    coordinator.join();
    EXPECT_TRUE(coordinator.done());
    for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(values[i].fetch()[0], static_cast<double>(i * i));
    EXPECT_EQ(coordinator.stats().completed, 40);
    RemoteValue bad = coordinator.schedule("fail", {});
    EXPECT_THROW(coordinator.join(), InvalidArgumentError);
    EXPECT_THROW(bad.fetch(), InvalidArgumentError);
    RemoteValue unknown = coordinator.schedule("nope", {});
    EXPECT_THROW(coordinator.join(), NotFoundError);
    coordinator.shutdown_workers();
  }
  for (auto& t : threads) t.join();
  ClusterSpec worker_spec = c.task("worker", 0);
  ParameterServerStrategy worker(ParameterServerStrategyOptions{.cluster = worker_spec});
  EXPECT_THROW(ClusterCoordinator{worker}, FailedPreconditionError);
}

}  // namespace
}  // namespace dtrain::distribute
