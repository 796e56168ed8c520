// ParameterServerStrategy with real processes: ps_worker tasks (2 ps, 2 workers, a chief) on
// loopback train Fashion-MNIST asynchronously; a worker and a server are killed with SIGKILL and
// restarted mid-training; synchronous mode is compared with MultiWorkerMirroredStrategy; bad
// clusters and models fail with clear errors. Every process has a hard deadline.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "distribute_process.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/distribute/parameter_server_strategy.h"

namespace dtrain::testing {
namespace {

using std::chrono::seconds;

struct Job {
  std::string dir = make_temp_dir();
  std::vector<int> ps_ports, worker_ports;
  int chief_port = free_port();
  std::vector<Process> ps, workers;
  Process chief;

  Job(int num_ps, int num_workers) {
    for (int i = 0; i < num_ps; ++i) ps_ports.push_back(free_port());
    for (int i = 0; i < num_workers; ++i) worker_ports.push_back(free_port());
  }
  ~Job() {
    for (auto* group : {&ps, &workers}) {
      for (Process& p : *group) {
        if (p.pid > 0) {
          kill(p.pid, SIGKILL);
          wait_for(p, std::chrono::steady_clock::now());
        }
      }
    }
    if (chief.pid > 0) {
      kill(chief.pid, SIGKILL);
      wait_for(chief, std::chrono::steady_clock::now());
    }
    std::filesystem::remove_all(dir);
  }

