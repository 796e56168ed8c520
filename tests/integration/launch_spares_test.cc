// Hot spares (`dtrain launch --spares K`, docs/fault-tolerance.md "Hot spares"):
// MultiWorkerMirrored fits (the fit_worker program) under a real launcher on 127.0.0.1 with K
// standby spares, whose workers are SIGKILLed at random moments. A ready spare (data made, model
// built, connected to the coordination service, blocked on it) takes over each killed rank instead
// of a new process: it joins the survivors, which keep their processes, and receives the agreed
// snapshot from a survivor by broadcast over the new generation's collectives (the launcher's
// tmpfs copy is the fallback, checked with the broadcast switched off). A spare killed while it
// stands by is replaced without touching the job; with no spare ready the failed rank is restarted
// as before. Every job must end with weights and optimizer state bitwise equal to an uninterrupted
// run. DTRAIN_CHAOS_TRIALS=N sets the number of kills of the random-kill test (default 6; the
// issue's full run is 20).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "chaos.h"

namespace dtrain::testing {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;
int chaos_trials() {
  const char* v = std::getenv("DTRAIN_CHAOS_TRIALS");
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 6;
}

// 12 steps each: 3600 steps for the default 6 kills, longer for more. A takeover loses only a
// few steps, and each kill waits for the group to train again and for a spare to stand by, so
// the job must outlast the kills on a quiet machine too (at least 1 ms a step).
int epochs() { return 300 * ((chaos_trials() + 5) / 6); }

std::vector<std::string> worker(const std::string& out, bool backups,
                                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {kWorker,
                                "--mode",
                                "multi-worker",
                                "--out",
                                out,
                                "--epochs",
                                std::to_string(epochs()),
                                "--step-delay-us",
                                "1000",
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
      "--max-restarts", "60",     "--grace-period",   "1",
      "--event-log",    events};
  a.insert(a.end(), flags.begin(), flags.end());
  a.push_back("--");
  a.insert(a.end(), cmd.begin(), cmd.end());
  return a;
}

// The uninterrupted run of `workers` workers (no backups, snapshots or spares): rank 0's
// variables, computed once per world size.
const std::string& reference(int workers) {
  static std::map<int, std::string> cache;
  if (auto it = cache.find(workers); it != cache.end()) return it->second;
  const std::string dir = make_temp_dir();
  Process ref = spawn(launcher(workers, {"--snapshot-every", "0"}, dir + "/ref-events.jsonl",
                               worker(dir + "/ref.bin", false)),
                      {}, dir + "/ref.log");
  const int code = wait_for(ref, Clock::now() + std::chrono::seconds(150));
  bool same = code == 0;
  for (int r = 1; r < workers && same; ++r) {
    same =
        read_file(dir + "/ref.bin.rank0") == read_file(dir + "/ref.bin.rank" + std::to_string(r));
  }
  std::string out;
  if (same) {
    out = read_file(dir + "/ref.bin.rank0");
  } else {
    std::fprintf(stderr, "reference run failed (%d):\n%s\n", code, read_file(ref.log).c_str());
  }
  std::system(("rm -rf " + dir).c_str());
  return cache[workers] = out;
}

class LaunchSpares : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override {
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }

  Process start(int workers, int spares, const std::vector<std::string>& extra = {},
                const std::string& mode = "survivors") {
    std::vector<std::string> flags = {
        "--on-failure",    mode,          "--snapshot-every", "3",
        "--snapshot-root", dir_ + "/shm", "--spares",         std::to_string(spares)};
    flags.insert(flags.end(), launcher_flags_.begin(), launcher_flags_.end());
    return spawn(
        launcher(workers, flags, dir_ + "/events.jsonl", worker(dir_ + "/out.bin", true, extra)),
        launcher_env(), dir_ + "/job.log");
  }

  // The launcher's environment: DTRAIN_LAUNCH_STATE_BROADCAST (0 switches the survivors'
  // broadcast off) from the test's own, to check that the assertions on it can fail, or set.
  std::map<std::string, std::string> launcher_env() const {
    std::map<std::string, std::string> env;
    if (const char* v = std::getenv("DTRAIN_LAUNCH_STATE_BROADCAST")) {
      env["DTRAIN_LAUNCH_STATE_BROADCAST"] = v;
    }
    if (broadcast_off_) env["DTRAIN_LAUNCH_STATE_BROADCAST"] = "0";
    return env;
  }

