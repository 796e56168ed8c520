// Elastic training with real fits (the fit_worker program, Model::fit under
// MultiWorkerMirroredStrategy with 6 logical replicas): three launchers on 127.0.0.1, one worker
// each, `dtrain launch --nnodes 2:3`. Node 2's whole launcher is SIGKILLed mid-epoch, so the job
// shrinks 3 → 2 and resumes from a snapshot taken by 3 workers; a fresh launcher for node 2 then
// joins, so the job grows 2 → 3 and resumes from a snapshot taken by 2. The final model and
// optimizer variables are bitwise those of an uninterrupted run (MirroredStrategy(6) in one
// process), and the rows each step trained on (every worker's per-step log) are the
// uninterrupted run's: across both changes every row is used exactly once per epoch. Every wait
// is bounded; nothing is asserted about wall-clock time.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chaos.h"
#include "testutil/free_port.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kDtrain = DTRAIN_BINARY;
const std::string kWorker = DTRAIN_FIT_WORKER;
// 384 rows in global batches of 12 (2 rows per logical replica): 32 steps per epoch.
constexpr int64_t kEpochs = 3, kSteps = 32, kRows = 384;

std::vector<std::string> fit_flags() {
  return {"--batch-size", "12", "--epochs", std::to_string(kEpochs), "--dropout", "1"};
}

std::string tail(const std::string& s) { return s.substr(s.size() > 6000 ? s.size() - 6000 : 0); }

// "epoch step hash" lines → rows[(epoch, step)] in order.
using Rows = std::map<std::pair<int64_t, int64_t>, std::vector<uint64_t>>;
Rows parse_rows(std::istream& in) {
  Rows rows;
  int64_t e, s;
  uint64_t h;
  while (in >> e >> s >> h) rows[{e, s}].push_back(h);
  return rows;
}

// One worker process's per-step log (fit_worker --rows-log): PREFIX.g<generation>.r<rank>,
// "epoch step replica hash" lines → rows[(epoch, step)][logical replica] in order.
struct WorkerLog {
  int64_t generation = 0;
  int rank = 0;
  int world = 0;
  std::map<std::pair<int64_t, int64_t>, std::map<int, std::vector<uint64_t>>> rows;
};

std::vector<WorkerLog> read_logs(const fs::path& dir) {
  std::vector<WorkerLog> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    int64_t g = 0;
    int r = 0;
    if (std::sscanf(name.c_str(), "rows.g%ld.r%d", &g, &r) != 2) continue;
    std::ifstream in(f.path());
    std::string word;
    WorkerLog log;
    log.generation = g;
    log.rank = r;
    if (!(in >> word >> log.world) || word != "world") continue;
    int64_t e, s;
    int replica;
    uint64_t h;
    while (in >> e >> s >> replica >> h) log.rows[{e, s}][replica].push_back(h);
    out.push_back(std::move(log));
  }
  return out;
}

// The furthest global step (epoch · kSteps + step) that a worker of a `world`-worker generation
// has finished, or -1.
int64_t progress(const fs::path& dir, int world) {
  int64_t best = -1;
  for (const WorkerLog& log : read_logs(dir)) {
    if (log.world != world || log.rows.empty()) continue;
    const auto& [e, s] = log.rows.rbegin()->first;
    best = std::max(best, e * kSteps + s);
  }
  return best;
}

class LaunchElasticFit : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override {
    if (!HasFailure()) std::system(("rm -rf " + dir_).c_str());
  }

  std::vector<std::string> node(int n) const {
    std::vector<std::string> a = {kDtrain,
                                  "launch",
                                  "--nnodes",
                                  "2:3",
                                  "--node-rank",
                                  std::to_string(n),
                                  "--nproc-per-node",
                                  "1",
                                  "--rdzv",
                                  rdzv_,
                                  "--rdzv-timeout",
                                  "60",
                                  "--rdzv-settle",
                                  "3",
                                  "--heartbeat-timeout",
                                  "3",
                                  "--max-restarts",
                                  "6",
                                  "--grace-period",
                                  "2",
                                  "--snapshot-every",
                                  "1",
                                  "--snapshot-root",
                                  dir_ + "/shm" + std::to_string(n),
                                  "--event-log",
                                  events_path(n),
                                  "--",
                                  kWorker,
                                  "--mode",
                                  "multi-worker",
                                  "--logical-replicas",
                                  "6",
                                  "--out",
                                  dir_ + "/out.bin",
                                  "--rows-log",
                                  dir_ + "/rows",
                                  "--checkpoint-dir",
                                  dir_ + "/ckpt",
                                  "--checkpoint-every",
                                  "10000",
                                  "--step-delay-us",
                                  "60000"};
    for (const std::string& f : fit_flags()) a.push_back(f);
    return a;
  }
  std::string events_path(int n) const { return dir_ + "/events" + std::to_string(n) + ".jsonl"; }

  std::string dir_;
  std::string rdzv_ = "127.0.0.1:" + std::to_string(testutil::free_port());
};

