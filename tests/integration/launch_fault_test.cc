// dtrain launch keeps a job alive through failures: real processes (launch_worker), real
// signals. A worker killed with SIGKILL or stopped with SIGSTOP is detected (exit, watchdog,
// heartbeat), the group restarts under a new generation and resumes from its checkpoint; a slot
// that keeps failing is excluded; --max-restarts is respected; preemption codes pass through;
// the event log and the TensorBoard file say what happened. Every wait is bounded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/summary/event_log.h"
#include "dtrain/summary/event_reader.h"

extern char** environ;

#include "testutil/free_port.h"
#include "testutil/launcher_process.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

using dtrain::testutil::free_port;
using Outcome = dtrain::testutil::LaunchOutcome;
using Launcher = dtrain::testutil::LauncherProcess;

class LaunchFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dtrain_launch_fault_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Launcher flags common to the tests, then `extra`, then the worker's command line.
  std::vector<std::string> args(const std::vector<std::string>& extra,
                                const std::vector<std::string>& worker_args) const {
    std::vector<std::string> a = {"--grace-period", "1",
                                  "--event-log",    (dir_ / "events.jsonl").string(),
                                  "--logdir",       (dir_ / "tb").string()};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back("--");
    a.push_back(DTRAIN_LAUNCH_WORKER);
    a.push_back("--dir");
    a.push_back((dir_ / "work").string());
    a.insert(a.end(), worker_args.begin(), worker_args.end());
    return a;
  }

  // Flags of node `node` of a two-node job on `rdzv`, with its own event log. `settle`: how long
  // a membership round waits for more nodes once the minimum is there.
  std::vector<std::string> node_args(int node, const std::string& rdzv, const std::string& nnodes,
                                     const std::vector<std::string>& extra,
                                     const std::vector<std::string>& worker_args,
                                     const std::string& settle = "0.5") const {
    std::vector<std::string> a = {"--nnodes",      nnodes, "--node-rank",    std::to_string(node),
                                  "--rdzv",        rdzv,   "--rdzv-timeout", "30",
                                  "--rdzv-settle", settle};
    a.insert(a.end(), extra.begin(), extra.end());
    a = args(a, worker_args);
    for (auto& x : a) {
      if (x == (dir_ / "events.jsonl").string())
        x = (dir_ / ("events" + std::to_string(node) + ".jsonl")).string();
      if (x == (dir_ / "tb").string()) x = (dir_ / ("tb" + std::to_string(node))).string();
    }
    return a;
  }

  std::vector<json> events(const std::string& name = "events.jsonl") const {
    std::vector<json> out;
    for (const auto& line : dtrain::summary::read_event_log((dir_ / name).string())) {
      out.push_back(json::parse(line));
    }
    return out;
  }
  static std::vector<json> of_kind(const std::vector<json>& all, const std::string& kind) {
    std::vector<json> out;
    for (const auto& e : all) {
      if (e["kind"] == kind) out.push_back(e);
    }
    return out;
  }
  // Text entries and scalars of the launcher's TensorBoard file.
  void tensorboard(std::vector<std::string>& texts,
                   std::vector<std::pair<std::string, double>>& scalars) const {
    for (const auto& f : fs::directory_iterator(dir_ / "tb" / "launcher")) {
      for (const auto& ev : dtrain::summary::read_events(f.path().string())) {
        for (const auto& v : ev.values) {
          if (v.metadata.plugin_name == "text") texts.push_back(v.text());
          if (v.is_scalar()) scalars.emplace_back(v.tag, v.value);
        }
      }
    }
  }

  fs::path dir_;
};

// The worker pid of `rank` in generation `gen`, from its "pid P rank R gen G" line.
pid_t worker_pid(Launcher& l, int rank, int gen) {
  const auto m = l.wait_for("\\[rank " + std::to_string(rank) + "\\] pid (\\d+) rank " +
                            std::to_string(rank) + " gen " + std::to_string(gen) + "\\b");
  return m.empty() ? -1 : std::stoi(m[1]);
}

