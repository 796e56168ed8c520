// Survivors keep running (`dtrain launch --on-failure survivors`, docs/fault-tolerance.md):
// MultiWorkerMirrored fits (the fit_worker program) under a real launcher on 127.0.0.1 whose
// workers are SIGKILLed at random moments — one at a time, and two at once. Only the killed
// workers are started again; the others catch the collective error inside fit, keep their
// process, join the next generation's fresh Gloo context and roll back to the newest snapshot
// every rank holds; the restarted workers receive that snapshot from a survivor by broadcast
// over the new generation's collectives. Each job must end with weights and optimizer state bitwise
// equal to an uninterrupted run, and the survivors' pids must not change across a failure; also
// with sharded optimizer state (ZeRO).
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
#include "dtrain/core/error.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;
constexpr int kEpochs = 80;  // 12 steps each: 960 steps

// Whether child `pid` has exited (a zombie not yet waited for, or gone).
bool exited(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;
  const size_t paren = stat.rfind(')');  // "pid (comm) S ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z';
}

std::vector<std::string> worker(const std::string& out, bool backups,
                                const std::vector<std::string>& extra = {},
                                int step_delay_us = 1000) {
  std::vector<std::string> a = {kWorker,
                                "--mode",
                                "multi-worker",
                                "--out",
                                out,
                                "--epochs",
                                std::to_string(kEpochs),
                                "--step-delay-us",
                                std::to_string(step_delay_us),
                                "--report-progress",
                                "1"};
  if (backups) a.insert(a.end(), {"--checkpoint-dir", out + ".ckpt", "--checkpoint-every", "400"});
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> launcher(int workers, std::vector<std::string> flags,
                                  const std::string& events, const std::vector<std::string>& cmd) {
  std::vector<std::string> a = {
      kDtrain,          "launch", "--nproc-per-node", std::to_string(workers),
      "--max-restarts", "40",     "--grace-period",   "1",
      "--event-log",    events};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back("--");
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

std::string tail(const std::string& s) { return s.substr(s.size() > 8000 ? s.size() - 8000 : 0); }

// The uninterrupted run of `workers` workers (no backups, no snapshots): rank 0's variables,
// computed once per world size.
// `extra`: worker flags that change the result (--early-stopping).
std::string compute_reference(int workers, const std::vector<std::string>& extra);
std::string reference(int workers, const std::vector<std::string>& extra = {}) {
  static std::map<std::pair<int, std::vector<std::string>>, std::string> done;
  auto it = done.find({workers, extra});
  if (it == done.end()) {
    it = done.emplace(std::pair{workers, extra}, compute_reference(workers, extra)).first;
  }
  return it->second;
}

std::string compute_reference(int workers, const std::vector<std::string>& extra) {
  const std::string dir = make_temp_dir();
  Process ref = spawn(launcher(workers, {"--snapshot-every", "0"}, dir + "/ref-events.jsonl",
                               worker(dir + "/ref.bin", false, extra)),
                      {}, dir + "/ref.log");
  const int code = wait_for(ref, Clock::now() + std::chrono::seconds(150));
  std::string out;
  bool same = code == 0;
  for (int r = 1; r < workers && same; ++r) {
    same =
        read_file(dir + "/ref.bin.rank0") == read_file(dir + "/ref.bin.rank" + std::to_string(r));
  }
  if (same) {
    out = read_file(dir + "/ref.bin.rank0");
  } else {
    std::fprintf(stderr, "reference run failed (%d):\n%s\n", code, read_file(ref.log).c_str());
  }
  std::system(("rm -rf " + dir).c_str());
  return out;
}

class LaunchSurvivors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override {
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }

  Process start(int workers, const std::string& mode, const std::vector<std::string>& extra = {}) {
    return spawn(
        launcher(workers,
                 {"--on-failure", mode, "--snapshot-every", "3", "--snapshot-root", dir_ + "/shm"},
                 dir_ + "/events.jsonl", worker(dir_ + "/out.bin", true, extra)),
        launcher_env(), dir_ + "/job.log");
  }

  // DTRAIN_LAUNCH_STATE_BROADCAST (0: the survivors' broadcast is off) from the test's own
  // environment, to check that the assertions on the broadcast can fail.
  static std::map<std::string, std::string> launcher_env() {
    std::map<std::string, std::string> env;
    if (const char* v = std::getenv("DTRAIN_LAUNCH_STATE_BROADCAST")) {
      env["DTRAIN_LAUNCH_STATE_BROADCAST"] = v;
    }
    return env;
  }

  // Processes of the job that have trained a step: each fit_worker prints "first step done"
  // once (a survivor does not print it again after a failure; a restarted worker does).
  int trained() const {
    const std::string log = read_file(dir_ + "/job.log");
    int n = 0;
    for (size_t at = log.find("first step done"); at != std::string::npos;
         at = log.find("first step done", at + 1)) {
      ++n;
    }
    return n;
  }

  // Waits (bounded) until `p` runs `n` workers and `trained()` reached `count`. False when the
  // job ended or the wait ran out.
  bool wait_trained(Process& p, size_t n, int count) {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.pid = -1;
        return false;
      }
      if (children(p.pid).size() == n && trained() >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Kills `victims` random workers at once, `rounds` times, each `lo`..`hi` ms after the group
  // trains again (every worker has taken a step since the last kill), and records whether every
  // worker that was not killed kept its pid across the failure. Returns the kills done.
  int kill_rounds(Process& p, size_t workers, size_t victims, int rounds, std::mt19937& rng, int lo,
                  int hi) {
    std::uniform_int_distribution<int> delay_ms(lo, hi);
    int kills = 0;
    int expect = static_cast<int>(workers);  // "first step done" lines once all train
    for (int round = 0; round < rounds; ++round) {
      if (!wait_trained(p, workers, expect)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      const std::vector<pid_t> before = children(p.pid);
      if (before.size() != workers) continue;
      std::vector<pid_t> pick = before;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(victims);
      const int trained_before = trained();
      for (pid_t v : pick) {
        if (kill(v, SIGKILL) == 0) ++kills;
      }
      // Training again: the restarted workers took a step (all of them after a restart-all).
      const size_t recovered_before = of_kind(events(dir_ + "/events.jsonl"), "recovered").size();
      expect = trained_before + static_cast<int>(victims);
      if (!wait_trained(p, workers, expect)) break;
      // Who runs now, while the group trains (after the wait below the job may have ended).
      const std::vector<pid_t> after = children(p.pid);
      // The next kill only once the launcher recorded this recovery (it sees the first step at
      // its monitor period; a kill before that would supersede it).
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (Clock::now() < deadline &&
             of_kind(events(dir_ + "/events.jsonl"), "recovered").size() <= recovered_before) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (after.size() != workers) continue;  // the job ended or a restart is under way
      const bool kept = std::all_of(before.begin(), before.end(), [&](pid_t b) {
        return std::find(pick.begin(), pick.end(), b) != pick.end() ||
               std::find(after.begin(), after.end(), b) != after.end();
      });
      (kept ? kept_ : lost_) += 1;
    }
    return kills;
  }

  // Checks the job's end: exit 0, every rank's variables bitwise equal to `ref`, "survivors"
  // events that name the pids that kept running, and survivor rollbacks from memory.
  // `every_kill_survived`: no failure may have restarted every worker (each kill lands once all
  // trained in the generation, so only a bug makes a survivor exit).
  void check_result(Process& p, int workers, const std::string& ref, int kills,
                    bool every_kill_survived = false) {
    const int code = p.pid > 0 ? wait_for(p, Clock::now() + std::chrono::seconds(180)) : 0;
    const std::string log = read_file(dir_ + "/job.log");
    ASSERT_EQ(code, 0) << tail(log);
    std::printf("%d worker kills; survivors kept their pids %d time(s), lost them %d time(s)\n",
                kills, kept_, lost_);
    ASSERT_GE(kills, 2) << "the job finished before the kills";
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(read_file(dir_ + "/out.bin.rank" + std::to_string(r)), ref)
          << "worker " << r << " differs after " << kills << " kills";
    }
    // Proof that the survivors kept running: the same processes before and after a failure.
    EXPECT_GE(kept_, 1) << tail(log);
    if (every_kill_survived) {
      EXPECT_EQ(lost_, 0) << tail(log);
    }
    const auto all = events(dir_ + "/events.jsonl");
    const auto continued = of_kind(all, "survivors");
    EXPECT_GE(continued.size(), 1u) << tail(log);
    for (const auto& e : continued) {
      std::printf("%s\n", e.value("message", "").c_str());
      EXPECT_FALSE(e.value("survivor_pids", "").empty()) << e.dump();
      EXPECT_FALSE(e.value("restarted", "").empty()) << e.dump();
    }
    // The survivors rolled back in-process, from the launcher's memory.
    EXPECT_NE(log.find("in the surviving process (no disk read)"), std::string::npos) << tail(log);
    EXPECT_EQ(log.find("resumed from " + dir_ + "/out.bin.ckpt/backup-"), std::string::npos)
        << "a recovery read a backup\n"
        << tail(log);
    // What each failure cost is recorded, and says the survivors went on.
    int survivor_recoveries = 0;
    for (const auto& e : of_kind(all, "recovered")) {
      EXPECT_TRUE(e.contains("recovery_seconds")) << e.dump();
      if (e.value("mode", "") == "survivors") ++survivor_recoveries;
    }
    EXPECT_GE(survivor_recoveries, 1) << tail(log);
    // Each restarted worker of a generation that recovered with survivors received its state
    // from a survivor by broadcast (a snapshot_restore event with source "survivor" for its
    // rank), not from the launcher's memory.
    int checked = 0;
    for (const auto& r : of_kind(all, "recovered")) {
      if (r.value("mode", "") != "survivors") continue;
      const int64_t g = r.value("generation", int64_t{0});
      for (const auto& e : continued) {
        if (e.value("generation", int64_t{0}) != g) continue;
        // "restarted": "1 (pid 123), 2 (pid 456)"
        std::istringstream in(e.value("restarted", ""));
        std::string item;
        while (std::getline(in, item, ')')) {
          const size_t digit = item.find_first_of("0123456789");
          if (digit == std::string::npos) continue;
          const int rank = std::stoi(item.substr(digit));
          bool found = false;
          for (const auto& s : of_kind(all, "snapshot_restore")) {
            found |= s.value("generation", int64_t{0}) == g && s.value("rank", -1) == rank &&
                     s.value("source", "") == "survivor" &&
                     s.value("from_rank", "") != std::to_string(rank);
          }
          ++checked;
          EXPECT_TRUE(found) << "restarted rank " << rank << " of generation " << g
                             << " did not receive its state from a survivor\n"
                             << tail(log);
        }
      }
    }
    EXPECT_GE(checked, 1) << tail(log);
  }

  // One failure at a chosen point of rank 1's fit (fit_worker's --die-in-validation or
  // --die-at-step, with --validation 1): rank 0 must survive it, and every rank must end bitwise
  // equal to the uninterrupted run (validation changes no weight) with the same last val_loss.
  // Rank 0's History must hold every epoch once, in order: a restart-all would have started a
  // new History at the resumed epoch.
  void check_one_failure(Process& p, const std::string& ref, int last_epoch = kEpochs - 1) {
    const int code = wait_for(p, Clock::now() + std::chrono::seconds(180));
    const std::string log = read_file(dir_ + "/job.log");
    ASSERT_EQ(code, 0) << tail(log);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(read_file(dir_ + "/out.bin.rank" + std::to_string(r)), ref)
          << "worker " << r << " differs\n"
          << tail(log);
    }
    EXPECT_NE(
        log.find(str_cat("[rank 0] history: epochs 0 to ", last_epoch, ", each once in order")),
        std::string::npos)
        << tail(log);
    const auto val_loss = [&](int rank) {
      const std::string key = "[rank " + std::to_string(rank) + "] val_loss ";
      const size_t at = log.find(key);
      return at == std::string::npos
                 ? std::string("(none)")
                 : log.substr(at + key.size(), log.find('\n', at) - at - key.size());
    };
    EXPECT_NE(val_loss(0), "(none)") << tail(log);
    EXPECT_EQ(val_loss(0), val_loss(1)) << tail(log);
    const auto all = events(dir_ + "/events.jsonl");
    const auto continued = of_kind(all, "survivors");
    ASSERT_EQ(continued.size(), 1u) << tail(log);
    EXPECT_NE(continued[0].value("restarted", "").find("1 (pid"), std::string::npos)
        << continued[0].dump();
    EXPECT_NE(log.find("in the surviving process (no disk read)"), std::string::npos) << tail(log);
  }

  std::string dir_;
  int kept_ = 0, lost_ = 0;
};

// (a) Two workers, one killed at a time at random moments (several kills).
TEST_F(LaunchSurvivors, RandomKillsKeepTheSurvivorBitwise) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, "survivors");
  std::mt19937 rng(1517);
  const int kills = kill_rounds(p, 2, 1, 5, rng, 150, 600);
  check_result(p, 2, ref, kills);
}

