// MultiWorkerMirroredStrategy with sharded optimizer state (ZeRO stages 1 and 2), real processes
// and Gloo on loopback: the final model and optimizer variables are bitwise those of the
// replicated run for 1, 2 and 3 workers, the MLP, the CNN and the LM (a one-block GPT), with and
// without clipping by norm
// (the norms of sharded gradients); each worker's optimizer slots
// (and, with stage 2, summed gradients) are its partition_rows share, about 1/N; fit's backups
// of sharded state resume bitwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

const std::string kWorker = DTRAIN_FIT_WORKER;

struct Workers {
  std::vector<std::string> outs, logs;
  std::vector<int> codes;
};

Workers run(const std::string& dir, const std::string& name, int workers,
            const std::vector<std::string>& flags) {
  std::vector<int> ports;
  for (int i = 0; i < workers; ++i) ports.push_back(free_port());
  std::vector<Process> procs;
  for (int i = 0; i < workers; ++i) {
    const std::string stem = dir + "/" + name + std::to_string(i);
    std::vector<std::string> argv = {kWorker, "--mode", "multi-worker", "--out", stem + ".bin"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    procs.push_back(spawn(argv, {{"TF_CONFIG", tf_config(ports, i)}}, stem + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  Workers r;
  for (int i = 0; i < workers; ++i) {
    r.codes.push_back(wait_for(procs[i], deadline));
    r.logs.push_back(read_file(procs[i].log));
    r.outs.push_back(read_file(dir + "/" + name + std::to_string(i) + ".bin"));
  }
  return r;
}

std::string train(const std::string& dir, const std::string& name, int workers,
                  const std::vector<std::string>& flags, std::vector<std::string>* logs = nullptr) {
  const Workers r = run(dir, name, workers, flags);
  for (int i = 0; i < workers; ++i) {
    EXPECT_EQ(r.codes[i], 0) << name << " worker " << i << ":\n" << r.logs[i];
    if (i > 0) {
      EXPECT_EQ(r.outs[i], r.outs[0]) << name << ": worker " << i;
    }
  }
  EXPECT_FALSE(r.outs[0].empty()) << name;
  if (logs != nullptr) *logs = r.logs;
  return r.outs[0];
}

// "sharded: optimizer_slot_bytes X gradient_bytes Y" from a worker's log.
std::pair<double, double> sharded_bytes(const std::string& log) {
  const size_t at = log.find("sharded: ");
  double slots = -1, grads = -1;
  if (at != std::string::npos) {
    std::sscanf(log.c_str() + at, "sharded: optimizer_slot_bytes %lf gradient_bytes %lf", &slots,
                &grads);
  }
  return {slots, grads};
}

struct Case {
  int workers;
  std::string arch;
  std::vector<std::string> flags;
  // The model's trainable floats and its longest row (the partition's granularity).
  double params, row;
};

class FitZero : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_P(FitZero, VariablesAreBitwiseThoseOfTheReplicatedRunAndSlotsAreAShare) {
  const Case& c = GetParam();
  std::vector<std::string> flags = {"--arch", c.arch, "--verify-sync", "5"};
  flags.insert(flags.end(), c.flags.begin(), c.flags.end());
  const std::string replicated = train(dir_, "replicated", c.workers, flags);
  // Adam: two slots of 4 bytes per trainable float.
  const double full_slots = 2 * 4 * c.params, full_grads = 4 * c.params;
  for (const char* stage : {"1", "2"}) {
    std::vector<std::string> zero = flags;
    zero.insert(zero.end(), {"--shard-optimizer-state", stage});
    std::vector<std::string> logs;
    const std::string out = train(dir_, std::string("zero") + stage, c.workers, zero, &logs);
    EXPECT_TRUE(out == replicated) << c.workers << " workers, " << c.arch << ", stage " << stage
                                   << ": sharded optimizer state changed the result";
    double slots = 0, grads = 0;
    for (int i = 0; i < c.workers; ++i) {
      const auto [s, g] = sharded_bytes(logs[i]);
      std::printf(
          "%d workers %s stage %s worker %d: optimizer slots %.0f of %.0f bytes, "
          "gradients %.0f bytes\n",
          c.workers, c.arch.c_str(), stage, i, s, full_slots, g);
      ASSERT_GE(s, 0) << logs[i];
      EXPECT_LE(s, full_slots / c.workers + 2 * 4 * c.row) << "worker " << i;
      slots += s;
      if (stage[0] == '2') {
        EXPECT_LE(g, full_grads / c.workers + 4 * c.row) << "worker " << i;
        grads += g;
      } else {
        EXPECT_EQ(g, full_grads) << "worker " << i;
      }
    }
    EXPECT_EQ(slots, full_slots) << "the shards do not cover every slot element once";
    if (stage[0] == '2') {
      EXPECT_EQ(grads, full_grads);
    }
  }
}

// MLP: Dense(8 -> 16) and Dense(16 -> 3): 195 floats, rows of up to 16. CNN: Conv2D(3x3x1 -> 4),
// Dense(16 -> 16) (after 2x2x4 pooled features), Dense(16 -> 3): 40 + 272 + 51 floats. LM: the
// embeddings 11x8 + 6x8, one block (2 x layer norm 16, attention 4 x 72, ffn 8x32+32 and
// 32x8+8), the final norm 16 and the head 8x11+11.
INSTANTIATE_TEST_SUITE_P(
    WorkersAndModels, FitZero,
    ::testing::Values(Case{1, "mlp", {"--epochs", "1"}, 195, 16}, Case{2, "mlp", {}, 195, 16},
                      Case{3, "mlp", {}, 195, 16},
                      // The third worker has no rows in each epoch's last step.
                      Case{3, "mlp", {"--batch-size", "191", "--epochs", "3"}, 195, 16},
                      Case{2, "cnn", {"--epochs", "1"}, 363, 16},
                      Case{3, "cnn", {"--epochs", "1"}, 363, 16},
                      // Small enough bounds that every step clips.
                      Case{2, "mlp", {"--global-clipnorm", "0.05"}, 195, 16},
                      Case{3, "mlp", {"--global-clipnorm", "0.05"}, 195, 16},
                      Case{3, "cnn", {"--epochs", "1", "--clipnorm", "0.02"}, 363, 16},
                      // The one-block GPT: 1123 floats, rows of up to 32 (ffn_up's kernel).
                      Case{2, "lm", {"--epochs", "1"}, 1123, 32},
                      Case{3, "lm", {"--epochs", "1", "--global-clipnorm", "0.05"}, 1123, 32}),
    [](const auto& info) {
      std::string suffix;
      for (size_t i = 0; i + 1 < info.param.flags.size(); i += 2) {
        if (info.param.flags[i] == "--batch-size") suffix += "Batch191";
        if (info.param.flags[i] == "--global-clipnorm") suffix += "GlobalClipnorm";
        if (info.param.flags[i] == "--clipnorm") suffix += "Clipnorm";
      }
      return info.param.arch + std::to_string(info.param.workers) + "workers" + suffix;
    });

// fit's backups under ZeRO: every worker gathers the slots at a backup step, so the backup is an
// ordinary (or, with --sharded-checkpoints, a sharded) checkpoint of the full state. A job killed
// after two epochs and started again resumes from it; the result is bitwise the uninterrupted
// replicated run's, and the same backup also resumes a job without sharded optimizer state.
TEST(FitZeroCheckpoints, BackupsOfShardedStateResumeBitwise) {
  const std::string dir = make_temp_dir();
  const std::vector<std::string> flags = {"--epochs", "3", "--verify-sync", "5"};
  const std::string replicated = train(dir, "replicated", 2, flags);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = flags;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  for (const char* stage : {"1", "2"}) {
    for (const char* sharded : {"0", "1"}) {
      const std::string name = std::string("s") + stage + "c" + sharded;
      const std::string ckpt = dir + "/" + name + "_ckpt";
      const std::vector<std::string> zero = {
          "--shard-optimizer-state", stage, "--checkpoint-dir",      ckpt,
          "--checkpoint-every",      "5",   "--sharded-checkpoints", sharded};
      std::vector<std::string> first = with(zero);
      first.insert(first.end(), {"--exit-at-epoch", "2"});
      const Workers killed = run(dir, name + "a", 2, first);
      for (int i = 0; i < 2; ++i) ASSERT_EQ(killed.codes[i], 3) << killed.logs[i];
      std::vector<std::string> logs;
      const std::string resumed = train(dir, name + "b", 2, with(zero), &logs);
      EXPECT_NE(logs[0].find("BackupAndRestore: resumed from"), std::string::npos) << logs[0];
      EXPECT_TRUE(resumed == replicated)
          << "stage " << stage << ", sharded checkpoints " << sharded
          << ": a run resumed from a backup of sharded optimizer state differs";
      if (sharded[0] == '1') continue;
      // The first run's backups again (the second run deleted its own at the end), resumed
      // without sharded optimizer state.
      const std::string ckpt2 = dir + "/" + name + "_ckpt2";
      std::vector<std::string> again = with(
          {"--shard-optimizer-state", stage, "--checkpoint-dir", ckpt2, "--checkpoint-every", "5"});
      again.insert(again.end(), {"--exit-at-epoch", "2"});
      const Workers killed2 = run(dir, name + "c", 2, again);
      for (int i = 0; i < 2; ++i) ASSERT_EQ(killed2.codes[i], 3) << killed2.logs[i];
      const std::string plain = train(
          dir, name + "d", 2, with({"--checkpoint-dir", ckpt2, "--checkpoint-every", "5"}), &logs);
      EXPECT_NE(logs[0].find("BackupAndRestore: resumed from"), std::string::npos) << logs[0];
      EXPECT_TRUE(plain == replicated)
          << "stage " << stage << ": an unsharded run resumed from a ZeRO backup differs";
    }
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
