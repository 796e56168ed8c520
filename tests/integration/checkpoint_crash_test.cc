// Crash safety of checkpoints with real processes: a child saves checkpoints in a loop (through
// CheckpointManager: sync, async one at a time, or async with up to 8 saves written
// concurrently) and is SIGKILLed at a random moment; afterwards restoring the latest checkpoint
// must give exactly one of the states that was saved, never a torn one.
// A full disk (RLIMIT_FSIZE in a child, SIGXFSZ ignored) must fail the save cleanly and leave
// the previous checkpoint intact.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

// The state saved as checkpoint number k: variable i, element j = k * 64 + i + (j % 5) / 8.
struct State {
  std::vector<std::unique_ptr<Variable>> vars;
  int64_t step = 0;
  State() {
    const int64_t sizes[] = {1 << 18, 1 << 16, 1000, 1};  // ~1.3 MB in all
    for (int i = 0; i < 4; ++i) {
      vars.push_back(
          std::make_unique<Variable>("v" + std::to_string(i), Tensor::zeros(Shape{sizes[i]})));
    }
  }
  void fill(int64_t k) {
    for (size_t i = 0; i < vars.size(); ++i) {
      float* p = vars[i]->tensor().data<float>();
      for (int64_t j = 0; j < vars[i]->shape().num_elements(); ++j) {
        p[j] = static_cast<float>(k * 64 + static_cast<int64_t>(i)) + static_cast<float>(j % 5) / 8;
      }
    }
    step = k;
  }
  // The k these values were filled with, or -1 when they are not a consistent state.
  int64_t consistent_k() const {
    const int64_t k = step;
    for (size_t i = 0; i < vars.size(); ++i) {
      const float* p = vars[i]->tensor().data<float>();
      for (int64_t j = 0; j < vars[i]->shape().num_elements(); ++j) {
        if (p[j] !=
            static_cast<float>(k * 64 + static_cast<int64_t>(i)) + static_cast<float>(j % 5) / 8) {
          return -1;
        }
      }
    }
    return k;
  }
  std::vector<std::pair<std::string, Trackable>> trackables() {
    std::vector<std::pair<std::string, Trackable>> out;
    for (size_t i = 0; i < vars.size(); ++i) out.emplace_back("var" + std::to_string(i), *vars[i]);
    out.emplace_back("step", step);
    return out;
  }
};

// The child: resumes from the latest checkpoint and saves states k+1, k+2, ... until killed.
// Once its first checkpoint is committed it writes a byte to `ready_fd`, so that every trial
// makes progress whatever the machine's speed.
// `max_in_flight` > 1 pipelines async saves: several are written at once, committed in order.
[[noreturn]] void run_writer(const std::string& dir, bool async, int max_in_flight, int ready_fd) {
  try {
    State s;
    Checkpoint ckpt(s.trackables(), {.enable_async = async, .max_in_flight = max_in_flight});
    CheckpointManager manager(ckpt, dir, {.max_to_keep = 3});
    manager.restore_or_initialize();
    for (int64_t k = s.step + 1;; ++k) {
      s.fill(k);
      manager.save();
      if (async) s.fill(-7);  // overwrite right after save(): must never reach a file
      if (ready_fd >= 0) {
        manager.sync();
        const char byte = 1;
        if (::write(ready_fd, &byte, 1) != 1) _exit(4);
        ::close(ready_fd);
        ready_fd = -1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writer failed: %s\n", e.what());
    _exit(3);
  }
}

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::make_temp_dir("dtrain_crash_test");
    set_warning_handler([this](const std::string& w) { warnings_.push_back(w); });
  }
  void TearDown() override {
    set_warning_handler(nullptr);
    fs::remove_all(dir_);
  }
  std::string dir_;
  std::vector<std::string> warnings_;
};