  // The snapshot_restore events of newcomers that received their state from a survivor.
  std::vector<nlohmann::json> from_survivors() const {
    std::vector<nlohmann::json> out;
    for (const auto& e : of_kind(all_events(), "snapshot_restore")) {
      if (e.value("source", "") == "survivor") out.push_back(e);
    }
    return out;
  }

  // The event log so far (read while the launcher writes it: a line not yet complete is left
  // out).
  std::vector<nlohmann::json> all_events() const {
    std::vector<nlohmann::json> out;
    std::ifstream f(dir_ + "/events.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) out.push_back(std::move(j));
    }
    return out;
  }

  // The spares standing by, from the event log: pid -> whether it said it is ready.
  std::map<pid_t, bool> standby() const { return standby_spares(all_events()); }
  int ready_spares() const {
    int n = 0;
    for (const auto& [pid, ready] : standby()) n += ready ? 1 : 0;
    return n;
  }

  // The launcher's children that are workers (not standby spares).
  std::vector<pid_t> workers(const Process& p) const {
    const auto all = all_events();
    const std::map<pid_t, bool> spares = standby_spares(all);
    const std::set<pid_t> servers = spare_fork_servers(all);
    std::vector<pid_t> out;
    for (pid_t c : children(p.pid)) {
      if (!spares.count(c) && !servers.count(c)) out.push_back(c);
    }
    return out;
  }

  // Processes of the job that have trained a step: each fit_worker prints "first step done"
  // once (a survivor does not print it again after a failure; a new worker or a spare that took
  // over does).
  int trained() const {
    const std::string log = read_file(dir_ + "/job.log");
    int n = 0;
    for (size_t at = log.find("first step done"); at != std::string::npos;
         at = log.find("first step done", at + 1)) {
      ++n;
    }
    return n;
  }

