// In-memory snapshots under `dtrain launch` (src/fault/snapshots.h, src/train/memory_snapshots.h):
// 2-worker MultiWorkerMirrored fits (the fit_worker program) whose workers snapshot their whole
// state into their launcher's memory every few steps; workers (and, once, a whole node's
// launcher) are killed with SIGKILL at random moments. Each job must end with weights and
// optimizer state bitwise equal to an uninterrupted run, and the launchers' event logs must show
// that every recovery took its state from memory — the local agent's, or the neighbour agent's
// copy when a node's agent was lost — never from a backup on disk.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "chaos.h"
#include "train/snapshot_journal.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;
constexpr int kEpochs = 100;  // 12 steps each: 1200 steps

std::vector<std::string> worker(const std::string& out, const std::string& ckpt) {
  std::vector<std::string> a = {kWorker, "--mode",   "multi-worker",          "--out",
                                out,     "--epochs", std::to_string(kEpochs), "--step-delay-us",
                                "1000"};
  if (!ckpt.empty()) a.insert(a.end(), {"--checkpoint-dir", ckpt, "--checkpoint-every", "400"});
  return a;
}

std::vector<std::string> launcher(std::vector<std::string> flags, const std::string& events,
                                  const std::vector<std::string>& command) {
  std::vector<std::string> a = {kDtrain,          "launch", "--max-restarts", "40",
                                "--grace-period", "1",      "--event-log",    events};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back("--");
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::string tail(const std::string& s) { return s.substr(s.size() > 6000 ? s.size() - 6000 : 0); }

// The newest committed snapshot step of world-size-2 rank `rank` under a launcher's snapshot
// root, or -1.
int64_t newest_snapshot(const fs::path& root, int rank) {
  int64_t best = -1;
  std::error_code ec;
  for (const auto& agent : fs::directory_iterator(root, ec)) {
    // What the slots' trailers and the state file hold (journal commits make no files).
    const auto steps =
        train::snapshot_steps((agent.path() / ("w2-r" + std::to_string(rank))).string(), "snap");
    if (!steps.empty()) best = std::max<int64_t>(best, steps.back());
  }
  return best;
}

class LaunchSnapshots : public ::testing::Test {
 protected:
  // The uninterrupted reference, once for the suite: one launcher, two workers, no backups,
  // no snapshots.
  static void SetUpTestSuite() {
    const std::string dir = make_temp_dir();
    Process ref = spawn(launcher({"--nproc-per-node", "2", "--snapshot-every", "0"},
                                 dir + "/ref-events.jsonl", worker(dir + "/ref.bin", "")),
                        {}, dir + "/ref.log");
    const int code = wait_for(ref, Clock::now() + std::chrono::seconds(120));
    if (code == 0 && read_file(dir + "/ref.bin.rank0") == read_file(dir + "/ref.bin.rank1")) {
      *ref_ = read_file(dir + "/ref.bin.rank0");
    } else {
      std::fprintf(stderr, "reference run failed (%d):\n%s\n", code, read_file(ref.log).c_str());
    }
    std::system(("rm -rf " + dir).c_str());
  }
  void SetUp() override {
    ASSERT_FALSE(ref_->empty()) << "no reference result";
    dir_ = make_temp_dir();
  }
  void TearDown() override {
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }

  // Lines "first step done" in `log`: each fit_worker prints it once, after its first step.
  static int trained(const std::string& log) {
    const std::string s = read_file(log);
    int n = 0;
    for (size_t at = s.find("first step done"); at != std::string::npos;
         at = s.find("first step done", at + 1)) {
      ++n;
    }
    return n;
  }

  // Kills a random worker of `launcher_pid` every `lo`..`hi` ms, `kills` times or until it
  // exits (then returns false). With `log` (one node, restart-all), each kill also waits until
  // every worker of the generation it hits has trained a step, so that a loaded machine's slow
  // restarts do not let every kill land in start-up, before any snapshot could exist.
  bool kill_workers(Process& p, int kills, std::mt19937& rng, int lo, int hi, int& done,
                    const std::string& log = "") {
    std::uniform_int_distribution<int> delay_ms(lo, hi);
    const auto deadline = Clock::now() + std::chrono::seconds(log.empty() ? 60 : 180);
    int at_last_kill = 0;  // "first step done" lines when the last kill was made
    while (done < kills && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.pid = -1;
        return false;
      }
      const std::vector<pid_t> workers = children(p.pid);
      if (workers.empty()) continue;  // between generations
      // Restart-all: every worker of the generation after a kill prints its first step once.
      const int now = log.empty() ? 0 : trained(log);
      if (!log.empty() && now < at_last_kill + static_cast<int>(workers.size())) continue;
      const pid_t victim =
          workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(rng)];
      if (kill(victim, SIGKILL) == 0) {
        ++done;
        at_last_kill = now;
      }
    }
    return true;
  }

  // Every restart took its state from memory: each snapshot_restore event is local or peer
  // memory (a disk fallback is allowed only before any snapshot existed, resuming at step 0),
  // and within one generation every rank resumed from the same step. Returns the memory
  // restores.
  int check_memory_restores(const std::vector<nlohmann::json>& all) {
    std::map<int64_t, std::set<int64_t>> steps_of_generation;
    int memory = 0;
    for (const auto& e : of_kind(all, "snapshot_restore")) {
      const std::string source = e["source"].get<std::string>();
      if (source == "disk") continue;
      EXPECT_TRUE(source == "local_memory" || source == "peer_memory") << e.dump();
      EXPECT_GT(e["resumed_step"].get<int64_t>(), 0) << e.dump();
      steps_of_generation[e["generation"].get<int64_t>()].insert(e["resumed_step"].get<int64_t>());
      ++memory;
    }
    for (const auto& [g, steps] : steps_of_generation) {
      EXPECT_EQ(steps.size(), 1u) << "generation " << g << " resumed from different steps";
    }
    // The workers' own reports agree: what they resumed from is a snapshot.
    for (const auto& e : of_kind(all, "resumed")) {
      if (e.value("resumed_step", 0) > 0) {
        EXPECT_EQ(e.value("checkpoint", "").rfind("snap-", 0), 0u) << e.dump();
      }
    }
    return memory;
  }

  std::string dir_;
  static inline std::string* ref_ = new std::string;
};

