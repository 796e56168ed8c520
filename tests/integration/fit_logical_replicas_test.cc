// Logical replicas (MultiWorkerOptions::logical_replicas) with real processes on loopback: a fit
// over L = 6 logical replicas gives bitwise the same model and optimizer variables on 1, 2, 3
// and 4 workers (4: uneven blocks 2, 2, 1, 1) as MirroredStrategy(6) in one process, with
// Dropout and a partial last batch; the workers together train on every row of an epoch once,
// each logical replica on the rows the single process's replica trains on; with
// BatchNormalization and SyncBatchNormalization the weights and the moving statistics are
// bitwise the same on 1, 2, 3 and 6 workers, and across 3 -> 1 -> 2 workers resumed from
// mid-epoch backups; bad counts are refused with a clear error.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

struct Job {
  std::vector<int> codes;
  std::vector<std::string> outs, logs, rows;
};

// Runs `processes` fit_worker processes (TF_CONFIG for multi-worker) to the end.
Job run(const std::string& dir, const std::string& name, const std::string& mode, int processes,
        const std::vector<std::string>& extra) {
  std::vector<int> ports;
  for (int i = 0; i < processes; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < processes; ++i) {
    const std::string base = dir + "/" + name + std::to_string(i);
    std::vector<std::string> argv = {kWorker,       "--mode",     mode,          "--out",
                                     base + ".bin", "--rows-out", base + ".rows"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::map<std::string, std::string> env;
    if (mode == "multi-worker") env["TF_CONFIG"] = tf_config(ports, i);
    procs.push_back(spawn(argv, env, base + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  Job r;
  for (int i = 0; i < processes; ++i) {
    const std::string base = dir + "/" + name + std::to_string(i);
    r.codes.push_back(wait_for(procs[i], deadline));
    r.logs.push_back(read_file(procs[i].log));
    r.outs.push_back(read_file(base + ".bin"));
    r.rows.push_back(read_file(base + ".rows"));
  }
  return r;
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

class FitLogicalReplicas : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

// 384 rows in global batches of 60 (6 full steps and one of 24: 4 rows per logical replica).
const std::vector<std::string> kFlags = {"--epochs", "2", "--batch-size", "60", "--dropout", "1"};
constexpr int64_t kSteps = 7, kRows = 384;

TEST_F(FitLogicalReplicas, BitwiseEqualOnAnyWorkerCountAndEveryRowOncePerEpoch) {
  std::vector<std::string> mirrored_flags = kFlags;
  mirrored_flags.insert(mirrored_flags.end(), {"--replicas", "6"});
  const Job mirrored = run(dir_, "mirrored", "mirrored", 1, mirrored_flags);
  ASSERT_EQ(mirrored.codes[0], 0) << mirrored.logs[0];
  ASSERT_FALSE(mirrored.outs[0].empty());
  const Rows single = parse_rows(mirrored.rows[0]);
  ASSERT_EQ(single.size(), static_cast<size_t>(2 * kSteps));
  for (int64_t e = 0; e < 2; ++e) {
    std::set<uint64_t> epoch_rows;
    for (int64_t s = 0; s < kSteps; ++s) {
      epoch_rows.insert(single.at({e, s}).begin(), single.at({e, s}).end());
    }
    ASSERT_EQ(epoch_rows.size(), static_cast<size_t>(kRows)) << "the data's rows are not distinct";
  }

  std::vector<std::string> flags = kFlags;
  flags.insert(flags.end(), {"--logical-replicas", "6"});
  for (int workers : {1, 2, 3, 4}) {
    SCOPED_TRACE(std::to_string(workers) + " workers");
    const std::string name = "w" + std::to_string(workers) + "_";
    const Job r = run(dir_, name, "multi-worker", workers, flags);
    std::vector<Rows> per_worker;
    for (int w = 0; w < workers; ++w) {
      ASSERT_EQ(r.codes[w], 0) << r.logs[w];
      EXPECT_NE(r.logs[w].find("replicas in sync 6"), std::string::npos) << r.logs[w];
      ASSERT_EQ(r.outs[w].size(), mirrored.outs[0].size());
      EXPECT_TRUE(r.outs[w] == mirrored.outs[0])
          << "worker " << w << " of " << workers
          << ": variables differ from MirroredStrategy(6) in one process";
      per_worker.push_back(parse_rows(r.rows[w]));
    }
    // Every step: the workers' rows, in rank order, are the single process's global batch (the
    // logical replicas' rows in logical order); each epoch uses every row once.
    for (int64_t e = 0; e < 2; ++e) {
      std::multiset<uint64_t> epoch_rows;
      for (int64_t s = 0; s < kSteps; ++s) {
        std::vector<uint64_t> joined;
        for (int w = 0; w < workers; ++w) {
          const auto it = per_worker[w].find({e, s});
          ASSERT_NE(it, per_worker[w].end()) << "worker " << w << " epoch " << e << " step " << s;
          joined.insert(joined.end(), it->second.begin(), it->second.end());
        }
        EXPECT_EQ(joined, single.at({e, s})) << "epoch " << e << " step " << s;
        epoch_rows.insert(joined.begin(), joined.end());
      }
      EXPECT_EQ(epoch_rows.size(), static_cast<size_t>(kRows)) << "epoch " << e;
      EXPECT_EQ(std::set<uint64_t>(epoch_rows.begin(), epoch_rows.end()).size(),
                static_cast<size_t>(kRows))
          << "a row was trained on twice in epoch " << e;
    }
    // Uneven blocks: worker 0 of 4 holds logical replicas 0 and 1 (20 rows of a full batch),
    // worker 3 one (10 rows; 4 of the last batch).
    if (workers == 4) {
      EXPECT_EQ(per_worker[0].at({0, 0}).size(), 20u);
      EXPECT_EQ(per_worker[3].at({0, 0}).size(), 10u);
      EXPECT_EQ(per_worker[3].at({0, kSteps - 1}).size(), 4u);
    }
  }
}

// Every logical replica normalizes its own rows (BatchNormalization) or the global batch
// (SyncBatchNormalization), and the moving statistics' updates are summed in logical order: the
// weights, the moving mean and variance and the optimizer's slots are bitwise those of
// MirroredStrategy(6) in one process for W = 1, 2, 3, 6 (6: one replica per worker; before, the
// per-worker sums rode the all-reduce, and the moving statistics differed in the last bits between
// world sizes).
TEST_F(FitLogicalReplicas, BatchNormalizationIsBitwiseOnAnyWorkerCount) {
  for (const std::string bn : {"--bn", "--sync-bn"}) {
    SCOPED_TRACE(bn);
    std::vector<std::string> base = {"--epochs", "2", "--batch-size", "60", bn, "1"};
    std::vector<std::string> mirrored_flags = base;
    mirrored_flags.insert(mirrored_flags.end(), {"--replicas", "6"});
    const Job mirrored = run(dir_, "bn_mirrored", "mirrored", 1, mirrored_flags);
    ASSERT_EQ(mirrored.codes[0], 0) << mirrored.logs[0];
    ASSERT_FALSE(mirrored.outs[0].empty());
    std::vector<std::string> flags = base;
    flags.insert(flags.end(), {"--logical-replicas", "6"});
    for (int workers : {1, 2, 3, 6}) {
      SCOPED_TRACE(std::to_string(workers) + " workers");
      const Job r =
          run(dir_, "bn_w" + std::to_string(workers) + "_", "multi-worker", workers, flags);
      for (int w = 0; w < workers; ++w) {
        ASSERT_EQ(r.codes[w], 0) << r.logs[w];
        ASSERT_EQ(r.outs[w].size(), mirrored.outs[0].size());
        EXPECT_TRUE(r.outs[w] == mirrored.outs[0])
            << "worker " << w << " of " << workers
            << ": variables (moving statistics included) differ from MirroredStrategy(6)";
      }
    }
  }
}

// Resizing mid-epoch through the backups (every 2 steps; 7 steps per epoch): 3 workers stop
// before step 9 (epoch 1), 1 worker resumes from the chief's backup and stops 6 steps later
// (epoch 2), 2 workers finish. With BatchNormalization, every variable (moving statistics
// included) ends bitwise as MirroredStrategy(6)'s uninterrupted run (one worker reads the global
// batches, the others their rows of them: the same position in the same order).
TEST_F(FitLogicalReplicas, ShrinksToOneWorkerAndGrowsBackExactly) {
  const std::vector<std::string> base = {"--epochs", "3", "--batch-size", "60", "--bn", "1"};
  std::vector<std::string> mirrored_flags = base;
  mirrored_flags.insert(mirrored_flags.end(), {"--replicas", "6"});
  const Job mirrored = run(dir_, "resize_mirrored", "mirrored", 1, mirrored_flags);
  ASSERT_EQ(mirrored.codes[0], 0) << mirrored.logs[0];
  std::vector<std::string> flags = base;
  flags.insert(flags.end(), {"--logical-replicas", "6", "--checkpoint-dir", dir_ + "/resize_ckpt",
                             "--checkpoint-every", "2"});
  struct Phase {
    int workers;
    int exit_at_step;  // -1: run to the end
  };
  int i = 0;
  for (const Phase& p : {Phase{3, 9}, Phase{1, 6}, Phase{2, -1}}) {
    SCOPED_TRACE(std::to_string(p.workers) + " workers");
    std::vector<std::string> f = flags;
    if (p.exit_at_step >= 0) f.insert(f.end(), {"--exit-at-step", std::to_string(p.exit_at_step)});
    const Job r = run(dir_, "resize" + std::to_string(i++) + "_", "multi-worker", p.workers, f);
    for (int w = 0; w < p.workers; ++w) {
      ASSERT_EQ(r.codes[w], p.exit_at_step >= 0 ? 3 : 0) << r.logs[w];
      if (i > 1 && w == 0) {
        EXPECT_NE(r.logs[w].find("BackupAndRestore: resumed"), std::string::npos) << r.logs[w];
      }
      if (p.exit_at_step >= 0) continue;
      ASSERT_EQ(r.outs[w].size(), mirrored.outs[0].size());
      EXPECT_TRUE(r.outs[w] == mirrored.outs[0])
          << "worker " << w << " of " << p.workers
          << ": variables after 3 -> 1 -> 2 workers differ from MirroredStrategy(6)";
    }
  }
}

TEST_F(FitLogicalReplicas, RefusesCountsThatDoNotFit) {
  struct Bad {
    int workers;
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {1, {"--logical-replicas", "7", "--batch-size", "60"}, "batch_size 60 does not split into 7"},
      {1, {"--logical-replicas", "6", "--batch-size", "4"}, "batch_size 4 does not split into 6"},
      {3, {"--logical-replicas", "2"}, "3 workers (from TF_CONFIG) for logical_replicas 2"},
      {1, {"--logical-replicas", "-1"}, "logical_replicas is -1, must be >= 1"},
      {1, {"--logical-replicas", "2", "--replicas", "2"}, "excludes local_replicas"},
  };
  int i = 0;
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.message);
    std::vector<std::string> flags = {"--epochs", "1"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    const Job r = run(dir_, "bad" + std::to_string(i++) + "_", "multi-worker", c.workers, flags);
    for (int w = 0; w < c.workers; ++w) {
      EXPECT_EQ(r.codes[w], 1) << r.logs[w];
      EXPECT_NE(r.logs[w].find("INVALID_ARGUMENT"), std::string::npos) << r.logs[w];
      EXPECT_NE(r.logs[w].find(c.message), std::string::npos) << r.logs[w];
    }
  }
}

}  // namespace
}  // namespace dtrain::testing