  static std::string list(const std::vector<int>& ports) {
    std::string s;
    for (int p : ports)
      s += (s.empty() ? "\"127.0.0.1:" : ",\"127.0.0.1:") + std::to_string(p) + "\"";
    return s;
  }
  std::string tf_config(const std::string& type, int index, bool with_ps = true) const {
    std::string cluster = "{\"chief\":[\"127.0.0.1:" + std::to_string(chief_port) +
                          "\"],\"worker\":[" + list(worker_ports) + "]";
    if (with_ps) cluster += ",\"ps\":[" + list(ps_ports) + "]";
    cluster += "}";
    return "{\"cluster\":" + cluster + ",\"task\":{\"type\":\"" + type +
           "\",\"index\":" + std::to_string(index) + "}}";
  }
  Process start(const std::string& type, int index, const std::vector<std::string>& args,
                bool with_ps = true) {
    std::vector<std::string> argv = {DTRAIN_PS_WORKER};
    argv.insert(argv.end(), args.begin(), args.end());
    return spawn(argv, {{"TF_CONFIG", tf_config(type, index, with_ps)}},
                 dir + "/" + type + std::to_string(index) + ".log");
  }
  void start_all(const std::vector<std::string>& args) {
    for (size_t i = 0; i < ps_ports.size(); ++i) ps.push_back(start("ps", static_cast<int>(i), {}));
    for (size_t i = 0; i < worker_ports.size(); ++i) {
      workers.push_back(start("worker", static_cast<int>(i), args));
    }
    chief = start("chief", 0, args);
  }
  int wait_chief(int limit_s = 120) {
    return wait_for(chief, std::chrono::steady_clock::now() + seconds(limit_s));
  }
  std::string chief_log() const { return read_file(dir + "/chief0.log"); }
};

double number_after(const std::string& log, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(key + " ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

TEST(PsTraining, AsyncTwoServersTwoWorkersReachTestAccuracy) {
  Job job(2, 2);
  job.start_all({"--mode", "async", "--epochs", "2"});
  ASSERT_EQ(job.wait_chief(), 0) << job.chief_log();
  const std::string log = job.chief_log();
  EXPECT_GE(number_after(log, "test_accuracy"), 0.85) << log;
  EXPECT_NE(log.find("ps versions: 3750 3750"), std::string::npos) << log;
  EXPECT_GE(number_after(log, "staleness_mean"), 0.0) << log;
}

TEST(PsTraining, KilledWorkerLosesNoStepAndRejoins) {
  Job job(2, 2);
  const std::vector<std::string> args = {"--mode", "async", "--epochs", "2"};
  job.start_all(args);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ASSERT_GT(job.workers[1].pid, 0);
  kill(job.workers[1].pid, SIGKILL);
  wait_for(job.workers[1], std::chrono::steady_clock::now() + seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  job.workers[1] = job.start("worker", 1, args);  // rejoins
  ASSERT_EQ(job.wait_chief(), 0) << job.chief_log();
  const std::string log = job.chief_log();
  // Every scheduled step was applied exactly once on every server.
  EXPECT_NE(log.find("ps versions: 3750 3750"), std::string::npos) << log;
  EXPECT_NE(log.find("3750 closures on 2 workers"), std::string::npos) << log;
  EXPECT_NE(log.find("lost"), std::string::npos) << log;
  EXPECT_GE(number_after(log, "test_accuracy"), 0.8) << log;
}

TEST(PsTraining, KilledServerIsRestoredFromCheckpoint) {
  Job job(2, 2);
  const std::string ckpt = job.dir + "/ckpt";
  job.start_all({"--mode", "async", "--epochs", "2", "--ckpt", ckpt, "--ckpt-every", "256"});
  // Kill once training runs and a checkpoint exists (a fixed delay may land before the chief
  // has even registered the variables on a loaded machine).
  const auto deadline = std::chrono::steady_clock::now() + seconds(120);
  while (!std::filesystem::exists(ckpt + "/ckpt-1.index") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/ckpt-1.index")) << job.chief_log();
  kill(job.ps[1].pid, SIGKILL);
  wait_for(job.ps[1], std::chrono::steady_clock::now() + seconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  job.ps[1] = job.start("ps", 1, {});
  // Two epochs plus a recovery take ~25 s idle and over 120 s at a load of 20 on 2 cores.
  ASSERT_EQ(job.wait_chief(/*limit_s=*/270), 0) << job.chief_log();
  const std::string log = job.chief_log();
  EXPECT_NE(log.find("restoring every server from"), std::string::npos) << log;
  // From the backup the servers wrote (with their optimizer slots), not from scratch.
  EXPECT_EQ(log.find("restoring every server from the initial values"), std::string::npos) << log;
  EXPECT_NE(log.find("ps versions:"), std::string::npos) << log;
  EXPECT_GE(number_after(log, "test_accuracy"), 0.8) << log;
  // The last merged checkpoint: one index over both servers' shards, every tensor's CRC good.
  const auto latest = checkpoint::latest_checkpoint(ckpt);
  ASSERT_TRUE(latest.has_value());
  const checkpoint::BundleReader reader(*latest);
  EXPECT_EQ(reader.num_shards(), 3);  // two servers and the chief's position
  int shard1 = 0;
  for (const std::string& key : reader.keys()) {
    EXPECT_NO_THROW(reader.read(key)) << key;
    shard1 += reader.entry(key).shard_id == 1;
  }
  EXPECT_GT(shard1, 0);
  EXPECT_TRUE(reader.contains("iteration"));
  EXPECT_TRUE(reader.contains("dense/kernel"));
  EXPECT_TRUE(reader.contains("Adam/m/dense/kernel"));
}

// The chief's recovery after a server's SIGKILL, with the chief and a worker in this process and
// the servers as ps_worker processes: recover() is called the moment the server is dead and must
// wait for its restart and leave every server holding the checkpoint; a worker whose channel to
// the lost server is in gRPC's reconnect backoff pulls at once afterwards (no sleep in between).
TEST(PsRecovery, RecoverRightAfterAKillWaitsForTheRestartedServer) {
  Job job(2, 1);
  for (int i = 0; i < 2; ++i) job.ps.push_back(job.start("ps", i, {}));
  auto spec = [&](const std::string& type) {
    distribute::ClusterSpec s;
    s.source = "test";
    s.jobs["chief"] = {"127.0.0.1:" + std::to_string(job.chief_port)};
    s.jobs["worker"] = {"127.0.0.1:" + std::to_string(job.worker_ports[0])};
    for (int p : job.ps_ports) s.jobs["ps"].push_back("127.0.0.1:" + std::to_string(p));
    s.task_type = type;
    return s;
  };
  distribute::ParameterServerStrategy chief({.cluster = spec("chief")});
  distribute::ParameterServerStrategy worker({.cluster = spec("worker")});
  auto make_vars = [](std::vector<std::unique_ptr<Variable>>& own) {
    own.push_back(std::make_unique<Variable>("a", Tensor::full(Shape{64, 32}, 0.5)));
    own.push_back(std::make_unique<Variable>("b", Tensor::full(Shape{48, 16}, -0.25)));
    std::vector<Variable*> out;
    for (auto& v : own) out.push_back(v.get());
    return out;
  };
  std::vector<std::unique_ptr<Variable>> chief_own, worker_own;
  const std::vector<Variable*> vars = make_vars(chief_own), wvars = make_vars(worker_own);
  std::vector<Tensor> initial;
  for (Variable* v : vars) initial.push_back(v->tensor().clone());
  chief.create_variables(vars, {.class_name = "Adam", .name = "", .hyperparameters = {}});
  worker.attach_variables(wvars);
  ASSERT_NE(chief.placement()[0].shards[0].ps, chief.placement()[1].shards[0].ps);
  const std::vector<Tensor> grads = {Tensor::full(Shape{64, 32}, 0.125),
                                     Tensor::full(Shape{48, 16}, -1.0)};
  for (int i = 0; i < 3; ++i) worker.push(worker.pull(wvars), grads);
  const std::string prefix = job.dir + "/ckpt/ckpt-1";
  chief.save(prefix);
  chief.pull(vars);
  std::vector<Tensor> saved;
  for (Variable* v : vars) saved.push_back(v->tensor().clone());
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    worker.push(worker.pull(wvars), grads);  // the servers move past the checkpoint
    kill(job.ps[1].pid, SIGKILL);
    wait_for(job.ps[1], std::chrono::steady_clock::now() + seconds(5));
    // The worker notices the loss (its channel to the server goes into reconnect backoff).
    EXPECT_THROW(worker.push(worker.pull(wvars), grads), UnavailableError);
    std::thread restart([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      job.ps[1] = job.start("ps", 1, {});
    });
    for (size_t v = 0; v < vars.size(); ++v) vars[v]->assign(initial[v]);
    const auto start = std::chrono::steady_clock::now();
    try {
      chief.recover(vars, prefix);
    } catch (const Error& e) {
      restart.join();
      FAIL() << "recover: " << e.what();
    }
    restart.join();
    std::printf("round %d: recover took %.0f ms\n", round,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count());
    // At once: the worker's pull reaches the restarted server and sees the checkpoint.
    ASSERT_NO_THROW(worker.pull(wvars));
    for (size_t v = 0; v < vars.size(); ++v) {
      ASSERT_EQ(std::memcmp(wvars[v]->tensor().raw_data(), saved[v].raw_data(),
                            static_cast<size_t>(saved[v].nbytes())),
                0)
          << wvars[v]->name();
    }
    for (const auto& st : chief.server_stats()) EXPECT_TRUE(st.initialized);
  }
}

// A job started again on the directory of a finished one continues from the servers' newest
// backup (epoch 2 of 2) instead of starting over.
TEST(PsTraining, ANewJobResumesFromTheNewestServerBackup) {
  const std::string root = make_temp_dir();  // outlives the first job's directory
  const std::string ckpt = root + "/ckpt";
  {
    Job first(1, 1);
    first.start_all({"--mode", "async", "--epochs", "1", "--ckpt", ckpt});
    ASSERT_EQ(first.wait_chief(/*limit_s=*/270), 0) << first.chief_log();
    EXPECT_EQ(first.chief_log().find("resumed the parameter servers"), std::string::npos);
  }
  Job second(1, 1);
  second.start_all({"--mode", "async", "--epochs", "2", "--ckpt", ckpt});
  ASSERT_EQ(second.wait_chief(/*limit_s=*/270), 0) << second.chief_log();
  const std::string log = second.chief_log();
  EXPECT_NE(log.find("resumed the parameter servers from " + ckpt + "/ckpt-1 at epoch 2, step 0"),
            std::string::npos)
      << log;
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/ckpt-2.index")) << "numbering continues";
  EXPECT_GE(number_after(log, "test_accuracy"), 0.8) << log;
  std::filesystem::remove_all(root);
}

TEST(PsTraining, SynchronousMatchesMultiWorkerMirrored) {
  const std::vector<std::string> common = {"--epochs", "1", "--steps", "60", "--batch", "64"};
  std::string ps_out, mw_out;
  Job ps_job(1, 2);
  {
    auto args = common;
    args.insert(args.end(), {"--mode", "sync", "--out", ps_job.dir + "/w.bin"});
    ps_job.start_all(args);
    ASSERT_EQ(ps_job.wait_chief(), 0) << ps_job.chief_log();
    ps_out = ps_job.dir + "/w.bin";
  }
  Job mw_job(0, 1);  // chief + one worker, all-reducing
  {
    auto args = common;
    args.insert(args.end(), {"--mode", "mwms", "--out", mw_job.dir + "/w.bin"});
    mw_job.workers.push_back(mw_job.start("worker", 0, args, false));
    mw_job.chief = mw_job.start("chief", 0, args, false);
    ASSERT_EQ(mw_job.wait_chief(), 0) << mw_job.chief_log();
    mw_out = mw_job.dir + "/w.bin";
  }
  const std::vector<float> a = read_floats(ps_out), b = read_floats(mw_out);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 100000u);
  double max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_diff = std::max<double>(max_diff, std::fabs(a[i] - b[i]));
  EXPECT_LT(max_diff, 1e-5);
}

TEST(PsTraining, UnreachableServerIsAClearError) {
  Job job(1, 1);  // the ps task is never started
  job.workers.push_back(job.start("worker", 0, {"--steps", "5"}));
  job.chief = job.start("chief", 0, {"--steps", "5", "--connect-timeout-ms", "1500"});
  EXPECT_EQ(job.wait_chief(60), 1);
  const std::string log = job.chief_log();
  EXPECT_NE(log.find("error: UNAVAILABLE"), std::string::npos) << log;
  EXPECT_NE(log.find("127.0.0.1:" + std::to_string(job.ps_ports[0])), std::string::npos) << log;
}

TEST(PsTraining, ClusterWithoutServersIsAClearError) {
  Job job(0, 1);
  job.chief = job.start("chief", 0, {"--steps", "5"}, /*with_ps=*/false);
  EXPECT_EQ(job.wait_chief(60), 1);
  EXPECT_NE(job.chief_log().find("has no \"ps\" job"), std::string::npos) << job.chief_log();
}

TEST(PsTraining, WorkerWithAnotherModelIsAClearError) {
  Job job(1, 1);
  job.ps.push_back(job.start("ps", 0, {}));
  job.workers.push_back(job.start("worker", 0, {"--steps", "5", "--hidden", "64"}));
  job.chief = job.start("chief", 0, {"--steps", "5", "--hidden", "128"});
  EXPECT_EQ(job.wait_chief(60), 1);
  const std::string log = job.chief_log();
  EXPECT_NE(log.find("error: INVALID_ARGUMENT"), std::string::npos) << log;
  EXPECT_NE(log.find("[784, 64] on the worker but float32 [784, 128]"), std::string::npos) << log;
}

// BatchNormalization's moving statistics would stay on the workers (the servers hold trainable
// variables only): fit refuses it, naming the layer.
TEST(PsTraining, BatchNormalizationIsAClearError) {
  Job job(1, 1);
  job.ps.push_back(job.start("ps", 0, {}));
  job.workers.push_back(job.start("worker", 0, {"--steps", "5", "--bn", "1"}));
  job.chief = job.start("chief", 0, {"--steps", "5", "--bn", "1"});
  EXPECT_EQ(job.wait_chief(60), 1);
  const std::string log = job.chief_log();
  EXPECT_NE(log.find("error: UNIMPLEMENTED"), std::string::npos) << log;
  EXPECT_NE(log.find("BatchNormalization 'batch_normalization'"), std::string::npos) << log;
  EXPECT_NE(log.find("ParameterServerStrategy"), std::string::npos) << log;
}

}  // namespace
}  // namespace dtrain::testing