  // Waits (bounded) until `p` runs `n` workers, trained() reached `count` and `spares` spares
  // stand by ready. False when the job ended or the wait ran out.
  bool wait_for_state(Process& p, size_t n, int count, int spares) {
    const auto deadline = Clock::now() + std::chrono::seconds(90);
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.pid = -1;
        return false;
      }
      if (workers(p).size() == n && trained() >= count && ready_spares() >= spares) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // Kills `victims` random workers at once, `rounds` times, each `lo`..`hi` ms after the group
  // trains again with `spares` spares ready, and records whether every worker that was not
  // killed kept its pid and whether every victim's rank went to a spare. Returns the kills done.
  int kill_rounds(Process& p, size_t n, size_t victims, int rounds, int spares, std::mt19937& rng,
                  int lo, int hi) {
    std::uniform_int_distribution<int> delay_ms(lo, hi);
    int kills = 0;
    int expect = static_cast<int>(n);
    for (int round = 0, attempts = 0; round < rounds && attempts < 10 * rounds; ++attempts) {
      if (!wait_for_state(p, n, expect, spares)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
      const std::vector<pid_t> before = workers(p);
      // A spare started a moment ago may not be in the event log yet: look again.
      if (before.size() != n) continue;
      ++round;
      std::vector<pid_t> pick = before;
      std::shuffle(pick.begin(), pick.end(), rng);
      pick.resize(victims);
      const int trained_before = trained();
      const size_t takeovers_before = of_kind(all_events(), "spare_takeover").size();
      for (pid_t v : pick) {
        if (kill(v, SIGKILL) == 0) ++kills;
      }
      const size_t recovered_before = of_kind(all_events(), "recovered").size();
      expect = trained_before + static_cast<int>(victims);
      if (!wait_for_state(p, n, expect, 0)) break;
      // The next kill only once the launcher recorded this recovery (it sees the first step at
      // its monitor period; a kill before that would supersede it).
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (Clock::now() < deadline &&
             of_kind(all_events(), "recovered").size() <= recovered_before) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      const std::vector<pid_t> after = workers(p);
      const bool kept = std::all_of(before.begin(), before.end(), [&](pid_t b) {
        return std::find(pick.begin(), pick.end(), b) != pick.end() ||
               std::find(after.begin(), after.end(), b) != after.end();
      });
      (kept ? kept_ : lost_) += 1;
      taken_ += static_cast<int>(of_kind(all_events(), "spare_takeover").size() - takeovers_before);
    }
    return kills;
  }

  // The slot files that spares standing by made ahead under the launcher's snapshot root
  // (<root>/dtrain-snapshots-*/.spare-<id>-<pid>/.standby-slot-*).
  int standby_slot_files() const {
    namespace fs = std::filesystem;
    int n = 0;
    std::error_code ec;
    for (const auto& keeper : fs::directory_iterator(dir_ + "/shm", ec)) {
      for (const auto& d : fs::directory_iterator(keeper.path(), ec)) {
        if (d.path().filename().string().rfind(".spare-", 0) != 0) continue;
        for (const auto& f : fs::directory_iterator(d.path(), ec)) {
          n += f.path().filename().string().rfind(".standby-slot-", 0) == 0 ? 1 : 0;
        }
      }
    }
    return n;
  }

  // Waits (up to 60 s) for a spare_lost event and `ready` ready spares: a lost standby spare
  // replaced.
  void wait_for_spare_replaced(int ready) const {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline &&
           (of_kind(all_events(), "spare_lost").empty() || ready_spares() < ready)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // The job's end: exit 0 and every rank's variables bitwise equal to `ref`.
  void check_bitwise(Process& p, int n, const std::string& ref, int kills) {
    const int code = p.pid > 0 ? wait_for(p, Clock::now() + std::chrono::seconds(180)) : 0;
    const std::string log = read_file(dir_ + "/job.log");
    ASSERT_EQ(code, 0) << log_tail(log);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(read_file(dir_ + "/out.bin.rank" + std::to_string(r)), ref)
          << "worker " << r << " differs after " << kills << " kills\n"
          << log_tail(log);
    }
    EXPECT_EQ(log.find("resumed from " + dir_ + "/out.bin.ckpt/backup-"), std::string::npos)
        << "a recovery read a backup\n"
        << log_tail(log);
  }

  // Every failure was taken over by spares: the survivors kept their pids, each killed rank
  // went to a spare (spare_takeover names its pid and rank; no process was restarted), which
  // restored the agreed snapshot, and the recoveries say so. With `at_once` (several workers
  // killed together) a round may instead fall back to restarting every worker, as without
  // spares: a SIGKILLed process can take longer than the launcher's 50 ms window to exit on a
  // loaded machine, and then fails the next generation while it forms; at least one round must
  // then have gone to spares entirely.
  void check_taken_over(int kills, int rounds, bool at_once = false) {
    const auto all = all_events();
    const std::string log = read_file(dir_ + "/job.log");
    std::printf(
        "%d worker kills in %d rounds; survivors kept their pids %d time(s), lost them %d "
        "time(s); %d rank(s) taken over by spares\n",
        kills, rounds, kept_, lost_, taken_);
    for (const auto& e : of_kind(all, "spare_takeover")) {
      EXPECT_TRUE(e.contains("rank") && e.contains("pid")) << e.dump();
    }
    const auto continued = of_kind(all, "survivors");
    int all_to_spares = 0;  // survivors events where spares took every killed rank
    for (const auto& e : continued) {
      std::printf("%s\n", e.value("message", "").c_str());
      const std::string spares = e.value("spares", "");
      const bool whole = e.value("restarted", "").empty() && !spares.empty() &&
                         std::count(spares.begin(), spares.end(), '(') == kills / rounds;
      all_to_spares += whole ? 1 : 0;
      if (!at_once) {
        EXPECT_TRUE(whole) << "a rank was not taken over by a spare\n" << e.dump();
      }
    }
    int spare_recoveries = 0;
    for (const auto& e : of_kind(all, "recovered")) {
      EXPECT_TRUE(e.contains("recovery_seconds") && e.contains("lost_seconds")) << e.dump();
      if (e.value("mode", "") == "spares") ++spare_recoveries;
      std::printf("recovered: %.3f s (%s)\n", e.value("recovery_seconds", 0.0),
                  e.value("mode", "").c_str());
    }
    if (at_once) {
      EXPECT_GE(kept_, 1) << log_tail(log);
      EXPECT_GE(all_to_spares, 1) << log_tail(log);
      EXPECT_GE(spare_recoveries, 1) << log_tail(log);
    } else {
      EXPECT_EQ(lost_, 0) << log_tail(log);
      EXPECT_EQ(taken_, kills) << log_tail(log);
      EXPECT_EQ(static_cast<int>(continued.size()), rounds) << log_tail(log);
      EXPECT_EQ(all_to_spares, rounds) << log_tail(log);
      EXPECT_EQ(spare_recoveries, rounds) << log_tail(log);
    }
    // Each spare received the agreed snapshot from a survivor by broadcast (not from the
    // launcher's memory): a snapshot_restore event with source "survivor" for its rank, in the
    // generation it joined, naming a survivor.
    EXPECT_NE(log.find("takes over rank"), std::string::npos) << log_tail(log);
    const auto received = from_survivors();
    for (const auto& e : received) {
      std::printf("%s\n", e.value("message", "").c_str());
      EXPECT_NE(e.value("from_rank", "-1"), std::to_string(e.value("rank", -1))) << e.dump();
    }
    // Every generation that recovered with spares (a generation that failed again while it
    // formed may end before its spare restored).
    int checked = 0;
    for (const auto& e : of_kind(all, "recovered")) {
      if (e.value("mode", "") != "spares") continue;
      for (const auto& t : of_kind(all, "spare_takeover")) {
        if (t.value("generation", 0) != e.value("generation", 0)) continue;
        const bool found = std::any_of(received.begin(), received.end(), [&](const auto& r) {
          return r.value("generation", 0) == t.value("generation", 0) &&
                 r.value("rank", -1) == t.value("rank", -2);
        });
        ++checked;
        EXPECT_TRUE(found) << "the spare that took rank " << t.value("rank", -1)
                           << " did not receive its state from a survivor\n"
                           << t.dump() << "\n"
                           << log_tail(log);
      }
    }
    EXPECT_GE(checked, 1) << log_tail(log);
    EXPECT_NE(log.find("(a survivor) by broadcast"), std::string::npos) << log_tail(log);
  }

  std::string dir_;
  std::vector<std::string> launcher_flags_;  // more `dtrain launch` flags for start()
  bool broadcast_off_ = false;
  int kept_ = 0, lost_ = 0, taken_ = 0;
};

// Two workers and one spare; a random worker killed at a time, several times: a spare takes over
// every time (the replacement spare is ready before the next kill).
TEST_F(LaunchSpares, RandomKillsAreTakenOverBySpares) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, 1);
  std::mt19937 rng(4153);
  const int rounds = chaos_trials();
  const int kills = kill_rounds(p, 2, 1, rounds, 1, rng, 50, 250);
  ASSERT_EQ(kills, rounds) << "the job ended, or did not train again after a kill\n"
                           << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  check_taken_over(kills, rounds);
}