// (c) Sharded optimizer state (ZeRO stage 2): a survivor drops its
// shards with the failed generation's step, rolls back the gathered slots of the snapshot and
// shards them again on the fresh collectives. The result is bitwise the unsharded uninterrupted
// run's.
TEST_F(LaunchSurvivors, ShardedOptimizerStateSurvivesBitwise) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, "survivors", {"--shard-optimizer-state", "2"});
  std::mt19937 rng(4417);
  const int kills = kill_rounds(p, 2, 1, 3, rng, 150, 600);
  // Under ZeRO a backup gathers the slots (a collective): survivor and newcomer must back up at
  // the same steps, and a peer lost during that gather is survived like one lost in a step.
  check_result(p, 2, ref, kills, /*every_kill_survived=*/true);
}

// (c) A worker lost in the middle of an epoch's validation: the survivor catches the failed
// all-reduce there and ends the epoch again, from the agreed snapshot, with its newcomer.
TEST_F(LaunchSurvivors, AWorkerLostInValidationLeavesTheSurvivorRunning) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty());
  Process p = start(2, "survivors", {"--validation", "1", "--die-in-validation", "30"});
  check_one_failure(p, ref);
}

// (d) A worker lost in the second step of epoch 31 (12 steps per epoch): the newest snapshot every
// rank holds is step 372 (every 3 steps), the last of epoch 30, so the survivor rolls back over
// the epoch's end, which runs again: its History keeps one entry per epoch.
TEST_F(LaunchSurvivors, ARollbackOverAnEpochsEndKeepsOneHistoryEntryPerEpoch) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty());
  Process p = start(2, "survivors", {"--validation", "1", "--die-at-step", "373"});
  check_one_failure(p, ref);
}