// (a) One launcher, two workers, snapshots every 3 steps: random worker kills.
TEST_F(LaunchSnapshots, RandomWorkerKillsRestoreFromLocalMemoryBitwise) {
  Process p = spawn(
      launcher({"--nproc-per-node", "2", "--snapshot-every", "3", "--snapshot-root", dir_ + "/shm"},
               dir_ + "/events.jsonl", worker(dir_ + "/out.bin", dir_ + "/ckpt")),
      {}, dir_ + "/job.log");
  std::mt19937 rng(15);
  int kills = 0;
  kill_workers(p, 6, rng, 300, 900, kills, dir_ + "/job.log");
  const int code = p.pid > 0 ? wait_for(p, Clock::now() + std::chrono::seconds(180)) : 0;
  const std::string log = read_file(dir_ + "/job.log");
  ASSERT_EQ(code, 0) << tail(log);
  std::printf("%d worker kills\n", kills);
  ASSERT_GE(kills, 1) << "the job finished before any kill";
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank0"), *ref_) << "worker 0 differs after " << kills;
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank1"), *ref_) << "worker 1 differs after " << kills;
  const auto all = events(dir_ + "/events.jsonl");
  EXPECT_GE(check_memory_restores(all), 2) << tail(log);
  // ... and the workers said so: they resumed from snapshots, not backups.
  int from_snapshot = 0;
  for (const auto& e : of_kind(all, "resumed")) {
    if (e.value("checkpoint", "").rfind("snap-", 0) == 0) ++from_snapshot;
  }
  EXPECT_GE(from_snapshot, 2) << tail(log);
  // No recovery read a backup: the workers never said they resumed from one.
  EXPECT_EQ(log.find("resumed from " + dir_ + "/ckpt/backup-"), std::string::npos) << tail(log);
  EXPECT_NE(log.find("(no disk read)"), std::string::npos) << tail(log);
}

struct TwoNodes {
  std::string rdzv;
  std::vector<std::string> node(const std::string& dir, int n, const std::string& every,
                                const std::string& out) const {
    const std::string host = dir + "/node" + std::to_string(n);  // this host's private disk
    return launcher({"--nnodes", "2", "--node-rank", std::to_string(n), "--nproc-per-node", "1",
                     "--rdzv", rdzv, "--rdzv-timeout", "60", "--heartbeat-timeout", "2",
                     "--snapshot-every", every, "--snapshot-root", host + "/shm"},
                    host + "-events.jsonl", worker(out, host + "/ckpt"));
  }
};