TEST_F(LaunchFaultTest, AWorkerKilledWithSigkillRestartsTheGroupAndTheJobCompletes) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "2"},
                  {"--steps", "60", "--step-ms", "20", "--ckpt-every", "10", "--collective"}),
             dir_ / "out");
  const pid_t victim = worker_pid(l, 1, 1);
  ASSERT_GT(victim, 0) << l.output();
  ASSERT_FALSE(l.wait_for("\\[rank 1\\] at step 25 rank 1 gen 1").empty()) << l.output();
  const double killed_at = unix_now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const Outcome r = l.wait();
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] DONE rank 0 world 2 gen 2 step 60"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 1] DONE rank 1 world 2 gen 2 step 60"), std::string::npos)
      << r.output;

  const auto all = events();
  const auto failures = of_kind(all, "failure");
  ASSERT_EQ(failures.size(), 1u) << r.output;
  const json& f = failures[0];
  EXPECT_EQ(f["rank"], 1);
  EXPECT_EQ(f["signal"], 9);
  EXPECT_EQ(f["exit_code"], 137);
  EXPECT_EQ(f["detector"], "exit");
  EXPECT_EQ(f["generation"], 1);
  EXPECT_EQ(f["pid"], victim);
  EXPECT_GT(f.value("last_step", 0), 0);  // reports lag up to one interval (more under load)
  EXPECT_LE(f.value("last_step", 0), 60);
  const double latency = f["time"].get<double>() - killed_at;  // reported, not asserted (load)
  EXPECT_GE(latency, -0.5);  // detected after the kill (event clocks have ~ms resolution)
  std::printf("exit detection latency: %.1f ms\n", latency * 1000);
  // Rank 0 either saw the collective fail or was stopped; never a second "failure".
  for (const auto& e : all) {
    if (e["kind"] == "peer_failure" || e["kind"] == "stopped") {
      EXPECT_EQ(e["rank"], 0);
      EXPECT_EQ(e["cause_rank"], 1);
    }
  }
  const auto restarts = of_kind(all, "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0]["generation"], 2);
  EXPECT_EQ(restarts[0]["restarts"], 1);
  const auto resumed = of_kind(all, "resumed");
  ASSERT_EQ(resumed.size(), 1u) << r.output;
  EXPECT_EQ(resumed[0]["checkpoint"],
            "ckpt-" + std::to_string(resumed[0]["resumed_step"].get<int>()));
  const auto recovered = of_kind(all, "recovered");
  ASSERT_EQ(recovered.size(), 1u) << r.output;
  const json& rec = recovered[0];
  // lost_steps is known when the last progress report came after the backup; otherwise
  // (reports are rate-limited) the message says the loss is at most one backup interval.
  if (rec.contains("lost_steps")) {
    EXPECT_GE(rec["lost_steps"].get<int>(), 0);
    EXPECT_LE(rec["lost_steps"].get<int>(), 10);  // at most the checkpoint interval
  } else {
    EXPECT_LT(rec["last_step"].get<int>(), rec["resumed_step"].get<int>()) << rec.dump();
    EXPECT_NE(rec["message"].get<std::string>().find("at most one backup interval"),
              std::string::npos)
        << rec.dump();
  }
  EXPECT_GT(rec["recovery_seconds"].get<double>(), 0);  // its length is reported below
  std::printf("recovery (kill -> first step after restart): %.2f s, lost %s steps\n",
              rec["recovery_seconds"].get<double>(),
              rec.contains("lost_steps") ? std::to_string(rec["lost_steps"].get<int>()).c_str()
                                         : "<= one backup interval of");
  const std::string msg = rec["message"];
  EXPECT_NE(msg.find("worker 1 exited on signal 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("restarted; resumed from ckpt-"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lost "), std::string::npos) << msg;
  EXPECT_EQ(of_kind(all, "completed").size(), 1u);

  std::vector<std::string> texts;
  std::vector<std::pair<std::string, double>> scalars;
  tensorboard(texts, scalars);
  bool text_found = false;
  for (const auto& t : texts) text_found |= t.find(msg) != std::string::npos;
  EXPECT_TRUE(text_found) << "no TensorBoard text entry with: " << msg;
  bool restart_scalar = false, recovery_scalar = false;
  for (const auto& [tag, v] : scalars) {
    restart_scalar |= tag == "launcher/restarts" && v == 1;
    recovery_scalar |= tag == "launcher/recovery_s" && v > 0;
  }
  EXPECT_TRUE(restart_scalar);
  EXPECT_TRUE(recovery_scalar);
}