// A worker stopped with SIGSTOP (a frozen process: it holds its rank but does nothing) is caught
// by its heartbeats, fenced — the launcher kills the stopped process, so it can never resume with
// stale state — and its rank goes to the spare while the other worker keeps running.
TEST_F(LaunchSpares, AStoppedWorkerIsFencedAndItsRankTakenOver) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  launcher_flags_ = {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "1",
                     "--stack-timeout",      "0"};
  Process p = start(2, 1);
  ASSERT_TRUE(wait_for_state(p, 2, 2, 1)) << log_tail(read_file(dir_ + "/job.log"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::vector<pid_t> before = workers(p);
  ASSERT_EQ(before.size(), 2u);
  const pid_t victim = before[1], other = before[0];
  const auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  const double stopped_at = unix_now();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  // Trained again: the spare took the rank and took its first step.
  ASSERT_TRUE(wait_for_state(p, 2, 3, 0)) << log_tail(read_file(dir_ + "/job.log"));
  const std::vector<pid_t> after = workers(p);
  EXPECT_EQ(std::count(after.begin(), after.end(), victim), 0) << "the stopped worker still runs";
  EXPECT_EQ(std::count(after.begin(), after.end(), other), 1) << "the other worker was restarted";
  // Fenced: the stopped process is gone (a stopped process that is only SIGCONTed would rejoin).
  EXPECT_NE(kill(victim, 0), 0) << "the stopped worker " << victim << " was not killed";
  const auto all = all_events();
  const auto failures = of_kind(all, "failure");
  ASSERT_EQ(failures.size(), 1u) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_EQ(failures[0].value("detector", ""), "heartbeat") << failures[0].dump();
  EXPECT_EQ(failures[0].value("pid", -1), victim) << failures[0].dump();
  std::printf("SIGSTOP: detected %.2f s after the stop (heartbeat timeout 1 s)\n",
              failures[0].value("time", 0.0) - stopped_at);
  const auto takeovers = of_kind(all, "spare_takeover");
  ASSERT_EQ(takeovers.size(), 1u) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_EQ(takeovers[0].value("rank", -1), failures[0].value("rank", -2)) << takeovers[0].dump();
  check_bitwise(p, 2, ref, 1);
}

// Three workers and two spares: first a standby spare is killed (replaced in the background,
// no worker failure), then two workers are killed at once, twice; both ranks go to spares.
TEST_F(LaunchSpares, TwoAtOnceAndALostSpare) {
  const std::string& ref = reference(3);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(3, 2);
  ASSERT_TRUE(wait_for_state(p, 3, 3, 2)) << log_tail(read_file(dir_ + "/job.log"));
  const pid_t spare = standby().begin()->first;
  ASSERT_EQ(kill(spare, SIGKILL), 0);
  // Replaced: a spare_lost for it, and two ready spares again, while the workers train on.
  wait_for_spare_replaced(2);
  const auto lost = of_kind(all_events(), "spare_lost");
  ASSERT_EQ(lost.size(), 1u) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_EQ(lost[0].value("pid", -1), spare) << lost[0].dump();
  EXPECT_EQ(lost[0].value("signal", 0), SIGKILL) << lost[0].dump();
  ASSERT_EQ(ready_spares(), 2) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_TRUE(of_kind(all_events(), "failure").empty()) << "a spare's death failed the job";
  EXPECT_EQ(of_kind(all_events(), "spare_started").size(), 3u);

  std::mt19937 rng(2929);
  const int kills = kill_rounds(p, 3, 2, 2, 2, rng, 100, 500);
  ASSERT_EQ(kills, 4) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 3, ref, kills);
  check_taken_over(kills, 2, /*at_once=*/true);
  // The spare's death is no worker failure.
  for (const auto& e : of_kind(all_events(), "failure")) {
    EXPECT_NE(e.value("pid", -1), spare) << e.dump();
  }
}

