// ParameterServer, place_variables, ParameterServerStrategy and ClusterCoordinator in one
// process: servers and workers are threads on loopback ports (the multi-process tests are in
// tests/integration/ps_training_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "testutil/expect_throws.h"
#include "testutil/flip_byte.h"
#include "testutil/free_port.h"
#include "testutil/temp_dir.h"

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
  // Replaces server `i` by a fresh process-like one on the same address (no variables).
  void restart(size_t i) {
    servers[i].reset();
    servers[i] = std::make_unique<ParameterServer>(
        ParameterServerOptions{.address = spec.jobs.at("ps")[i], .sync_to_disk = false});
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
    EXPECT_EQ(r.num_shards(), 3);  // two servers and the chief's position
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

optim::OptimizerConfig adam() {
  return {.class_name = "Adam", .name = "", .hyperparameters = {{"learning_rate", 0.01}}};
}

// A variable set of two variables that place_variables puts on different servers.
struct Model {
  Variable a{"dense/kernel", Tensor::full(Shape{16, 8}, 0.5)};
  Variable b{"dense/bias", Tensor::full(Shape{8}, -0.25)};
  std::vector<Variable*> vars = {&a, &b};
  std::vector<Tensor> values() const { return {a.tensor().clone(), b.tensor().clone()}; }
};

// Gradients that differ from step to step, so that Adam's slots and bias correction matter.
std::vector<Tensor> grads_of_step(int step) {
  Tensor ga(Shape{16, 8}), gb(Shape{8});
  for (int64_t i = 0; i < ga.num_elements(); ++i)
    ga.data<float>()[i] = 0.01f * static_cast<float>((i * 7 + step * 13) % 17) - 0.08f;
  for (int64_t i = 0; i < gb.num_elements(); ++i)
    gb.data<float>()[i] = (step % 2 == 0 ? 0.3f : -0.1f) * static_cast<float>(i + 1);
  return {ga, gb};
}

bool bitwise_equal(const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].nbytes() != y[i].nbytes() ||
        std::memcmp(x[i].raw_data(), y[i].raw_data(), static_cast<size_t>(x[i].nbytes())) != 0)
      return false;
  }
  return true;
}

TEST(ParameterServerStrategy, RecoveredServersContinueExactlyFromTheNewestBackup) {
  Cluster c(2);
  testutil::TempDir dir("ps_backup_test");
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  Model m;
  const std::vector<Tensor> initial = m.values();
  chief.create_variables(m.vars, adam());
  ASSERT_NE(chief.placement()[0].shards[0].ps, chief.placement()[1].shards[0].ps);
  EXPECT_FALSE(chief.restore_latest(dir.path()).has_value());  // nothing saved yet
  auto step = [&](int i) { chief.push(chief.pull(m.vars), grads_of_step(i)); };
  for (int i = 0; i < 3; ++i) step(i);
  chief.save(dir.file("ckpt-1"), {.epoch = 0, .step = 3});
  for (int i = 3; i < 5; ++i) step(i);
  chief.save(dir.file("ckpt-2"), {.epoch = 1, .step = 0});
  {
    // The slots and the iteration count of every shard are in the backup, as the servers hold
    // them: Adam's m and v are non-zero after five updates.
    const checkpoint::BundleReader r(dir.file("ckpt-2"));
    for (const char* key :
         {"Adam/m/dense/kernel", "Adam/v/dense/kernel", "Adam/m/dense/bias", "Adam/v/dense/bias"}) {
      ASSERT_TRUE(r.contains(key)) << key;
      const Tensor t = r.read(key);
      float sum = 0;
      for (int64_t i = 0; i < t.num_elements(); ++i) sum += std::fabs(t.data<float>()[i]);
      EXPECT_GT(sum, 0.0f) << key;
    }
    EXPECT_EQ(r.read("iteration").data<int64_t>()[0], 5);
    EXPECT_EQ(r.read("dtrain/epoch").data<int64_t>()[0], 1);
    EXPECT_EQ(r.read("dtrain/step_in_epoch").data<int64_t>()[0], 0);
  }
  // The reference: the servers go on for three more steps.
  for (int i = 5; i < 8; ++i) step(i);
  chief.pull(m.vars);
  const std::vector<Tensor> expected = m.values();

  // Both servers restart empty; the chief registers its initial values and restores the newest
  // backup, with a damaged state file beside it.
  c.restart(0);
  c.restart(1);
  testutil::write_bytes(dir.file("checkpoint"), "model_checkpoint_path: \"../elsewhere\"\n");
  for (size_t v = 0; v < m.vars.size(); ++v) m.vars[v]->assign(initial[v]);
  const std::optional<ParameterServerCheckpoint> got = chief.recover_latest(m.vars, dir.path());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->prefix, dir.file("ckpt-2"));
  EXPECT_EQ(got->position.epoch, 1);
  EXPECT_EQ(got->position.step, 0);
  for (int i = 5; i < 8; ++i) step(i);
  chief.pull(m.vars);
  EXPECT_TRUE(bitwise_equal(m.values(), expected))
      << "training resumed from the backup diverged from the uninterrupted servers";
}