// (e) The same failure with EarlyStopping (patience 32, only epoch 0 improving): the survivor's
// wait count goes back with the snapshot, so epoch 30's end counts once, and the restarted rank
// receives it with the rest of the state; both stop after epoch 32 as the uninterrupted run does.
// (Without the callback's state in the snapshot the survivor stops an epoch early and the
// restarted worker, waiting afresh, trains on alone.)
TEST_F(LaunchSurvivors, EarlyStoppingCountsARolledBackEpochOnce) {
  const std::vector<std::string> stop = {"--early-stopping", "32"};
  const std::string ref = reference(2, stop);
  ASSERT_FALSE(ref.empty());
  std::vector<std::string> flags = {"--validation", "1", "--die-at-step", "373"};
  flags.insert(flags.end(), stop.begin(), stop.end());
  Process p = start(2, "survivors", flags);
  check_one_failure(p, ref, 32);
}

// (b) Three workers, two killed at the same moment, several times: the one left keeps running.
TEST_F(LaunchSurvivors, TwoWorkersKilledAtOnce) {
  const std::string ref = reference(3);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(3, "survivors");
  std::mt19937 rng(2929);
  const int kills = kill_rounds(p, 3, 2, 3, rng, 150, 600);
  check_result(p, 3, ref, kills);
}