// A standby spare stopped with SIGSTOP is fenced — killed, so that it can never take a rank and
// resume — and replaced in the background, with no worker failure; the next failure goes to the
// replacement and the job ends bitwise.
TEST_F(LaunchSpares, AStoppedSpareIsFencedAndReplaced) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, 1);
  ASSERT_TRUE(wait_for_state(p, 2, 2, 1)) << log_tail(read_file(dir_ + "/job.log"));
  const pid_t spare = standby().begin()->first;
  const double stopped_at =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_EQ(kill(spare, SIGSTOP), 0);
  wait_for_spare_replaced(1);
  const auto lost = of_kind(all_events(), "spare_lost");
  ASSERT_EQ(lost.size(), 1u) << "the stopped spare was not fenced\n"
                             << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_EQ(lost[0].value("pid", -1), spare) << lost[0].dump();
  EXPECT_EQ(lost[0].value("fenced", ""), "true") << lost[0].dump();
  std::printf("stopped spare fenced %.2f s after the stop\n",
              lost[0].value("time", 0.0) - stopped_at);
  EXPECT_NE(kill(spare, 0), 0) << "the stopped spare " << spare << " still exists";
  ASSERT_EQ(ready_spares(), 1) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_TRUE(of_kind(all_events(), "failure").empty()) << "a spare's stop failed the job";

  std::mt19937 rng(31);
  const int kills = kill_rounds(p, 2, 1, 1, 1, rng, 50, 250);
  ASSERT_EQ(kills, 1) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  check_taken_over(kills, 1);
}