TEST(ParameterServerStrategy, RestoreLatestSkipsInvalidBackupsAndForeignFiles) {
  Cluster c(2);
  testutil::TempDir dir("ps_latest_test");
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  Model m;
  EXPECT_THROW(chief.restore_latest(dir.path()), FailedPreconditionError);
  chief.create_variables(m.vars, adam());
  EXPECT_FALSE(chief.restore_latest(dir.path() + "/missing").has_value());
  std::vector<std::vector<Tensor>> at;  // the servers' values when ckpt-<i+1> was saved
  const TrainingPosition positions[] = {{0, 4}, {2, 0}, {1, 7}};
  for (int i = 0; i < 3; ++i) {
    chief.push(chief.pull(m.vars), grads_of_step(i));
    chief.pull(m.vars);
    at.push_back(m.values());
    chief.save(dir.file("ckpt-" + std::to_string(i + 1)), positions[i]);
  }
  // An object-graph checkpoint (BackupAndRestore's kind) and a stray file.
  {
    Variable other("other", Tensor::full(Shape{3}, 1.0));
    checkpoint::Checkpoint ckpt({{"other", other}});
    ckpt.write(dir.file("backup-1"));
    testutil::write_bytes(dir.file("junk.index"), "not an index");
  }
  chief.push(chief.pull(m.vars), grads_of_step(9));  // the servers move on

  auto restored_values = [&] {
    chief.pull(m.vars);
    return m.values();
  };
  // The largest position wins, not the newest file: ckpt-2 (epoch 2).
  testing::internal::CaptureStderr();
  std::optional<ParameterServerCheckpoint> got = chief.restore_latest(dir.path());
  std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->prefix, dir.file("ckpt-2"));
  EXPECT_TRUE(bitwise_equal(restored_values(), at[1]));
  EXPECT_NE(err.find("junk"), std::string::npos) << err;

  // A flipped byte in ckpt-2's data: skipped with a warning naming it; ckpt-3 (epoch 1) next.
  const std::string data = checkpoint::data_filename(dir.file("ckpt-2"), 0, 3);
  testutil::flip_byte(data, std::filesystem::file_size(data) / 2);
  testing::internal::CaptureStderr();
  got = chief.restore_latest(dir.path());
  err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->prefix, dir.file("ckpt-3"));
  EXPECT_EQ(got->position.epoch, 1);
  EXPECT_EQ(got->position.step, 7);
  EXPECT_TRUE(bitwise_equal(restored_values(), at[2]));
  EXPECT_NE(err.find("skipping checkpoint " + dir.file("ckpt-2")), std::string::npos) << err;

  // A backup of another model (ckpt-3's kernel reshaped) is not valid for this one.
  {
    ParameterServerStrategy other_chief({.cluster = c.task("chief", 0)});
    Variable wide("dense/kernel", Tensor::full(Shape{16, 9}, 0.5));
    Variable bias("dense/bias", Tensor::full(Shape{8}, -0.25));
    std::vector<Variable*> other_vars = {&wide, &bias};
    other_chief.create_variables(other_vars, adam());
    testing::internal::CaptureStderr();
    got = other_chief.restore_latest(dir.path());
    err = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(got.has_value());
    EXPECT_NE(err.find("[16, 8], this model has float32 [16, 9]"), std::string::npos) << err;
  }
}