// Across nodes: two launchers on 127.0.0.1 (one worker each, private snapshot and backup
// directories) under one coordination service. A worker killed on either node is restarted by
// its own launcher, while the other node's worker keeps its process; and when a whole node is
// lost (its launcher SIGKILLed with its worker, its directory deleted) and started again, the
// other node's worker goes on too. Every job ends bitwise equal to the uninterrupted run.
class LaunchSurvivorsAcrossNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = make_temp_dir();
    rdzv_ = "127.0.0.1:" + std::to_string(testutil::free_port());
  }
  void TearDown() override {
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }

  std::string log_of(int node, int run = 0) const {
    return str_cat(dir_, "/n", node, run ? str_cat("-again", run) : std::string(), ".log");
  }
  Process start(int node, int run = 0, int spares = 0) {
    const std::string host = str_cat(dir_, "/node", node);  // this host's private directory
    std::vector<std::string> a = {kDtrain,
                                  "launch",
                                  "--nnodes",
                                  "2",
                                  "--node-rank",
                                  std::to_string(node),
                                  "--nproc-per-node",
                                  "1",
                                  "--rdzv",
                                  rdzv_,
                                  "--rdzv-timeout",
                                  "60",
                                  "--heartbeat-timeout",
                                  "2",
                                  "--max-restarts",
                                  "40",
                                  "--grace-period",
                                  "1",
                                  "--on-failure",
                                  "survivors",
                                  "--snapshot-every",
                                  "3",
                                  "--snapshot-root",
                                  host + "/shm",
                                  "--event-log",
                                  host + "-events.jsonl",
                                  "--spares",
                                  std::to_string(spares),
                                  "--"};
    // Backups on the host's own disk (the survivors' callback is BackupAndRestore's).
    // A 4 ms step delay (about 4 s of job): each kill must land while both nodes still train
    // (a kill after the other node's worker finished restarts both: "kept" then fails) and, with
    // spares, after each node's spare stands by, also on a loaded machine.
    for (const std::string& x :
         worker(dir_ + "/out.bin", false,
                {"--checkpoint-dir", host + "/ckpt", "--checkpoint-every", "400"}, 4000)) {
      a.push_back(x);
    }
    return spawn(a, env_, log_of(node, run));
  }
  // "first step done" lines in node `node`'s logs (each worker process prints one).
  int trained(int node, int runs = 1) const {
    int n = 0;
    for (int run = 0; run < runs; ++run) {
      const std::string log = read_file(log_of(node, run));
      for (size_t at = log.find("first step done"); at != std::string::npos;
           at = log.find("first step done", at + 1)) {
        ++n;
      }
    }
    return n;
  }
  // Node `node`'s standby spares from its event log: pid -> ready.
  std::map<pid_t, bool> standby(int node) const {
    return standby_spares(events(str_cat(dir_, "/node", node, "-events.jsonl")));
  }
  // The single worker of launcher `p` (not a standby spare) once it trains (`count` lines in its
  // node's logs) with `spares` spares ready beside it, or -1.
  pid_t trained_worker(Process& p, int node, int count, int runs = 1, int spares = 0) {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline && p.pid > 0 && !exited(p.pid)) {
      const auto all = events(str_cat(dir_, "/node", node, "-events.jsonl"));
      const std::map<pid_t, bool> standing = standby_spares(all);
      const std::set<pid_t> servers = spare_fork_servers(all);
      std::vector<pid_t> workers;
      for (pid_t c : children(p.pid)) {
        if (!standing.count(c) && !servers.count(c)) workers.push_back(c);
      }
      int ready = 0;
      for (const auto& [pid, r] : standing) ready += r ? 1 : 0;
      if (workers.size() == 1 && trained(node, runs) >= count && ready >= spares) {
        return workers[0];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string logs(int runs1 = 1) const {
    std::string out = "node 0:\n" + tail(read_file(log_of(0))) + "\nnode 1:\n";
    for (int run = 0; run < runs1; ++run) out += tail(read_file(log_of(1, run)));
    return out;
  }

  // Random kills of either node's worker, `rounds` times; the job's end checked.
  void kill_either(int rounds, uint32_t seed);

  std::string dir_, rdzv_;
  std::map<std::string, std::string> env_;  // the launchers' (and workers') extra environment
};

TEST_F(LaunchSurvivorsAcrossNodes, AWorkerKilledOnEitherNodeLeavesTheOtherNodeRunning) {
  kill_either(4, 2121);
}

// The same over Gloo's TCP transport (the two "hosts" share this machine's memory, so by
// default their collectives go through shared memory).
TEST_F(LaunchSurvivorsAcrossNodes, OverGlooTcpToo) {
  env_["DTRAIN_SHM_COLLECTIVES"] = "0";
  kill_either(2, 4242);
}

void LaunchSurvivorsAcrossNodes::kill_either(int rounds, uint32_t seed) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process n[2] = {start(0), start(1)};
  std::mt19937 rng(seed);
  int kills = 0, kept = 0;
  int expect[2] = {1, 1};
  for (int round = 0; round < rounds; ++round) {
    const pid_t w0 = trained_worker(n[0], 0, expect[0]);
    const pid_t w1 = trained_worker(n[1], 1, expect[1]);
    if (w0 < 0 || w1 < 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 400));
    const int victim = static_cast<int>(rng() % 2);
    if (kill(victim == 0 ? w0 : w1, SIGKILL) != 0) break;
    ++kills;
    ++expect[victim];
    // The victim's node trains again with a new worker; the other node's is the same process.
    if (trained_worker(n[victim], victim, expect[victim]) < 0) break;
    const pid_t other = trained_worker(n[1 - victim], 1 - victim, expect[1 - victim]);
    EXPECT_EQ(other, victim == 0 ? w1 : w0) << "node " << 1 - victim << "'s worker was restarted "
                                            << "after a kill on node " << victim << "\n"
                                            << logs();
    kept += other == (victim == 0 ? w1 : w0) ? 1 : 0;
  }
  ASSERT_EQ(wait_for(n[0], Clock::now() + std::chrono::seconds(180)), 0) << logs();
  ASSERT_EQ(wait_for(n[1], Clock::now() + std::chrono::seconds(60)), 0) << logs();
  std::printf("%d kills across 2 nodes; the other node's worker kept its pid %d time(s)\n", kills,
              kept);
  ASSERT_GE(kills, 2) << "the job finished before the kills\n" << logs();
  EXPECT_EQ(kept, kills);
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank0") == ref) << "rank 0 differs\n" << logs(2);
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank1") == ref) << "rank 1 differs\n" << logs(2);
  // Each node's launcher recorded the survivors, and the restarted workers were sent their state
  // by the survivor on the other node.
  int from_survivor = 0;
  for (int node = 0; node < 2; ++node) {
    const auto all = events(str_cat(dir_, "/node", node, "-events.jsonl"));
    EXPECT_GE(of_kind(all, "survivors").size(), 1u) << "node " << node << "\n" << logs();
    for (const auto& e : of_kind(all, "snapshot_restore")) {
      from_survivor += e.value("source", "") == "survivor" ? 1 : 0;
    }
  }
  EXPECT_GE(from_survivor, 1) << logs();
  EXPECT_EQ((read_file(log_of(0)) + read_file(log_of(1))).find("/backup-"), std::string::npos)
      << "a recovery read a backup";
}