TEST_F(LaunchFaultTest, AStoppedWorkerIsCaughtByTheWatchdogWithItsStacks) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "1", "--watchdog-timeout", "1.5",
                   // gdb may need long to attach on a loaded machine; it returns as soon as
                   // it has the backtraces, so a generous limit costs nothing when quiet.
                   "--heartbeat-timeout", "0", "--stack-timeout", "30"},
                  {"--steps", "50", "--step-ms", "20", "--collective"}),
             dir_ / "out");
  const pid_t victim = worker_pid(l, 1, 1);
  ASSERT_GT(victim, 0) << l.output();
  ASSERT_FALSE(l.wait_for("\\[rank 1\\] at step 20 rank 1 gen 1").empty()) << l.output();
  const double stopped_at = unix_now();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const Outcome r = l.wait();
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("DONE rank 1 world 2 gen 2"), std::string::npos) << r.output;
  const auto all = events();
  const auto failures = of_kind(all, "failure");
  ASSERT_EQ(failures.size(), 1u) << r.output;
  const json& f = failures[0];
  EXPECT_EQ(f["detector"], "watchdog");
  EXPECT_EQ(f["rank"], 1);
  EXPECT_GT(f.value("last_step", 0), 0);  // reports lag up to one interval (more under load)
  const double detected = f["time"].get<double>() - stopped_at;
  // Never before the timeout; how long after it depends on the machine's load (reported).
  EXPECT_GE(f["detection_latency_seconds"].get<double>(), 1.5);
  std::printf("watchdog: detected %.2f s after SIGSTOP (timeout 1.5 s)\n", detected);
  const std::string stack = f["stack"];
  EXPECT_NE(stack.find("T (stopped)"), std::string::npos) << stack;
  if (access("/usr/bin/gdb", X_OK) == 0) {
    EXPECT_NE(stack.find("gdb backtraces"), std::string::npos) << stack;
    EXPECT_NE(stack.find("#0"), std::string::npos) << stack;
  }
  EXPECT_EQ(of_kind(all, "restart").size(), 1u);
}

TEST_F(LaunchFaultTest, AStoppedWorkerIsCaughtByItsHeartbeats) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "1", "--heartbeat-interval", "0.2",
                   "--heartbeat-timeout", "1", "--stack-timeout", "0"},
                  {"--steps", "50", "--step-ms", "20", "--collective"}),
             dir_ / "out");
  const pid_t victim = worker_pid(l, 0, 1);
  ASSERT_GT(victim, 0) << l.output();
  ASSERT_FALSE(l.wait_for("\\[rank 0\\] at step 20 rank 0 gen 1").empty()) << l.output();
  const double stopped_at = unix_now();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const Outcome r = l.wait();
  ASSERT_EQ(r.code, 0) << r.output;
  const auto failures = of_kind(events(), "failure");
  ASSERT_EQ(failures.size(), 1u) << r.output;
  EXPECT_EQ(failures[0]["detector"], "heartbeat");
  EXPECT_EQ(failures[0]["rank"], 0);
  const double detected = failures[0]["time"].get<double>() - stopped_at;
  EXPECT_GT(detected, 0) << "detected before the SIGSTOP";  // how long after: reported
  std::printf("heartbeat: detected %.2f s after SIGSTOP (timeout 1 s)\n", detected);
}