// A server that comes back, is registered by recover() and dies again before it holds the
// checkpoint (a crash loop): recover() must notice (a failed restore, or an incarnation that
// changed) and start over until every server holds the checkpoint when it returns.
TEST(ParameterServerStrategy, RecoverStartsOverWhenAServerDiesAgainMidway) {
  Cluster c(2);
  testutil::TempDir dir("ps_bounce_test");
  ParameterServerStrategy chief({.cluster = c.task("chief", 0)});
  ParameterServerStrategy worker({.cluster = c.task("worker", 0)});
  Model m, w;
  chief.create_variables(m.vars, adam());
  worker.attach_variables(w.vars);
  for (int i = 0; i < 2; ++i) worker.push(worker.pull(w.vars), grads_of_step(i));
  chief.save(dir.file("ckpt-1"), {.epoch = 0, .step = 2});
  chief.pull(m.vars);
  const std::vector<Tensor> saved = m.values();
  int killed_midway = 0;
  for (int trial = 0; trial < 5 && killed_midway == 0; ++trial) {
    worker.push(worker.pull(w.vars), grads_of_step(2 + trial));  // away from the checkpoint
    c.servers[1].reset();
    std::atomic<bool> returned{false};
    bool killed = false;
    std::thread crash_loop([&] {
      std::this_thread::sleep_for(milliseconds(100));
      c.restart(1);
      // The moment recover() has registered the variables on it, the server dies again.
      while (!c.servers[1]->stats().initialized) std::this_thread::yield();
      if (returned) return;  // recover() was quicker than this thread; try again
      c.servers[1].reset();
      killed = true;
      std::this_thread::sleep_for(milliseconds(100));
      c.restart(1);
    });
    testing::internal::CaptureStderr();
    try {
      chief.recover(m.vars, dir.file("ckpt-1"));
    } catch (const Error& e) {
      ADD_FAILURE() << "recover: " << e.what();
    }
    returned = true;
    crash_loop.join();
    const std::string err = testing::internal::GetCapturedStderr();
    if (killed && !c.servers[1]->stats().initialized) {
      // Killed only after recover() had returned (this thread was descheduled): not the case
      // under test; make the servers whole again and try once more.
      chief.recover(m.vars, dir.file("ckpt-1"));
      continue;
    }
    if (killed) {
      ++killed_midway;
      EXPECT_NE(err.find("retrying"), std::string::npos) << err;
    }
    // The worker's next pull sees the checkpoint on both servers.
    worker.pull(w.vars);
    EXPECT_TRUE(bitwise_equal(w.values(), saved));
    for (const ParameterServerStats& st : chief.server_stats()) EXPECT_TRUE(st.initialized);
  }
  EXPECT_EQ(killed_midway, 1) << "the server never died during a recover() in five trials";
}

TEST(ParameterServerStrategy, RecoverGivesUpNamingTheServerThatStaysAway) {
  Cluster c(2);
  ParameterServerStrategy chief(
      {.cluster = c.task("chief", 0), .connect_timeout = milliseconds(800)});
  Model m;
  chief.create_variables(m.vars, adam());
  c.servers[1].reset();
  testing::internal::CaptureStderr();
  testutil::expect_throws_with<UnavailableError>(
      [&] { chief.recover(m.vars, ""); },
      {"ParameterServerStrategy::recover", "did not all come back within 800 ms",
       c.spec.jobs["ps"][1]});
  testing::internal::GetCapturedStderr();
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
