// dtrain launch with its coordination state in a real etcd (started by the test on 127.0.0.1,
// free ports, a private data directory): no node is special, so SIGKILL of the launcher that was
// started first (node 0, with its worker) leaves node 1's launcher running; it forms the next
// generation alone (--nnodes 1:2), its worker resumes from the checkpoint and trains on, and a
// relaunched node 0 is admitted back and the job finishes on both. Real processes (launch_worker,
// Gloo all-reduce every step); every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/summary/event_log.h"
#include "testutil/etcd_server.h"
#include "testutil/free_port.h"
#include "testutil/launcher_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using json = nlohmann::json;
using Launcher = dtrain::testutil::LauncherProcess;
using Outcome = dtrain::testutil::LaunchOutcome;

class LaunchEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dtrain::testutil::have_etcd()) {
      GTEST_SKIP() << "no " << dtrain::testutil::kEtcdBinary << " (Debian package etcd-server)";
    }
    etcd_ = std::make_unique<dtrain::testutil::EtcdServer>();
    dir_ = dtrain::testutil::make_temp_dir("dtrain_launch_etcd");
    fs::create_directories(dir_ + "/work");
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  // Flags of node `node` of an elastic two-node job on etcd, one worker each.
  std::vector<std::string> node_args(int node, int steps) const {
    return {"--nnodes",
            "1:2",
            "--node-rank",
            std::to_string(node),
            "--nproc-per-node",
            "1",
            "--rdzv",
            etcd_->url(),
            "--rdzv-timeout",
            "60",
            "--rdzv-settle",  // room for the running node to see a relaunched one and join it
            "2",
            "--max-restarts",
            "3",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "3",
            "--grace-period",
            "1",
            "--event-log",
            dir_ + "/events" + std::to_string(node) + ".jsonl",
            "--",
            DTRAIN_LAUNCH_WORKER,
            "--dir",
            dir_ + "/work",
            "--steps",
            std::to_string(steps),
            "--step-ms",
            "20",
            "--ckpt-every",
            "10",
            "--collective"};
  }

  std::vector<json> events(int node, const std::string& kind) const {
    std::vector<json> out;
    for (const auto& line :
         dtrain::summary::read_event_log(dir_ + "/events" + std::to_string(node) + ".jsonl")) {
      json e = json::parse(line);
      if (e["kind"] == kind) out.push_back(std::move(e));
    }
    return out;
  }

  std::unique_ptr<dtrain::testutil::EtcdServer> etcd_;
  std::string dir_;
};

TEST_F(LaunchEtcdTest, TheJobSurvivesKillingTheLauncherThatStartedFirst) {
  constexpr int kSteps = 300;
  auto n0 = std::make_unique<Launcher>(node_args(0, kSteps), dir_ + "/out0");
  ASSERT_TRUE(n0->wait_for_output("coordination state in " + etcd_->url(), 1, 60s)) << n0->output();
  Launcher n1(node_args(1, kSteps), dir_ + "/out1");
  ASSERT_FALSE(n1.wait_for("\\[rank 1\\] at step 20 rank 1 gen 1\\b", 90s).empty())
      << n1.output() << "\nnode 0:\n"
      << n0->output();

  // Node 0's host is gone: its launcher dies, and its worker with it (parent-death signal).
  ASSERT_EQ(::kill(n0->pid(), SIGKILL), 0);
  const Outcome killed = n0->wait(30s);
  EXPECT_EQ(killed.code, 128 + SIGKILL) << killed.output;

  // Node 1 goes on alone: generation 2, world size 1, its worker is rank 0 now and resumes from
  // the checkpoint node 0's worker wrote (step 20 or later), not from the start.
  const auto alone = n1.wait_for("\\[rank 0\\] at step (\\d+) rank 0 gen 2\\b", 90s);
  ASSERT_FALSE(alone.empty()) << n1.output();
  const auto restarts = events(1, "restart");
  ASSERT_GE(restarts.size(), 1u) << n1.output();
  EXPECT_EQ(restarts[0]["world_size"], 1) << restarts[0].dump();
  std::vector<json> resumed;  // recorded at the launcher's next look at the workers' reports
  for (auto deadline = std::chrono::steady_clock::now() + 60s;
       resumed.empty() && std::chrono::steady_clock::now() < deadline;
       std::this_thread::sleep_for(50ms)) {
    resumed = events(1, "resumed");
  }
  ASSERT_GE(resumed.size(), 1u) << n1.output();
  EXPECT_GE(resumed[0]["resumed_step"].get<int64_t>(), 20) << resumed[0].dump();

  // Node 0 comes back (a fresh launcher on the same node rank): admitted, and the job finishes
  // on both nodes.
  n0 = std::make_unique<Launcher>(node_args(0, kSteps), dir_ + "/out0b");
  const Outcome r1 = n1.wait(120s);
  const Outcome r0 = n0->wait(60s);
  ASSERT_EQ(r1.code, 0) << r1.output << "\nrelaunched node 0:\n" << r0.output;
  ASSERT_EQ(r0.code, 0) << r0.output << "\nnode 1:\n" << r1.output;
  EXPECT_NE(r1.output.find("DONE rank 1 world 2 gen "), std::string::npos) << r1.output;
  EXPECT_NE(r1.output.find(" step " + std::to_string(kSteps)), std::string::npos) << r1.output;
  EXPECT_NE(r0.output.find("DONE rank 0 world 2 gen "), std::string::npos) << r0.output;
}

// No etcd at the URL: the launcher says so, naming the endpoint, and exits with UNAVAILABLE (5)
// after the store's connect timeout instead of waiting for --rdzv-timeout; a malformed URL is a
// usage error naming it.
TEST(LaunchEtcdErrorsTest, UnreachableEtcdIsAClearErrorNotAHang) {
  const std::string dir = dtrain::testutil::make_temp_dir("dtrain_launch_etcd_down");
  const std::string endpoint = "127.0.0.1:" + std::to_string(dtrain::testutil::free_port());
  const std::vector<std::string> job = {"--nnodes",       "1:2", "--node-rank",    "0",
                                        "--max-restarts", "1",   "--rdzv-timeout", "600",
                                        "--rdzv"};
  std::vector<std::string> down = job;
  down.insert(down.end(), {"etcd://" + endpoint, "--", "true"});
  Launcher l(down, dir + "/out");
  const Outcome r = l.wait(120s);
  EXPECT_EQ(r.code, 5) << r.output;
  EXPECT_NE(r.output.find("UNAVAILABLE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(endpoint), std::string::npos) << r.output;

  std::vector<std::string> bad = job;
  bad.insert(bad.end(), {"etcd://h:port", "--", "true"});
  Launcher m(bad, dir + "/out2");
  const Outcome rm = m.wait(60s);
  EXPECT_EQ(rm.code, 2) << rm.output;
  EXPECT_NE(rm.output.find("'etcd://h:port'"), std::string::npos) << rm.output;
  fs::remove_all(dir);
}

}  // namespace