TEST_F(LaunchFaultTest, ASlotThatKeepsFailingIsExcludedAndTheOthersFinish) {
  Launcher l(args({"--nproc-per-node", "3", "--max-restarts", "4", "--exclude-after", "2",
                   "--exclude-window", "60"},
                  {"--steps", "20", "--step-ms", "10", "--collective", "--fail-slot", "2"}),
             dir_ / "out");
  const Outcome r = l.wait();
  ASSERT_EQ(r.code, 0) << r.output;
  const auto all = events();
  const auto failures = of_kind(all, "failure");
  ASSERT_EQ(failures.size(), 2u) << r.output;
  for (const auto& f : failures) {
    EXPECT_EQ(f["slot"], 2);
    EXPECT_EQ(f["exit_code"], 3);
  }
  const auto excluded = of_kind(all, "exclude");
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0]["slot"], 2);
  const auto restarts = of_kind(all, "restart");
  ASSERT_EQ(restarts.size(), 2u);
  EXPECT_EQ(restarts[1]["world_size"], 2);
  EXPECT_NE(r.output.find("DONE rank 0 world 2 gen 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("DONE rank 1 world 2 gen 3"), std::string::npos) << r.output;
}

TEST_F(LaunchFaultTest, MaxRestartsIsRespected) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "2"},
                  {"--steps", "20", "--step-ms", "10", "--fail-slot", "1", "--fail-code", "9"}),
             dir_ / "out");
  const Outcome r = l.wait();
  EXPECT_EQ(r.code, 9) << r.output;
  const auto all = events();
  EXPECT_EQ(of_kind(all, "failure").size(), 3u) << r.output;
  EXPECT_EQ(of_kind(all, "restart").size(), 2u) << r.output;
  const auto give_up = of_kind(all, "give_up");
  ASSERT_EQ(give_up.size(), 1u);
  EXPECT_EQ(give_up[0]["restarts"], 2);
  EXPECT_EQ(of_kind(all, "completed").size(), 0u);
}

TEST_F(LaunchFaultTest, SigtermToTheLauncherPassesThePreemptionCodeThroughWithoutRestart) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "3"},
                  {"--steps", "500", "--step-ms", "20", "--collective"}),
             dir_ / "out");
  ASSERT_FALSE(l.wait_for("\\[rank 1\\] at step 10 rank 1 gen 1").empty()) << l.output();
  ASSERT_EQ(kill(l.pid(), SIGTERM), 0);
  const Outcome r = l.wait();
  EXPECT_EQ(r.code, 143) << r.output;
  std::printf("SIGTERM to exit: %.2f s\n", r.seconds);
  EXPECT_NE(r.output.find("[rank 0] preempted at step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] preempted at step"), std::string::npos) << r.output;
  const auto all = events();
  EXPECT_EQ(of_kind(all, "restart").size(), 0u) << r.output;
  EXPECT_EQ(of_kind(all, "signal").size(), 1u) << r.output;
  // The preemption checkpoint is there for the next start.
  std::ifstream ckpt(dir_ / "work" / "ckpt");
  int step = 0;
  ASSERT_TRUE(ckpt >> step);
  EXPECT_GE(step, 10);
}

TEST_F(LaunchFaultTest, AWorkerExitingWithThePreemptionCodeIsNotRestarted) {
  Launcher l(args({"--nproc-per-node", "2", "--max-restarts", "3", "--preemption-exit-code", "77"},
                  {"--steps", "500", "--step-ms", "20"}),
             dir_ / "out");
  const pid_t victim = worker_pid(l, 1, 1);
  ASSERT_GT(victim, 0) << l.output();
  ASSERT_FALSE(l.wait_for("\\[rank 1\\] at step 10 rank 1 gen 1").empty()) << l.output();
  ASSERT_EQ(kill(victim, SIGTERM), 0);  // the worker checkpoints and exits with 77
  const Outcome r = l.wait();
  EXPECT_EQ(r.code, 77) << r.output;
  const auto all = events();
  EXPECT_EQ(of_kind(all, "restart").size(), 0u) << r.output;
  const auto preempted = of_kind(all, "preempted");
  ASSERT_EQ(preempted.size(), 1u) << r.output;
  EXPECT_EQ(preempted[0]["rank"], 1);
  EXPECT_EQ(preempted[0]["exit_code"], 77);
}

