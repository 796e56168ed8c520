// TensorBoard's profile_steps under MultiWorkerMirroredStrategy with real processes: the chief
// writes every worker's step-time split and memory, read back from the event files. No timing
// thresholds: the values are checked for plausibility (non-negative, the parts within the step).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distribute_process.h"
#include "dtrain/summary/event_reader.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kWorker = DTRAIN_FIT_WORKER;

// tag -> (step -> value) of every scalar in the event files directly under `dir`.
std::map<std::string, std::map<int64_t, double>> scalars(const fs::path& dir) {
  std::map<std::string, std::map<int64_t, double>> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    for (const summary::Event& e : summary::read_events(entry.path().string())) {
      for (const summary::SummaryValue& v : e.values) {
        if (v.is_scalar()) out[v.tag][e.step] = v.value;
      }
    }
  }
  return out;
}

TEST(FitProfile, ChiefWritesEveryWorkersStepSplitAndMemory) {
  const std::string dir = make_temp_dir();
  const std::string logdir = dir + "/logs";
  std::vector<int> ports = {free_port(), free_port()};
  std::vector<Process> procs;
  for (int i = 0; i < 2; ++i) {
    const std::string base = dir + "/w" + std::to_string(i);
    procs.push_back(spawn({kWorker, "--mode", "multi-worker", "--out", base + ".bin", "--epochs",
                           "2", "--logdir", logdir, "--profile-steps", "4"},
                          {{"TF_CONFIG", tf_config(ports, i)}}, base + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(wait_for(procs[i], deadline), 0) << read_file(procs[i].log);
  }
  // 384 rows / 32 = 12 steps per epoch, 24 in all: reports at steps 4, 8, ..., 24.
  for (int w = 0; w < 2; ++w) {
    SCOPED_TRACE("worker " + std::to_string(w));
    const fs::path run = fs::path(logdir) / "profile" / ("worker_" + std::to_string(w));
    ASSERT_TRUE(fs::is_directory(run)) << run;
    auto s = scalars(run);
    for (const char* tag :
         {"profile/step_seconds", "profile/compute_seconds", "profile/communication_seconds",
          "profile/waiting_seconds", "profile/other_seconds", "memory/peak_rss_bytes",
          "memory/tensor_peak_bytes", "memory/tensor_bytes_in_use"}) {
      ASSERT_EQ(s[tag].size(), 6u) << tag;
      EXPECT_EQ(s[tag].begin()->first, 4) << tag;
      EXPECT_EQ(s[tag].rbegin()->first, 24) << tag;
    }
    for (const auto& [step, total] : s["profile/step_seconds"]) {
      const double compute = s["profile/compute_seconds"][step];
      const double comm = s["profile/communication_seconds"][step];
      const double wait = s["profile/waiting_seconds"][step];
      const double other = s["profile/other_seconds"][step];
      EXPECT_GT(total, 0) << step;
      EXPECT_GT(compute, 0) << step;
      EXPECT_GT(comm, 0) << step;  // every step all-reduces across the two processes
      EXPECT_GE(wait, 0) << step;
      EXPECT_GE(other, 0) << step;
      // The parts are measured within the step (float32 storage: relative 1e-5).
      EXPECT_LE(compute + comm + wait, total * (1 + 1e-5)) << step;
      EXPECT_NEAR(compute + comm + wait + other, total, total * 1e-5 + 1e-9) << step;
      EXPECT_GT(s["memory/peak_rss_bytes"][step], 1 << 20) << step;  // a process is > 1 MiB
      EXPECT_GT(s["memory/tensor_peak_bytes"][step], 0) << step;
      EXPECT_GE(s["memory/peak_rss_bytes"][step], s["memory/tensor_peak_bytes"][step]) << step;
      EXPECT_GE(s["memory/tensor_peak_bytes"][step], s["memory/tensor_bytes_in_use"][step]);
    }
    // A high-water mark never falls.
    double last = 0;
    for (const auto& [step, v] : s["memory/peak_rss_bytes"]) {
      EXPECT_GE(v, last) << step;
      last = v;
    }
  }
  EXPECT_FALSE(fs::exists(fs::path(logdir) / "profile" / "worker_2"));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace dtrain::testing