// Hot spares on every node: a killed worker's rank goes to its own node's spare, the other
// node's worker keeps running, and the spare is replaced in the background.
TEST_F(LaunchSurvivorsAcrossNodes, EachNodesSpareTakesOverItsFailedRank) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process n[2] = {start(0, 0, 1), start(1, 0, 1)};
  std::mt19937 rng(3131);
  int kills = 0, kept = 0;
  int expect[2] = {1, 1};
  for (int round = 0; round < 3; ++round) {
    const pid_t w0 = trained_worker(n[0], 0, expect[0], 1, 1);
    const pid_t w1 = trained_worker(n[1], 1, expect[1], 1, 1);
    if (w0 < 0 || w1 < 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 300));
    const int victim = static_cast<int>(rng() % 2);
    const std::map<pid_t, bool> spares = standby(victim);
    if (kill(victim == 0 ? w0 : w1, SIGKILL) != 0) break;
    ++kills;
    ++expect[victim];
    const pid_t taken = trained_worker(n[victim], victim, expect[victim]);
    if (taken < 0) break;
    EXPECT_TRUE(spares.count(taken))
        << "node " << victim << "'s rank went to pid " << taken << ", not to its spare\n"
        << logs();
    const pid_t other = trained_worker(n[1 - victim], 1 - victim, expect[1 - victim]);
    EXPECT_EQ(other, victim == 0 ? w1 : w0) << logs();
    kept += other == (victim == 0 ? w1 : w0) ? 1 : 0;
  }
  ASSERT_EQ(wait_for(n[0], Clock::now() + std::chrono::seconds(180)), 0) << logs();
  ASSERT_EQ(wait_for(n[1], Clock::now() + std::chrono::seconds(60)), 0) << logs();
  std::printf(
      "%d kills across 2 nodes with a spare each; the other node's worker kept its pid %d "
      "time(s)\n",
      kills, kept);
  ASSERT_GE(kills, 2) << "the job finished before the kills\n" << logs();
  EXPECT_EQ(kept, kills);
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank0") == ref) << "rank 0 differs\n" << logs();
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank1") == ref) << "rank 1 differs\n" << logs();
  int takeovers = 0;
  for (int node = 0; node < 2; ++node) {
    takeovers += static_cast<int>(
        of_kind(events(str_cat(dir_, "/node", node, "-events.jsonl")), "spare_takeover").size());
  }
  EXPECT_EQ(takeovers, kills) << logs();
  // Spares are forked (the default): each one waits only for its intermediate parent's exit. (A
  // spare that asked getppid() after that exit took the launcher for it and waited out the bound.)
  const std::string all_logs = read_file(log_of(0)) + read_file(log_of(1));
  EXPECT_EQ(all_logs.find("was not re-parented"), std::string::npos) << logs();
}

