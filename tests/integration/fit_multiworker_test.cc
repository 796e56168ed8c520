// Model::fit under MirroredStrategy and MultiWorkerMirroredStrategy, with real processes on
// loopback: every worker ends with bitwise-identical variables, and the result matches one
// process training on the same global batches within float tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "distribute_process.h"
#include "testutil/etcd_server.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

std::vector<float> floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

// Runs the worker program once per process; returns each process's output file contents.
std::vector<std::string> run(const std::string& dir, const std::string& mode, int processes,
                             std::vector<std::string> extra = {},
                             const std::map<std::string, std::string>& extra_env = {}) {
  std::vector<int> ports;
  for (int i = 0; i < processes; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < processes; ++i) {
    std::vector<std::string> argv = {kWorker, "--mode", mode, "--out",
                                     dir + "/" + mode + std::to_string(i) + ".bin"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::map<std::string, std::string> env = extra_env;
    if (mode == "multi-worker") env["TF_CONFIG"] = tf_config(ports, i);
    procs.push_back(spawn(argv, env, dir + "/" + mode + std::to_string(i) + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  std::vector<std::string> outs;
  for (int i = 0; i < processes; ++i) {
    const int code = wait_for(procs[i], deadline);
    EXPECT_EQ(code, 0) << mode << " process " << i << ":\n" << read_file(procs[i].log);
    outs.push_back(read_file(dir + "/" + mode + std::to_string(i) + ".bin"));
  }
  return outs;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(double{b[i]})));
  }
  return worst;
}

class FitMultiWorker : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    single_ = floats(run(dir_, "single", 1)[0]);
    ASSERT_FALSE(single_.empty());
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
  std::vector<float> single_;
};

TEST_F(FitMultiWorker, MirroredTwoReplicasMatchesOneProcess) {
  const auto out = run(dir_, "mirrored", 1, {"--replicas", "2"});
  const auto w = floats(out[0]);
  ASSERT_EQ(w.size(), single_.size());
  EXPECT_LT(max_relative_difference(w, single_), 1e-4);
}

TEST_F(FitMultiWorker, TwoWorkersAreIdenticalAndMatchOneProcess) {
  const auto out = run(dir_, "multi-worker", 2, {"--verify-sync", "5"});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_FALSE(out[0].empty());
  EXPECT_EQ(out[0], out[1]) << "workers' variables differ";
  // 384 examples x 2 epochs, split evenly: each worker computed on half of every batch.
  EXPECT_NE(read_file(dir_ + "/multi-worker0.log").find("rows 384 of 768, replicas in sync 2"),
            std::string::npos)
      << read_file(dir_ + "/multi-worker0.log");
  const auto w = floats(out[0]);
  ASSERT_EQ(w.size(), single_.size());
  EXPECT_LT(max_relative_difference(w, single_), 1e-4);
}

// The same job rendezvousing through a real etcd instead of the chief's coordination service
// ends with the same bits: the store only carries the Gloo rendezvous.
TEST_F(FitMultiWorker, TwoWorkersRendezvousingOverEtcdMatchTheCoordinationService) {
  if (!testutil::have_etcd()) {
    GTEST_SKIP() << "no " << testutil::kEtcdBinary << " (Debian package etcd-server)";
  }
  testutil::EtcdServer etcd;
  const auto over_etcd = run(dir_, "multi-worker", 2, {}, {{"DTRAIN_RDZV", etcd.url()}});
  EXPECT_NE(read_file(dir_ + "/multi-worker0.log").find("rows 384 of 768"), std::string::npos)
      << read_file(dir_ + "/multi-worker0.log");
  const auto over_service = run(dir_, "multi-worker", 2);
  ASSERT_EQ(over_etcd.size(), 2u);
  ASSERT_FALSE(over_etcd[0].empty());
  EXPECT_EQ(over_etcd[0], over_etcd[1]) << "workers' variables differ";
  EXPECT_EQ(over_etcd[0], over_service[0]) << "etcd and the coordination service trained apart";
}

// SyncBatchNormalization: 2 workers × 32 rows train as BatchNormalization on one process with
// batch 64 (the moments, their backward and the moving statistics are the global batch's).
TEST_F(FitMultiWorker, SyncBatchNormTwoWorkersMatchOneProcessWithTheGlobalBatch) {
  const std::vector<std::string> flags = {"--sync-bn", "1", "--batch-size", "64"};
  const auto single = floats(run(dir_, "single", 1, flags)[0]);
  const auto out = run(dir_, "multi-worker", 2, flags);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_FALSE(out[0].empty());
  EXPECT_EQ(out[0], out[1]) << "workers' variables differ";
  const auto w = floats(out[0]);
  ASSERT_EQ(w.size(), single.size());
  EXPECT_LT(max_relative_difference(w, single), 1e-4);
}

// The same for a Functional residual CNN (Conv2D → SyncBN → ReLU blocks, an Add() skip,
// GlobalAveragePooling2D): three synchronized BN layers, their moving statistics included.
TEST_F(FitMultiWorker, SyncBatchNormResidualCnnTwoWorkersMatchOneProcessWithTheGlobalBatch) {
  const std::vector<std::string> flags = {"--resnet", "1", "--batch-size", "64"};
  const auto single = floats(run(dir_, "single", 1, flags)[0]);
  const auto out = run(dir_, "multi-worker", 2, flags);
  ASSERT_EQ(out.size(), 2u);
  ASSERT_FALSE(out[0].empty());
  EXPECT_EQ(out[0], out[1]) << "workers' variables differ";
  EXPECT_NE(read_file(dir_ + "/multi-worker0.log").find("rows 384 of 768, replicas in sync 2"),
            std::string::npos)
      << read_file(dir_ + "/multi-worker0.log");
  const auto w = floats(out[0]);
  ASSERT_EQ(w.size(), single.size());
  EXPECT_LT(max_relative_difference(w, single), 1e-4);
}

TEST_F(FitMultiWorker, ThreeWorkersWithTwoReplicasEachAreIdentical) {
  const auto out = run(dir_, "multi-worker", 3, {"--replicas", "2"});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);
  // 32-row batches over 6 replicas: 6,6,5,5,5,5 rows, so worker 0 (replicas 0, 1) takes 12.
  EXPECT_NE(read_file(dir_ + "/multi-worker0.log").find("rows 288 of 768, replicas in sync 6"),
            std::string::npos)
      << read_file(dir_ + "/multi-worker0.log");
  const auto w = floats(out[0]);
  ASSERT_EQ(w.size(), single_.size());
  EXPECT_LT(max_relative_difference(w, single_), 1e-4);
}

}  // namespace
}  // namespace dtrain::testing
