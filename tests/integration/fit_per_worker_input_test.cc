// Per-worker input (distribute::worker_batches) under Model::fit(x, y) with real processes on
// loopback: the workers together train on every row of each epoch exactly once, each worker on
// its slice of the global batch the single process trains on, and the final variables are
// bitwise those of fit(dataset) on the global batches (every worker materialising them).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

// Runs `processes` fit_worker processes (TF_CONFIG for multi-worker); returns their outputs.
std::vector<std::string> run(const std::string& dir, const std::string& name,
                             const std::string& mode, int processes,
                             std::vector<std::string> extra = {}) {
  std::vector<int> ports;
  for (int i = 0; i < processes; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < processes; ++i) {
    const std::string base = dir + "/" + name + std::to_string(i);
    std::vector<std::string> argv = {kWorker, "--mode", mode, "--out", base + ".bin"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (std::string& a : argv) {
      if (a == "ROWS") a = base + ".rows";
    }
    std::map<std::string, std::string> env;
    if (mode == "multi-worker") env["TF_CONFIG"] = tf_config(ports, i);
    procs.push_back(spawn(argv, env, base + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<std::string> outs;
  for (int i = 0; i < processes; ++i) {
    const int code = wait_for(procs[i], deadline);
    EXPECT_EQ(code, 0) << name << " process " << i << ":\n" << read_file(procs[i].log);
    outs.push_back(read_file(dir + "/" + name + std::to_string(i) + ".bin"));
  }
  return outs;
}

// "epoch step hash" lines → rows[(epoch, step)] in order.
using Rows = std::map<std::pair<int64_t, int64_t>, std::vector<uint64_t>>;
Rows parse_rows(const std::string& text) {
  Rows rows;
  std::istringstream in(text);
  int64_t e, s;
  uint64_t h;
  while (in >> e >> s >> h) rows[{e, s}].push_back(h);
  return rows;
}

class FitPerWorkerInput : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

// 384 rows in global batches of 50 (the last one 34) over 2 and 3 workers: every global batch
// is the single process's, split in worker order; each epoch covers every row once.
TEST_F(FitPerWorkerInput, WorkersTrainOnTheSingleProcessRowsEachOnce) {
  const std::vector<std::string> flags = {"--epochs", "2",          "--batch-size",
                                          "50",       "--rows-out", "ROWS"};
  run(dir_, "single", "single", 1, flags);
  const Rows single = parse_rows(read_file(dir_ + "/single0.rows"));
  ASSERT_EQ(single.size(), 2u * 8u);  // ceil(384 / 50) = 8 steps per epoch
  for (int64_t e = 0; e < 2; ++e) {
    std::set<uint64_t> epoch_rows;
    size_t count = 0;
    for (int64_t s = 0; s < 8; ++s) {
      epoch_rows.insert(single.at({e, s}).begin(), single.at({e, s}).end());
      count += single.at({e, s}).size();
    }
    ASSERT_EQ(count, 384u);
    ASSERT_EQ(epoch_rows.size(), 384u) << "the data's rows are not distinct";
  }
  for (int workers : {2, 3}) {
    SCOPED_TRACE(std::to_string(workers) + " workers");
    const std::string name = "mw" + std::to_string(workers) + "_";
    run(dir_, name, "multi-worker", workers, flags);
    std::vector<Rows> per_worker;
    for (int w = 0; w < workers; ++w) {
      per_worker.push_back(parse_rows(read_file(dir_ + "/" + name + std::to_string(w) + ".rows")));
    }
    for (int64_t e = 0; e < 2; ++e) {
      std::multiset<uint64_t> union_rows, single_rows;
      for (int64_t s = 0; s < 8; ++s) {
        std::vector<uint64_t> joined;
        for (int w = 0; w < workers; ++w) {
          const auto it = per_worker[w].find({e, s});
          if (it == per_worker[w].end()) continue;  // (never: every worker has rows here)
          joined.insert(joined.end(), it->second.begin(), it->second.end());
        }
        EXPECT_EQ(joined, single.at({e, s})) << "epoch " << e << " step " << s;
        union_rows.insert(joined.begin(), joined.end());
        single_rows.insert(single.at({e, s}).begin(), single.at({e, s}).end());
      }
      EXPECT_EQ(union_rows, single_rows) << "epoch " << e;
      EXPECT_EQ(union_rows.size(), 384u);
      EXPECT_EQ(std::set<uint64_t>(union_rows.begin(), union_rows.end()).size(), 384u)
          << "a row was trained on twice in epoch " << e;
    }
    // Worker 0 of 2 takes 25 rows of a full batch and 17 of the last one.
    if (workers == 2) {
      EXPECT_EQ(per_worker[0].at({0, 0}).size(), 25u);
      EXPECT_EQ(per_worker[0].at({0, 7}).size(), 17u);
    }
  }
}

// The final model and optimizer variables with per-worker input are bitwise those of fit on the
// global batches (today's path), for 2 workers, 3 workers and 2 workers x 2 replicas, with a
// partial last batch.
TEST_F(FitPerWorkerInput, FinalVariablesBitwiseEqualToGlobalBatches) {
  for (const auto& [workers, replicas] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}}) {
    SCOPED_TRACE(std::to_string(workers) + " workers x " + std::to_string(replicas));
    const std::vector<std::string> flags = {"--epochs", "2",          "--batch-size",
                                            "50",       "--replicas", std::to_string(replicas)};
    const std::string tag = std::to_string(workers) + "x" + std::to_string(replicas);
    const auto mine = run(dir_, "pw" + tag + "_", "multi-worker", workers, flags);
    std::vector<std::string> global_flags = flags;
    global_flags.insert(global_flags.end(), {"--input", "dataset"});
    const auto global = run(dir_, "gb" + tag + "_", "multi-worker", workers, global_flags);
    ASSERT_EQ(mine.size(), static_cast<size_t>(workers));
    ASSERT_FALSE(mine[0].empty());
    for (int w = 0; w < workers; ++w) {
      EXPECT_EQ(mine[w], mine[0]) << "worker " << w << " diverged";
      EXPECT_EQ(mine[w], global[w]) << "worker " << w << ": per-worker input changed the result";
    }
  }
}

}  // namespace
}  // namespace dtrain::testing