TEST_F(LaunchSurvivorsAcrossNodes, ALostNodeStartedAgainJoinsTheRunningSurvivor) {
  const std::string ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process n0 = start(0);
  Process n1 = start(1);
  const pid_t w0 = trained_worker(n0, 0, 1);
  ASSERT_GT(w0, 0) << logs();
  ASSERT_GT(trained_worker(n1, 1, 1), 0) << logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(n1.pid, SIGKILL), 0);  // node 1's launcher, and with it its worker
  EXPECT_EQ(wait_for(n1, Clock::now() + std::chrono::seconds(10)), 128 + SIGKILL);
  std::system(("rm -rf " + dir_ + "/node1").c_str());  // its disk and memory are gone
  Process again = start(1, 1);
  ASSERT_GT(trained_worker(again, 1, 1, 2), 0) << logs(2);
  EXPECT_EQ(trained_worker(n0, 0, 1), w0) << "node 0's worker did not survive\n" << logs(2);
  ASSERT_EQ(wait_for(n0, Clock::now() + std::chrono::seconds(180)), 0) << logs(2);
  ASSERT_EQ(wait_for(again, Clock::now() + std::chrono::seconds(60)), 0) << logs(2);
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank0") == ref) << "rank 0 differs\n" << logs(2);
  EXPECT_TRUE(read_file(dir_ + "/out.bin.rank1") == ref) << "rank 1 differs\n" << logs(2);
  const auto e0 = events(dir_ + "/node0-events.jsonl");
  for (const auto& e : of_kind(e0, "failure")) {
    std::printf("node 0: %s\n", e.value("message", "").c_str());
  }
  ASSERT_GE(of_kind(e0, "survivors").size(), 1u) << logs(2);
  EXPECT_NE(read_file(log_of(0)).find("in the surviving process (no disk read)"), std::string::npos)
      << logs(2);
}

// The flag's values and its preconditions are usage errors naming it, before anything starts.
TEST(LaunchSurvivorsFlags, BadModeAndMissingSnapshotsAreUsageErrors) {
  const std::string dir = make_temp_dir();
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--on-failure", "sometimes"},
        std::vector<std::string>{"--on-failure", "survivors", "--snapshot-every", "0"}}) {
    std::vector<std::string> a = {kDtrain, "launch"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--", "true"});
    Process p = spawn(a, {}, dir + "/log");
    EXPECT_EQ(wait_for(p, Clock::now() + std::chrono::seconds(30)), 2);
    EXPECT_NE(read_file(dir + "/log").find("--on-failure"), std::string::npos)
        << read_file(dir + "/log");
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
