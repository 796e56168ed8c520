// Chaos with the launcher and the language model: `dtrain launch --nproc-per-node 2 -- dtrain
// fit --arch gpt --strategy multi-worker` (a small character-level GPT with dropout, so that
// the Dropout generators' state must be restored too) takes in-memory snapshots every 3 steps
// and backups every 20; the test SIGKILLs a random worker 20 times at random moments —
// mid-step, mid-all-reduce, mid-snapshot, during a restart. The job must finish, and the .keras
// file the chief saves (weights, optimizer variables, the tokenizer's vocabulary in the config)
// must be bitwise equal to an uninterrupted run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>

#include "chaos.h"
#include "keras_compare.h"

namespace dtrain::testing {
namespace {

namespace ck = dtrain::checkpoint;
const std::string kDtrain = DTRAIN_BINARY;

// About 6,000 characters of lower-case words and punctuation: 337 training windows of 16 + 1
// characters, 21 steps an epoch at the global batch of 16 (150 epochs: 3,150 steps).
void write_corpus(const std::string& path) {
  const std::vector<std::string> words = {"the",   "fault", "tolerant", "model", "trains",
                                          "on",    "every", "worker",   "and",   "never",
                                          "loses", "a",     "step",     "when",  "killed"};
  std::mt19937 rng(13);
  std::ofstream out(path);
  size_t n = 0;
  while (n < 6000) {
    const std::string& w = words[std::uniform_int_distribution<size_t>(0, words.size() - 1)(rng)];
    const char* sep = rng() % 9 == 0 ? ".\n" : " ";
    out << w << sep;
    n += w.size() + std::string(sep).size();
  }
}

std::vector<std::string> job(const std::string& dir, const std::string& save, bool backups) {
  std::vector<std::string> a = {kDtrain,
                                "launch",
                                "--nproc-per-node",
                                "2",
                                "--max-restarts",
                                "60",
                                "--grace-period",
                                "1",
                                "--snapshot-every",
                                "3",
                                "--event-log",
                                dir + "/events.jsonl",
                                "--",
                                kDtrain,
                                "fit",
                                "--arch",
                                "gpt",
                                "--corpus",
                                dir + "/corpus.txt",
                                "--context",
                                "16",
                                "--layers",
                                "1",
                                "--d-model",
                                "16",
                                "--heads",
                                "2",
                                "--dropout",
                                "0.1",
                                "--strategy",
                                "multi-worker",
                                "--epochs",
                                "150",
                                "--batch-size",
                                "16",
                                "--seed",
                                "1",
                                "--verbose",
                                "0",
                                "--save",
                                save};
  if (backups) {
    a.insert(a.end(), {"--checkpoint-dir", dir + "/ckpt", "--checkpoint-every", "20", "--resume"});
  }
  return a;
}

TEST(LaunchLmChaos, TwentyWorkerKillsResumeToTheSameBits) {
  const std::string dir = make_temp_dir();
  write_corpus(dir + "/corpus.txt");
  const auto start = std::chrono::steady_clock::now();
  Process ref = spawn(job(dir, dir + "/ref.keras", false), {}, dir + "/ref.log");
  ASSERT_EQ(wait_for(ref, start + std::chrono::seconds(150)), 0) << log_tail(read_file(ref.log));
  const double ref_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const ck::KerasV3Contents want = ck::read_keras_v3(dir + "/ref.keras");
  ASSERT_FALSE(want.vars.empty());

  Process p = spawn(job(dir, dir + "/chaos.keras", true), {}, dir + "/chaos.log");
  // Between kills, 2-5% of an uninterrupted run (a kill that often lands while the previous
  // one's restart is under way) or 6-12% (the restarted workers train a while first): the 20
  // kills take about 1.25 runs, and each restart adds a process start-up (a few tenths of a
  // second, about a tenth of a run) to the job, so all 20 land before it ends. They hit
  // mid-step, mid-all-reduce, mid-snapshot and mid-restart.
  const KillResult r =
      kill_random_workers(p, {.max_kills = 20,
                              .delay =
                                  [ref_ms](std::mt19937& rng) {
                                    const bool longer = rng() % 2 == 0;
                                    const double f = std::uniform_real_distribution<double>(
                                        longer ? 0.06 : 0.02, longer ? 0.12 : 0.05)(rng);
                                    return std::chrono::milliseconds(
                                        std::max<int64_t>(50, static_cast<int64_t>(f * ref_ms)));
                                  },
                              .seed = 1313});
  const int code = finish(p, r, std::chrono::seconds(200));
  const std::string log = read_file(dir + "/chaos.log");
  ASSERT_EQ(code, 0) << log_tail(log);
  std::printf("%d worker kills (an uninterrupted run: %.0f ms)\n", r.kills, ref_ms);
  EXPECT_EQ(r.kills, 20) << "the job finished before 20 kills";
  // At least one generation resumed from a snapshot rather than from the start.
  EXPECT_NE(read_file(dir + "/events.jsonl").find("\"kind\":\"snapshot_restore\""),
            std::string::npos)
      << log_tail(log);

  const ck::KerasV3Contents got = ck::read_keras_v3(dir + "/chaos.keras");
  const int compared = expect_same_keras(got, want, "after " + std::to_string(r.kills) + " kills");
  // Embeddings, one block (LN, MHA, Dense), the final LN and head, and AdamW's slots.
  EXPECT_GT(compared, 20);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
