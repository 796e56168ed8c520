// fit(save_checkpoints, sharded_checkpoints) under MultiWorkerMirroredStrategy with real
// processes: two workers write sharded backups (num_shards = 2, the trainable variables and
// their slots as slices); a job of three workers, and a single process, resume from them and end
// bitwise where they end when resuming from an unsharded backup of the same run.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "distribute_process.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kWorker = DTRAIN_FIT_WORKER;

// Runs `processes` fit workers (0: one process in single mode) with `flags`; expects each to
// exit with `code`; returns their output files (the final variables).
std::vector<std::string> run(const std::string& dir, const std::string& name, int processes,
                             const std::vector<std::string>& flags, int code) {
  std::vector<int> ports;
  for (int i = 0; i < processes; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  const int n = std::max(processes, 1);
  for (int i = 0; i < n; ++i) {
    const std::string base = dir + "/" + name + std::to_string(i);
    std::vector<std::string> argv = {kWorker, "--mode", processes ? "multi-worker" : "single",
                                     "--out", base + ".bin"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::map<std::string, std::string> env;
    if (processes) env["TF_CONFIG"] = tf_config(ports, i);
    procs.push_back(spawn(argv, env, base + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<std::string> outs;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(wait_for(procs[i], deadline), code) << name << " process " << i << ":\n"
                                                  << read_file(procs[i].log);
    outs.push_back(read_file(dir + "/" + name + std::to_string(i) + ".bin"));
  }
  return outs;
}

TEST(FitShardedCheckpoint, ShardedBackupsResumeOnAnotherWorldSizeBitwiseAsUnshardedOnes) {
  const std::string dir = make_temp_dir();
  const std::vector<std::string> common = {"--epochs", "3", "--checkpoint-every", "4"};
  auto flags = [&](const std::string& backup_dir, bool sharded, int exit_at) {
    std::vector<std::string> f = common;
    f.insert(f.end(), {"--checkpoint-dir", backup_dir});
    if (sharded) f.insert(f.end(), {"--sharded-checkpoints", "1"});
    if (exit_at >= 0) f.insert(f.end(), {"--exit-at-epoch", std::to_string(exit_at)});
    return f;
  };
  // Two workers train one epoch and stop, keeping their backups: sharded and unsharded.
  run(dir, "a", 2, flags(dir + "/sharded", true, 1), 3);
  run(dir, "c", 2, flags(dir + "/plain", false, 1), 3);
  const std::optional<std::string> latest = checkpoint::latest_checkpoint(dir + "/sharded");
  ASSERT_TRUE(latest.has_value());
  {
    checkpoint::BundleReader r(*latest);
    EXPECT_EQ(r.num_shards(), 2);
    int partitioned = 0;
    for (const std::string& key : r.keys()) partitioned += r.entry(key).partitioned ? 1 : 0;
    EXPECT_GT(partitioned, 0);
  }
  ASSERT_TRUE(checkpoint::latest_checkpoint(dir + "/plain").has_value());
  EXPECT_EQ(checkpoint::BundleReader(*checkpoint::latest_checkpoint(dir + "/plain")).num_shards(),
            1);
  // The resumed runs delete their backups when they finish: each resumes from its own copy.
  for (const char* copy : {"sharded_1", "plain_1"}) {
    fs::copy(dir + "/" + std::string(copy).substr(0, std::string(copy).size() - 2),
             dir + "/" + copy, fs::copy_options::recursive);
  }
  // 2 -> 3 workers, and 2 -> 1 process: the same end state from either backup.
  const auto b = run(dir, "b", 3, flags(dir + "/sharded", true, -1), 0);
  const auto d = run(dir, "d", 3, flags(dir + "/plain", false, -1), 0);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_NE(read_file(dir + "/b2.log").find("resumed from"), std::string::npos)
      << read_file(dir + "/b2.log");
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(b[i].empty());
    EXPECT_EQ(b[i], d[i]) << "worker " << i;
    EXPECT_EQ(b[i], b[0]) << "worker " << i;
  }
  const auto e = run(dir, "e", 0, flags(dir + "/sharded_1", false, -1), 0);
  const auto f = run(dir, "f", 0, flags(dir + "/plain_1", false, -1), 0);
  EXPECT_FALSE(e[0].empty());
  EXPECT_EQ(e[0], f[0]);
  EXPECT_NE(read_file(dir + "/e0.log").find("resumed from"), std::string::npos)
      << read_file(dir + "/e0.log");
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