// No spare ready (the spare's start-up takes ten minutes): the killed rank is restarted as
// without spares, and the job still ends bitwise.
TEST_F(LaunchSpares, NoSpareReadyFallsBackToARestart) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, 1, {"--standby-delay-ms", "600000"});
  std::mt19937 rng(77);
  const int kills = kill_rounds(p, 2, 1, 2, 0, rng, 100, 500);
  ASSERT_EQ(kills, 2) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  const auto all = all_events();
  EXPECT_TRUE(of_kind(all, "spare_takeover").empty());
  EXPECT_EQ(taken_, 0);
  EXPECT_EQ(lost_, 0);
  const auto continued = of_kind(all, "survivors");
  ASSERT_EQ(continued.size(), 2u) << log_tail(read_file(dir_ + "/job.log"));
  for (const auto& e : continued) EXPECT_FALSE(e.value("restarted", "").empty()) << e.dump();
  EXPECT_NE(read_file(dir_ + "/job.log").find("no spare stands by for rank"), std::string::npos);
}

// Under --on-failure restart-all every worker restarts, and the ready spare takes one of the
// ranks (the other is a new process); the job still ends bitwise.
TEST_F(LaunchSpares, RestartAllTakesTheReadySpare) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, 1, {}, "restart-all");
  std::mt19937 rng(5);
  const int kills = kill_rounds(p, 2, 1, 2, 1, rng, 100, 500);
  ASSERT_EQ(kills, 2) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  EXPECT_EQ(taken_, kills) << log_tail(read_file(dir_ + "/job.log"));
  const auto recovered = of_kind(all_events(), "recovered");
  ASSERT_EQ(static_cast<int>(recovered.size()), kills);
  for (const auto& e : recovered) EXPECT_EQ(e.value("spares", ""), "1") << e.dump();
}

// With the survivors' broadcast switched off (DTRAIN_LAUNCH_STATE_BROADCAST=0), the spares
// restore the agreed snapshot from the launcher's memory instead; the job still ends bitwise,
// and no state came from a survivor (what the other tests assert is then false).
TEST_F(LaunchSpares, WithoutTheBroadcastSparesRestoreFromTheLaunchersMemory) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  broadcast_off_ = true;
  Process p = start(2, 1);
  std::mt19937 rng(31);
  const int kills = kill_rounds(p, 2, 1, 2, 1, rng, 50, 250);
  ASSERT_EQ(kills, 2) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  EXPECT_EQ(taken_, kills) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_TRUE(from_survivors().empty()) << log_tail(read_file(dir_ + "/job.log"));
  EXPECT_NE(read_file(dir_ + "/job.log").find("from local memory (node 0) (no disk read)"),
            std::string::npos)
      << log_tail(read_file(dir_ + "/job.log"));
}

// The launcher's pid as the parent of `pid` (field 4 of /proc/<pid>/stat), or -1.
pid_t parent_of(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  char state = 0;
  int ppid = -1;
  if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return -1;
  return ppid;
}

// --spare-start fork (the default): one fork server loads and builds once, each spare is a fork
// of it, adopted by the launcher (its parent), and takes over as any spare. When the server is
// killed, the next spare is started with exec, and the job still ends bitwise.
TEST_F(LaunchSpares, SparesAreForkedFromOneServerAndExecWhenItIsLost) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  launcher_flags_ = {"--spare-start", "fork"};
  Process p = start(2, 1);
  ASSERT_TRUE(wait_for_state(p, 2, 2, 1)) << log_tail(read_file(dir_ + "/job.log"));
  auto all = all_events();
  const std::set<pid_t> servers = spare_fork_servers(all);
  ASSERT_EQ(servers.size(), 1u) << log_tail(read_file(dir_ + "/job.log"));
  const pid_t server = *servers.begin();
  const auto started = of_kind(all, "spare_started");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].value("from", ""), "fork-server") << started[0].dump();
  const pid_t forked = started[0].value("pid", -1);
  EXPECT_EQ(parent_of(forked), p.pid) << "the forked spare is not the launcher's child";
  EXPECT_EQ(parent_of(server), p.pid);

  ASSERT_EQ(kill(server, SIGKILL), 0);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && !spare_fork_servers(all_events()).empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(spare_fork_servers(all_events()).empty()) << "the server's loss was not noticed";
  // The forked spare takes over; its replacement, and the next one's, are started with exec.
  std::mt19937 rng(808);
  const int kills = kill_rounds(p, 2, 1, 2, 1, rng, 50, 250);
  ASSERT_EQ(kills, 2) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  EXPECT_EQ(taken_, kills) << log_tail(read_file(dir_ + "/job.log"));
  all = all_events();
  const auto takeovers = of_kind(all, "spare_takeover");
  ASSERT_EQ(takeovers.size(), 2u);
  EXPECT_EQ(takeovers[0].value("pid", -1), forked) << takeovers[0].dump();
  const auto later = of_kind(all, "spare_started");
  ASSERT_GE(later.size(), 3u);
  for (size_t i = 1; i < later.size(); ++i) {
    EXPECT_FALSE(later[i].contains("from")) << later[i].dump();
  }
  bool lost = false;
  for (const auto& e : of_kind(all, "spare_fork_server")) lost |= e.value("state", "") == "lost";
  EXPECT_TRUE(lost);
  EXPECT_TRUE(of_kind(all, "spare_lost").empty()) << "the server's loss is no spare's";
  EXPECT_EQ(read_file(dir_ + "/job.log").find("was not re-parented"), std::string::npos);
}