void kill_trials(const std::string& dir, bool async, int max_in_flight, int trials,
                 std::mt19937& rng, std::vector<std::string>& warnings) {
  int64_t last_k = 0;
  int restored_trials = 0;
  std::uniform_int_distribution<int> delay_us(0, 20000);
  for (int t = 0; t < trials; ++t) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      run_writer(dir, async, max_in_flight, fds[1]);
    }
    ::close(fds[1]);
    char byte = 0;
    const bool ready = ::read(fds[0], &byte, 1) == 1;
    ::close(fds[0]);
    // Then kill at a random moment: during a snapshot, a data or index write, an fsync, a
    // rename, the state-file commit or a deletion of old checkpoints.
    if (ready) std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(ready && WIFSIGNALED(status))
        << "writer exited on its own with status " << WEXITSTATUS(status) << " in trial " << t;

    // What a restarted process sees.
    State s;
    s.step = -1;
    Checkpoint ckpt(s.trackables());
    warnings.clear();
    const std::optional<std::string> latest = latest_checkpoint(dir);
    std::optional<CheckpointLoadStatus> status_or = ckpt.restore_latest(dir);
    EXPECT_TRUE(warnings.empty()) << "trial " << t << ": " << warnings.front();
    if (!status_or) {
      EXPECT_FALSE(latest.has_value());
      EXPECT_EQ(last_k, 0) << "trial " << t << ": a committed checkpoint disappeared";
      continue;
    }
    ++restored_trials;
    status_or->assert_consumed();
    EXPECT_EQ(status_or->save_path(), latest);
    const int64_t k = s.consistent_k();
    ASSERT_GT(k, 0) << "trial " << t << ": restored values are not a saved state (step " << s.step
                    << ")";
    EXPECT_EQ(ckpt.save_counter(), k) << "trial " << t;
    EXPECT_EQ(*latest, dir + "/ckpt-" + std::to_string(k));
    EXPECT_GE(k, last_k) << "trial " << t << ": went back in time";
    last_k = k;
  }
  std::printf("%d kill trials (%s, max_in_flight %d): %d restored, newest checkpoint %lld\n",
              trials, async ? "async" : "sync", max_in_flight, restored_trials,
              static_cast<long long>(last_k));
  EXPECT_EQ(restored_trials, trials);
  EXPECT_GE(last_k, trials);  // each writer committed at least one checkpoint
}

TEST_F(CrashTest, KillDuringSyncSavesAlwaysLeavesAValidLatestCheckpoint) {
  std::mt19937 rng(12345);
  kill_trials(dir_, /*async=*/false, 1, 60, rng, warnings_);
}

TEST_F(CrashTest, KillDuringAsyncSavesAlwaysLeavesAValidLatestCheckpoint) {
  std::mt19937 rng(54321);
  kill_trials(dir_, /*async=*/true, /*max_in_flight=*/1, 60, rng, warnings_);
}

TEST_F(CrashTest, KillDuringPipelinedAsyncSavesAlwaysLeavesAValidLatestCheckpoint) {
  // Up to 8 saves in flight: killed while several are being written, one is being committed
  // and old ones are being deleted; the state file must only ever name complete checkpoints,
  // in save order.
  std::mt19937 rng(2468);
  kill_trials(dir_, /*async=*/true, /*max_in_flight=*/8, 60, rng, warnings_);
}

// Runs `body` in a child whose files may not exceed `limit` bytes; returns its exit code.
template <class F>
int run_with_file_size_limit(rlim_t limit, F body) {
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing the process
    rlimit lim{limit, limit};
    setrlimit(RLIMIT_FSIZE, &lim);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_F(CrashTest, FullDiskFailsTheSaveClearlyAndKeepsThePreviousCheckpoint) {
  {
    State s;
    s.fill(1);
    Checkpoint ckpt(s.trackables());
    CheckpointManager manager(ckpt, dir_);
    ASSERT_EQ(manager.save(), dir_ + "/ckpt-1");
  }
  const std::string state_before = read_file(dir_ + "/checkpoint");
  for (bool async : {false, true}) {
    const int code = run_with_file_size_limit(256 << 10, [&] {
      try {
        State s;
        Checkpoint ckpt(s.trackables(), {.enable_async = async});
        CheckpointManager manager(ckpt, dir_);
        if (!manager.restore_or_initialize()) return 10;
        s.fill(2);
        manager.save();
        manager.sync();
        return 11;  // the save should have failed
      } catch (const ResourceExhaustedError& e) {
        const std::string what = e.what();
        const bool clear = what.find(dir_ + "/ckpt-2.data-00000-of-00001") != std::string::npos &&
                           what.find("File too large") != std::string::npos;
        if (!clear) std::fprintf(stderr, "unclear error: %s\n", what.c_str());
        return clear ? 0 : 12;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "unexpected error: %s\n", e.what());
        return 13;
      }
    });
    EXPECT_EQ(code, 0) << (async ? "async" : "sync");
    EXPECT_EQ(read_file(dir_ + "/checkpoint"), state_before);
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      EXPECT_TRUE(name == "checkpoint" || name.rfind("ckpt-1.", 0) == 0) << "left behind: " << name;
    }
    State s;
    Checkpoint ckpt(s.trackables());
    auto status = ckpt.restore_latest(dir_);
    ASSERT_TRUE(status.has_value());
    status->assert_consumed();
    EXPECT_EQ(s.consistent_k(), 1);
  }
}

}  // namespace
}  // namespace dtrain::checkpoint