TEST_F(LaunchElasticFit, ShrinksAndGrowsMidEpochWithBitwiseEqualWeightsAndEveryRowOnce) {
  // The uninterrupted run, and the rows of each of its steps.
  std::vector<std::string> ref_argv = {kWorker,           "--mode",     "mirrored",
                                       "--replicas",      "6",          "--out",
                                       dir_ + "/ref.bin", "--rows-out", dir_ + "/ref.rows"};
  for (const std::string& f : fit_flags()) ref_argv.push_back(f);
  Process ref = spawn(ref_argv, {}, dir_ + "/ref.log");
  ASSERT_EQ(wait_for(ref, Clock::now() + std::chrono::seconds(120)), 0) << read_file(ref.log);
  const std::string reference = read_file(dir_ + "/ref.bin");
  ASSERT_FALSE(reference.empty());
  std::ifstream ref_rows_in(dir_ + "/ref.rows");
  const Rows ref_rows = parse_rows(ref_rows_in);
  ASSERT_EQ(ref_rows.size(), static_cast<size_t>(kEpochs * kSteps));

  Process n0 = spawn(node(0), {}, dir_ + "/n0.log");
  Process n1 = spawn(node(1), {}, dir_ + "/n1.log");
  Process n2 = spawn(node(2), {}, dir_ + "/n2.log");
  const auto logs = [&] {
    return "node 0:\n" + tail(read_file(n0.log)) + "\nnode 1:\n" + tail(read_file(n1.log)) +
           "\nnode 2:\n" + tail(read_file(n2.log));
  };
  // (1) Shrink: node 2's launcher (and with it its worker) is killed in the first epoch.
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (progress(dir_, 3) < 8 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(progress(dir_, 3), 8) << logs();
  ASSERT_EQ(kill(n2.pid, SIGKILL), 0);
  EXPECT_EQ(wait_for(n2, Clock::now() + std::chrono::seconds(10)), 128 + SIGKILL);
  // (2) Grow: once the two survivors train, a fresh launcher for node 2 joins.
  deadline = Clock::now() + std::chrono::seconds(120);
  while (progress(dir_, 2) < kSteps + 2 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(progress(dir_, 2), kSteps + 2) << logs();
  Process again = spawn(node(2), {}, dir_ + "/n2-again.log");
  const auto all_logs = [&] { return logs() + "\nnode 2 again:\n" + tail(read_file(again.log)); };
  ASSERT_EQ(wait_for(n0, Clock::now() + std::chrono::seconds(180)), 0) << all_logs();
  ASSERT_EQ(wait_for(n1, Clock::now() + std::chrono::seconds(30)), 0) << all_logs();
  ASSERT_EQ(wait_for(again, Clock::now() + std::chrono::seconds(30)), 0) << all_logs();

  // The last generation had 3 workers; each ends with the uninterrupted run's variables.
  for (int r = 0; r < 3; ++r) {
    const std::string mine = read_file(dir_ + "/out.bin.rank" + std::to_string(r));
    ASSERT_EQ(mine.size(), reference.size()) << "rank " << r << "\n" << all_logs();
    EXPECT_TRUE(mine == reference)
        << "rank " << r << ": variables differ from the uninterrupted run";
  }

  // Generations in order: 3 workers, then 2 (shrunk), then 3 (grown), each resuming from a
  // snapshot of the other world size (rank 0's, from memory).
  std::map<int64_t, std::vector<const WorkerLog*>> generations;
  const std::vector<WorkerLog> worker_logs = read_logs(dir_);
  for (const WorkerLog& log : worker_logs) generations[log.generation].push_back(&log);
  struct Gen {
    int64_t number;
    int world;
    std::pair<int64_t, int64_t> first;  // the first (epoch, step) it trained
  };
  std::vector<Gen> trained;
  for (const auto& [g, members] : generations) {
    if (members[0]->rows.empty()) continue;  // started, trained nothing
    trained.push_back({g, members[0]->world, members[0]->rows.begin()->first});
  }
  bool shrunk = false, grown = false;
  for (size_t i = 1; i < trained.size(); ++i) {
    std::printf("generation %ld: %d workers from epoch %ld step %ld\n", trained[i].number,
                trained[i].world, trained[i].first.first, trained[i].first.second);
    if (trained[i - 1].world == 3 && trained[i].world == 2) {
      shrunk = true;
      EXPECT_GT(trained[i].first.second, 0) << "the shrink did not resume mid-epoch";
    }
    if (shrunk && trained[i - 1].world == 2 && trained[i].world == 3) grown = true;
  }
  EXPECT_TRUE(shrunk && grown) << "the job did not shrink 3 -> 2 and grow 2 -> 3\n" << all_logs();
  EXPECT_EQ(trained.back().world, 3);
  std::vector<nlohmann::json> restores;
  for (int n = 0; n < 3; ++n) {
    for (const auto& e : of_kind(events(events_path(n)), "snapshot_restore")) restores.push_back(e);
  }
  int resized = 0;
  for (const auto& e : restores) {
    std::printf("%s\n", e.value("message", "").c_str());
    if (e.contains("snapshot_of")) ++resized;
  }
  EXPECT_GE(resized, 2) << "no restore took a snapshot of another world size\n" << all_logs();

  // Sample accounting: generation i trained the steps from its first one to the first of any
  // later generation (where that one resumed); each of those steps' rows, from every worker of
  // the generation, in logical replica order, are the uninterrupted run's rows of the step, and
  // each epoch uses every row once.
  std::map<std::pair<int64_t, int64_t>, std::vector<uint64_t>> used;
  for (size_t i = 0; i < trained.size(); ++i) {
    const auto begin = trained[i].first;
    std::pair<int64_t, int64_t> end{kEpochs, 0};  // superseded where a later one resumed
    for (size_t j = i + 1; j < trained.size(); ++j) end = std::min(end, trained[j].first);
    std::map<std::pair<int64_t, int64_t>, std::map<int, std::vector<uint64_t>>> joined;
    for (const WorkerLog* log : generations[trained[i].number]) {
      for (const auto& [step, replicas] : log->rows) {
        if (step < begin || step >= end) continue;
        for (const auto& [replica, rows] : replicas) {
          EXPECT_TRUE(joined[step].emplace(replica, rows).second)
              << "two workers computed logical replica " << replica;
        }
      }
    }
    for (const auto& [step, replicas] : joined) {
      EXPECT_EQ(replicas.size(), 6u) << "generation " << trained[i].number << " epoch "
                                     << step.first << " step " << step.second;
      for (const auto& [replica, rows] : replicas) {
        used[step].insert(used[step].end(), rows.begin(), rows.end());
      }
    }
  }
  for (int64_t e = 0; e < kEpochs; ++e) {
    std::multiset<uint64_t> epoch_rows;
    for (int64_t s = 0; s < kSteps; ++s) {
      const auto it = used.find({e, s});
      ASSERT_NE(it, used.end()) << "no generation trained epoch " << e << " step " << s;
      EXPECT_EQ(it->second, ref_rows.at({e, s})) << "epoch " << e << " step " << s;
      epoch_rows.insert(it->second.begin(), it->second.end());
    }
    EXPECT_EQ(epoch_rows.size(), static_cast<size_t>(kRows)) << "epoch " << e;
    EXPECT_EQ(std::set<uint64_t>(epoch_rows.begin(), epoch_rows.end()).size(),
              static_cast<size_t>(kRows))
        << "a row was trained on twice in epoch " << e;
  }
}

}  // namespace
}  // namespace dtrain::testing
