// MultiWorkerMirroredStrategy with real processes on loopback: 2 and 3 workers configured through
// TF_CONFIG (the chief serving the rendezvous, a file store, a real redis-server), the data
// split and the all-reduce checked against a single-process run; a peer that never arrives; a
// divergence caught by verify_sync; workers with different float settings; a malformed TF_CONFIG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

using namespace std::chrono_literals;
const std::string kWorker = DTRAIN_DISTRIBUTE_WORKER;

std::string tf_config(const std::vector<int>& ports, bool with_chief, const std::string& type,
                      int index) {
  std::string chief, workers;
  for (size_t i = 0; i < ports.size(); ++i) {
    const std::string a = "\"127.0.0.1:" + std::to_string(ports[i]) + "\"";
    if (with_chief && i == 0) {
      chief = a;
    } else {
      workers += (workers.empty() ? "" : ", ") + a;
    }
  }
  std::string cluster = "\"worker\": [" + workers + "]";
  if (with_chief) cluster = "\"chief\": [" + chief + "], " + cluster;
  return "{\"cluster\": {" + cluster + "}, \"task\": {\"type\": \"" + type +
         "\", \"index\": " + std::to_string(index) + "}}";
}

struct JobRun {
  std::vector<int> codes;
  std::vector<std::string> logs;
  std::vector<std::string> outputs;  // final variables, raw float bytes
};