// A spare started once snapshots exist makes its first snapshot slots while it stands by
// (sized as the workers' snapshots, beside their directories) and takes them when it takes over
// a rank; the job still ends bitwise equal to the reference. The first spare, started with the
// job before any snapshot, has nothing to size them by.
TEST_F(LaunchSpares, ASpareMakesItsSnapshotSlotsWhileStandingBy) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  Process p = start(2, 1);
  std::mt19937 rng(2718);
  ASSERT_EQ(kill_rounds(p, 2, 1, 1, 1, rng, 50, 100), 1) << log_tail(read_file(dir_ + "/job.log"));
  // Spare 1, started after that takeover: its slots (kSnapshotsKept + 1 = 7) appear at nice 19.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && standby_slot_files() < 7) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(standby_slot_files(), 7) << log_tail(read_file(dir_ + "/job.log"));
  ASSERT_EQ(kill_rounds(p, 2, 1, 1, 1, rng, 50, 100), 1) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, 2);
  check_taken_over(2, 2);
  const std::string log = read_file(dir_ + "/job.log");
  EXPECT_NE(log.find("snapshot slots made while standing by"), std::string::npos) << log_tail(log);
}

// --spare-start exec: each spare is a process of its own.
TEST_F(LaunchSpares, ExecStartedSpares) {
  const std::string& ref = reference(2);
  ASSERT_FALSE(ref.empty()) << "no reference result";
  launcher_flags_ = {"--spare-start", "exec"};
  Process p = start(2, 1);
  std::mt19937 rng(99);
  const int kills = kill_rounds(p, 2, 1, 2, 1, rng, 50, 250);
  ASSERT_EQ(kills, 2) << log_tail(read_file(dir_ + "/job.log"));
  check_bitwise(p, 2, ref, kills);
  check_taken_over(kills, 2);
  const auto all = all_events();
  EXPECT_TRUE(of_kind(all, "spare_fork_server").empty());
  for (const auto& e : of_kind(all, "spare_started")) EXPECT_FALSE(e.contains("from")) << e.dump();
}

// --spares is checked before anything starts, naming the flag.
TEST(LaunchSparesFlags, BadValuesAreUsageErrors) {
  const std::string dir = make_temp_dir();
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--spares", "-1"}, std::vector<std::string>{"--spares", "65"},
        std::vector<std::string>{"--spares", "1", "--snapshot-every", "0"},
        std::vector<std::string>{"--spares", "1", "--rdzv", "file:///tmp/x"}}) {
    std::vector<std::string> a = {kDtrain, "launch"};
    a.insert(a.end(), flags.begin(), flags.end());
    a.insert(a.end(), {"--", "true"});
    Process p = spawn(a, {}, dir + "/log");
    EXPECT_EQ(wait_for(p, Clock::now() + std::chrono::seconds(30)), 2) << read_file(dir + "/log");
    EXPECT_NE(read_file(dir + "/log").find("--spares"), std::string::npos)
        << read_file(dir + "/log");
  }
  {
    Process p = spawn({kDtrain, "launch", "--spares", "1", "--spare-start", "clone", "--", "true"},
                      {}, dir + "/log");
    EXPECT_EQ(wait_for(p, Clock::now() + std::chrono::seconds(30)), 2) << read_file(dir + "/log");
    EXPECT_NE(read_file(dir + "/log").find("--spare-start 'clone' must be fork or exec"),
              std::string::npos)
        << read_file(dir + "/log");
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