TEST_F(LaunchFaultTest, AFailureOnOneNodeRestartsBothNodesIntoTheNextGeneration) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> worker = {"--steps", "60", "--step-ms", "20", "--collective"};
  Launcher n0(node_args(0, rdzv, "2", {"--max-restarts", "1"}, worker), dir_ / "out0");
  Launcher n1(node_args(1, rdzv, "2", {"--max-restarts", "1"}, worker), dir_ / "out1");
  const pid_t victim = worker_pid(n1, 1, 1);
  ASSERT_GT(victim, 0) << n1.output();
  ASSERT_FALSE(n1.wait_for("\\[rank 1\\] at step 20 rank 1 gen 1").empty()) << n1.output();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const Outcome r1 = n1.wait();
  const Outcome r0 = n0.wait();
  ASSERT_EQ(r0.code, 0) << r0.output;
  ASSERT_EQ(r1.code, 0) << r1.output;
  EXPECT_NE(r0.output.find("failure on another node"), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("DONE rank 0 world 2 gen 2 step 60"), std::string::npos) << r0.output;
  EXPECT_NE(r1.output.find("DONE rank 1 world 2 gen 2 step 60"), std::string::npos) << r1.output;
  const auto e1 = events("events1.jsonl");
  const auto failures = of_kind(e1, "failure");
  ASSERT_EQ(failures.size(), 1u) << r1.output;
  EXPECT_EQ(failures[0]["node"], 1);
  EXPECT_EQ(failures[0]["rank"], 1);
  const auto e0 = events("events0.jsonl");
  EXPECT_EQ(of_kind(e0, "failure").size(), 0u);  // node 0 only learned of it
  EXPECT_EQ(of_kind(e0, "restart").size(), 1u);
  EXPECT_EQ(of_kind(e1, "restart").size(), 1u);
}

TEST_F(LaunchFaultTest, ElasticJobExcludesAFailingNodeAndGoesOnWithFewer) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> worker = {"--steps",      "30",          "--step-ms", "20",
                                           "--collective", "--fail-rank", "1"};
  const std::vector<std::string> flags = {"--max-restarts", "3", "--exclude-after", "1"};
  // Both nodes must be in the first generation: a round closes as soon as both are there, and
  // waits up to 5 s for the second once the first has arrived (0.5 s was too short for node 1's
  // launcher to start at load ~16, and node 0 then trained alone from the start).
  Launcher n0(node_args(0, rdzv, "1:2", flags, worker, "5"), dir_ / "out0");
  std::this_thread::sleep_for(100ms);
  Launcher n1(node_args(1, rdzv, "1:2", flags, worker, "5"), dir_ / "out1");
  const Outcome r1 = n1.wait();
  const Outcome r0 = n0.wait();
  EXPECT_EQ(r1.code, 3) << r1.output;  // excluded: it leaves with its failure's code
  ASSERT_EQ(r0.code, 0) << r0.output;
  EXPECT_NE(r0.output.find("DONE rank 0 world 1 gen 2 step 30"), std::string::npos) << r0.output;
  const auto e1 = events("events1.jsonl");
  ASSERT_EQ(of_kind(e1, "exclude").size(), 1u) << r1.output;
  EXPECT_EQ(of_kind(e1, "exclude")[0]["node"], 1);
  const auto restarts = of_kind(events("events0.jsonl"), "restart");
  ASSERT_EQ(restarts.size(), 1u) << r0.output;
  EXPECT_EQ(restarts[0]["world_size"], 1);
}

TEST_F(LaunchFaultTest, ElasticJobAdmitsANodeThatArrivesLater) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::vector<std::string> worker = {"--steps", "80", "--step-ms", "20", "--collective"};
  Launcher n0(node_args(0, rdzv, "1:2", {"--max-restarts", "0"}, worker), dir_ / "out0");
  ASSERT_FALSE(n0.wait_for("\\[rank 0\\] at step 10 rank 0 gen 1").empty()) << n0.output();
  Launcher n1(node_args(1, rdzv, "1:2", {"--max-restarts", "0"}, worker), dir_ / "out1");
  const Outcome r0 = n0.wait();
  const Outcome r1 = n1.wait();
  ASSERT_EQ(r0.code, 0) << r0.output;  // admitting is not a failure: no restart budget needed
  ASSERT_EQ(r1.code, 0) << r1.output;
  EXPECT_NE(r0.output.find("DONE rank 0 world 2 gen 2 step 80"), std::string::npos) << r0.output;
  EXPECT_NE(r1.output.find("DONE rank 1 world 2 gen 2 step 80"), std::string::npos) << r1.output;
  EXPECT_EQ(of_kind(events("events0.jsonl"), "admit").size(), 1u) << r0.output;
}

}  // namespace