// Runs `n` workers (TF_CONFIG from free ports; extra env for all) and waits up to 60 s.
JobRun run_workers(int n, bool with_chief, const std::map<std::string, std::string>& extra,
                   const std::vector<std::string>& flags, const std::string& dir) {
  std::vector<int> ports;
  for (int i = 0; i < n; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  JobRun run;
  for (int i = 0; i < n; ++i) {
    std::string type = "worker";
    int index = with_chief ? i - 1 : i;
    if (with_chief && i == 0) {
      type = "chief";
      index = 0;
    }
    auto env = extra;
    env["TF_CONFIG"] = tf_config(ports, with_chief, type, index);
    const std::string out = dir + "/vars" + std::to_string(i);
    std::vector<std::string> argv{kWorker, "--out", out};
    argv.insert(argv.end(), flags.begin(), flags.end());
    procs.push_back(spawn(argv, env, dir + "/log" + std::to_string(i)));
    run.outputs.push_back(out);
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (auto& p : procs) {
    run.codes.push_back(wait_for(p, deadline));
    run.logs.push_back(read_file(p.log));
  }
  for (auto& o : run.outputs) o = read_file(o);
  return run;
}

// The reference: one process, global batch 64, no cluster in the environment.
std::string single_process(const std::string& dir, const std::vector<std::string>& flags = {}) {
  std::vector<std::string> argv{kWorker, "--out", dir + "/single"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  Process p = spawn(argv, {}, dir + "/single.log");
  EXPECT_EQ(wait_for(p, std::chrono::steady_clock::now() + 60s), 0) << read_file(p.log);
  return read_file(dir + "/single");
}

void expect_mirrored_and_close(const JobRun& run, const std::string& reference) {
  for (size_t i = 0; i < run.codes.size(); ++i) {
    ASSERT_EQ(run.codes[i], 0) << "worker " << i << ":\n" << run.logs[i];
  }
  ASSERT_EQ(reference.size(), (8 * 4 + 4) * sizeof(float));
  for (size_t i = 1; i < run.outputs.size(); ++i) {
    EXPECT_EQ(run.outputs[i], run.outputs[0]) << "worker " << i << " is not bitwise identical";
  }
  ASSERT_EQ(run.outputs[0].size(), reference.size());
  std::vector<float> a(reference.size() / 4), b(reference.size() / 4);
  std::memcpy(a.data(), run.outputs[0].data(), reference.size());
  std::memcpy(b.data(), reference.data(), reference.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-5) << "variable element " << k;
}

class MultiWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(MultiWorkerTest, TwoWorkersChiefServesRendezvousAndMatchSingleProcess) {
  const std::string reference = single_process(dir_);
  JobRun run = run_workers(2, /*with_chief=*/false, {}, {"--verify-sync", "4"}, dir_);
  expect_mirrored_and_close(run, reference);
  EXPECT_NE(run.logs[0].find("rank 0 of 2 (TF_CONFIG) done after 16 steps"), std::string::npos)
      << run.logs[0];
}

TEST_F(MultiWorkerTest, ThreeWorkersWithChiefOnFileStoreMatchSingleProcess) {
  const std::string reference = single_process(dir_, {"--global-batch", "60"});
  JobRun run = run_workers(3, /*with_chief=*/true, {{"DTRAIN_RDZV", "file://" + dir_ + "/rdzv"}},
                           {"--verify-sync", "3", "--global-batch", "60"}, dir_);
  expect_mirrored_and_close(run, reference);
}

TEST_F(MultiWorkerTest, TwoWorkersWithTwoLocalReplicasEachMatchSingleProcess) {
  const std::string reference = single_process(dir_);
  JobRun run = run_workers(2, false, {{"DTRAIN_RDZV", "file://" + dir_ + "/rdzv"}},
                           {"--local-replicas", "2", "--verify-sync", "5"}, dir_);
  expect_mirrored_and_close(run, reference);
}

TEST_F(MultiWorkerTest, RendezvousThroughRealRedisServer) {
  if (!std::filesystem::exists("/usr/bin/redis-server")) GTEST_SKIP() << "no redis-server";
  const int port = free_port();
  Process redis = spawn({"/usr/bin/redis-server", "--port", std::to_string(port), "--bind",
                         "127.0.0.1", "--save", "", "--appendonly", "no"},
                        {}, dir_ + "/redis.log");
  std::this_thread::sleep_for(200ms);
  const std::string reference = single_process(dir_);
  JobRun run = run_workers(2, false, {{"DTRAIN_RDZV", "redis://127.0.0.1:" + std::to_string(port)}},
                           {"--verify-sync", "8"}, dir_);
  kill(redis.pid, SIGTERM);
  wait_for(redis, std::chrono::steady_clock::now() + 10s);
  expect_mirrored_and_close(run, reference);
}

TEST_F(MultiWorkerTest, PeerThatNeverArrivesIsAClearTimeout) {
  std::vector<int> ports{free_port(), free_port()};
  Process p = spawn({kWorker, "--timeout-ms", "1500"},
                    {{"TF_CONFIG", tf_config(ports, false, "worker", 0)},
                     {"DTRAIN_RDZV", "file://" + dir_ + "/rdzv"}},
                    dir_ + "/log");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_for(p, start + 60s), 1);  // wait_for kills it (-1) if it hangs
  std::printf("timed out after %.2f s (timeout 1.5 s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  const std::string log = read_file(dir_ + "/log");
  EXPECT_NE(log.find("DEADLINE_EXCEEDED"), std::string::npos) << log;
  EXPECT_NE(log.find("rank(s) 1 that never arrived"), std::string::npos) << log;
}

TEST_F(MultiWorkerTest, VerifySyncNamesTheFirstDivergingVariable) {
  JobRun run = run_workers(2, false, {{"DTRAIN_RDZV", "file://" + dir_ + "/rdzv"}},
                           {"--verify-sync", "2", "--corrupt-step", "3"}, dir_);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(run.codes[i], 1) << run.logs[i];
    EXPECT_NE(run.logs[i].find("error: INTERNAL: verify_sync at step 4: replicas diverged: "
                               "variable 'dense/bias'"),
              std::string::npos)
        << run.logs[i];
    EXPECT_NE(run.logs[i].find("on worker(s) 1"), std::string::npos) << run.logs[i];
  }
}

// Two workers whose floating-point setups differ (one flushes denormals, one does not) would
// round steps differently and drift apart: both refuse to start, naming both fingerprints.
TEST_F(MultiWorkerTest, WorkersWithDifferentFloatSettingsRefuseToStart) {
  std::vector<int> ports{free_port(), free_port()};
  std::vector<Process> procs;
  for (int i = 0; i < 2; ++i) {
    std::map<std::string, std::string> env{{"TF_CONFIG", tf_config(ports, false, "worker", i)},
                                           {"DTRAIN_RDZV", "file://" + dir_ + "/rdzv"}};
    if (i == 1) env["DTRAIN_FLUSH_DENORMALS"] = "0";
    procs.push_back(
        spawn({kWorker, "--timeout-ms", "20000"}, env, dir_ + "/log" + std::to_string(i)));
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(wait_for(procs[i], deadline), 1);
    const std::string log = read_file(procs[i].log);
    EXPECT_NE(log.find("FAILED_PRECONDITION: MultiWorkerMirroredStrategy: workers of one job run "
                       "different builds or settings"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("rank 0 (worker:0) runs \"dtrain "), std::string::npos) << log;
    EXPECT_NE(log.find("flush_denormals=on\" but rank 1 (worker:1) runs \"dtrain "),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("flush_denormals=off\""), std::string::npos) << log;
  }
}

TEST_F(MultiWorkerTest, MalformedTfConfigNamesTheProblem) {
  Process p = spawn({kWorker}, {{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {)"}},
                    dir_ + "/log");
  EXPECT_EQ(wait_for(p, std::chrono::steady_clock::now() + 30s), 1);
  const std::string log = read_file(dir_ + "/log");
  EXPECT_NE(log.find("INVALID_ARGUMENT: TF_CONFIG="), std::string::npos) << log;
  EXPECT_NE(log.find("not valid JSON"), std::string::npos) << log;
}

}  // namespace
}  // namespace dtrain::testing