// (b) Two nodes with private directories (each launcher's backups and snapshot root are its
// own): node 1's whole launcher is killed (its worker dies with it) and its directory deleted,
// as if the host were lost; a fresh launcher for node 1 gets rank 1's state from node 0's agent.
TEST_F(LaunchSnapshots, LostNodeRecoversFromPeerMemoryWithPrivateDirectories) {
  const TwoNodes job{.rdzv = "127.0.0.1:" + std::to_string(testutil::free_port())};
  Process n0 = spawn(job.node(dir_, 0, "3", dir_ + "/out.bin"), {}, dir_ + "/n0.log");
  Process n1 = spawn(job.node(dir_, 1, "3", dir_ + "/out.bin"), {}, dir_ + "/n1.log");
  // Until node 1's worker has snapshotted well into the run (node 0's agent replicates each
  // snapshot within milliseconds; the wait below leaves it many snapshots' time).
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  while (newest_snapshot(dir_ + "/node1/shm", 1) < 150 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(newest_snapshot(dir_ + "/node1/shm", 1), 150) << tail(read_file(n1.log));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Node 1's agent stalls (a starved replicator, as on a loaded host) while the workers train on
  // far past the snapshots they keep: its last replica on node 0 is then older than anything
  // node 0's own worker still keeps, and is recoverable only because node 0 pinned its own
  // snapshot of that step when the replica arrived.
  const int stalled_at = newest_snapshot(dir_ + "/node1/shm", 1);
  ASSERT_EQ(kill(n1.pid, SIGSTOP), 0);
  while (newest_snapshot(dir_ + "/node1/shm", 1) < stalled_at + 60 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(newest_snapshot(dir_ + "/node1/shm", 1), stalled_at + 60) << tail(read_file(n1.log));
  ASSERT_EQ(kill(n1.pid, SIGKILL), 0);
  EXPECT_EQ(wait_for(n1, Clock::now() + std::chrono::seconds(10)), 128 + SIGKILL);
  fs::remove_all(dir_ + "/node1");  // the host's disk and memory are gone
  Process again = spawn(job.node(dir_, 1, "3", dir_ + "/out.bin"), {}, dir_ + "/n1-again.log");
  ASSERT_EQ(wait_for(n0, Clock::now() + std::chrono::seconds(120)), 0) << tail(read_file(n0.log));
  ASSERT_EQ(wait_for(again, Clock::now() + std::chrono::seconds(30)), 0)
      << tail(read_file(again.log));
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank0"), *ref_);
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank1"), *ref_);

  const auto e1 = events(dir_ + "/node1-events.jsonl");
  bool from_peer = false;
  for (const auto& e : of_kind(e1, "snapshot_restore")) {
    std::printf("node 1: %s\n", e.value("message", "").c_str());
    if (e["source"] == "peer_memory" && e.value("from_node", "") == "0") from_peer = true;
  }
  EXPECT_TRUE(from_peer) << "node 1's worker state did not come from node 0's agent\n"
                         << tail(read_file(again.log));
  const auto e0 = events(dir_ + "/node0-events.jsonl");
  EXPECT_GE(check_memory_restores(e0), 1) << tail(read_file(n0.log));
  check_memory_restores(e1);
  const std::string logs = read_file(n0.log) + read_file(again.log);
  EXPECT_EQ(logs.find("/ckpt/backup-"), std::string::npos) << "a recovery read a backup";
}

// (c) Snapshots at every step on two nodes, so that kills land while snapshots are being
// written and pushed to the neighbour: random worker kills on both nodes. The agreed step is
// complete on every member (one step per generation, bitwise result).
TEST_F(LaunchSnapshots, KillsDuringSnapshotPushesNeverMixStates) {
  const TwoNodes job{.rdzv = "127.0.0.1:" + std::to_string(testutil::free_port())};
  Process n0 = spawn(job.node(dir_, 0, "1", dir_ + "/out.bin"), {}, dir_ + "/n0.log");
  Process n1 = spawn(job.node(dir_, 1, "1", dir_ + "/out.bin"), {}, dir_ + "/n1.log");
  std::mt19937 rng(1515);
  int kills = 0;
  for (int round = 0; round < 6 && n0.pid > 0 && n1.pid > 0; ++round) {
    Process& p = rng() % 2 ? n0 : n1;
    kill_workers(p, kills + 1, rng, 200, 700, kills);
  }
  const int c0 = n0.pid > 0 ? wait_for(n0, Clock::now() + std::chrono::seconds(180)) : 0;
  const int c1 = n1.pid > 0 ? wait_for(n1, Clock::now() + std::chrono::seconds(60)) : 0;
  ASSERT_EQ(c0, 0) << tail(read_file(n0.log));
  ASSERT_EQ(c1, 0) << tail(read_file(n1.log));
  std::printf("%d worker kills\n", kills);
  ASSERT_GE(kills, 1);
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank0"), *ref_) << "worker 0 differs after " << kills;
  EXPECT_EQ(read_file(dir_ + "/out.bin.rank1"), *ref_) << "worker 1 differs after " << kills;
  auto all = events(dir_ + "/node0-events.jsonl");
  const auto e1 = events(dir_ + "/node1-events.jsonl");
  all.insert(all.end(), e1.begin(), e1.end());
  EXPECT_GE(check_memory_restores(all), 2);
}

// A bad schedule is a usage error naming the flag, before anything starts.
TEST(LaunchSnapshotFlags, ANegativeScheduleIsAUsageError) {
  const std::string dir = make_temp_dir();
  Process p = spawn({kDtrain, "launch", "--snapshot-every", "-1", "--", "true"}, {}, dir + "/log");
  EXPECT_EQ(wait_for(p, Clock::now() + std::chrono::seconds(30)), 2);
  EXPECT_NE(read_file(dir + "/log").find("--snapshot-every"), std::string::npos)
      << read_file(dir + "/log");
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
