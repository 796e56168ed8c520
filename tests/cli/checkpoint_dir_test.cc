// `dtrain fit --checkpoint-dir D --resume` as a user runs it, against a damaged `checkpoint`
// state file (empty, missing, naming checkpoints that do not exist, or naming checkpoints of
// another directory by `..` or by absolute path): it resumes from the newest valid backup in D,
// says so in one line, and never deletes a file outside D. And two jobs on one directory: the
// second fails at once naming the directory and the first one's pid, until the first is killed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using dtrain::testutil::contains;
using dtrain::testutil::read_bytes;
using dtrain::testutil::write_bytes;

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A tiny IDX data set: 200 images of 4x4 uint8, labels 0..2.
    std::ofstream im(tmp_.file("x.idx"), std::ios::binary),
        lb(tmp_.file("y.idx"), std::ios::binary);
    const unsigned char ih[] = {0, 0, 8, 3, 0, 0, 0, 200, 0, 0, 0, 4, 0, 0, 0, 4};
    im.write(reinterpret_cast<const char*>(ih), sizeof ih);
    for (int i = 0; i < 200 * 16; ++i) im.put(static_cast<char>(i % 251));
    const unsigned char lh[] = {0, 0, 8, 1, 0, 0, 0, 200};
    lb.write(reinterpret_cast<const char*>(lh), sizeof lh);
    for (int i = 0; i < 200; ++i) lb.put(static_cast<char>(i % 3));
  }
  // Two steps per epoch (`steps_per_epoch` 0: whole passes over the data, without end).
  std::string fit_args(const std::string& dir, int epochs, int steps_per_epoch = 2) const {
    return "fit --train-images " + tmp_.file("x.idx") + " --train-labels " + tmp_.file("y.idx") +
           (steps_per_epoch > 0 ? " --steps-per-epoch " + std::to_string(steps_per_epoch) : "") +
           " --batch-size 8 --verbose 0 --seed 1 --checkpoint-dir " + dir + " --epochs " +
           std::to_string(epochs);
  }
  // Every file of `dir` (recursively) by relative path, with its bytes.
  static std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_bytes(e.path());
    }
    return out;
  }
  static void restore_snapshot(const std::string& dir,
                               const std::map<std::string, std::string>& files) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& [name, bytes] : files) write_bytes(dir + "/" + name, bytes);
  }
  static int count_lines_with(const std::string& text, const std::string& part) {
    std::istringstream in(text);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += contains(line, part);
    return n;
  }

  dtrain::testutil::TempDir tmp_{"dtrain_checkpoint_dir_test"};
};

TEST_F(CheckpointDirTest, ResumeSurvivesADamagedStateFileAndNeverDeletesOutsideTheDirectory) {
  const std::string d = tmp_.file("D");
  const auto first = dtrain::testutil::run_dtrain(fit_args(d, 3));
  ASSERT_EQ(first.code, 0) << first.output;
  const std::map<std::string, std::string> backups = snapshot(d);  // backup-1..3 + checkpoint
  ASSERT_TRUE(backups.count("backup-3.index")) << first.output;
  // Another run's backups (copies of ours), which D's state file will point at.
  const std::string other = tmp_.file("other"), other2 = tmp_.file("other2");
  for (const std::string& o : {other, other2}) {
    restore_snapshot(o, backups);
    write_bytes(o + "/keep.txt", "precious");
  }
  const auto others_before = std::make_pair(snapshot(other), snapshot(other2));

  struct Damage {
    std::string name, state;  // state "-": removed
    std::string says;
  };
  const std::vector<Damage> damages = {
      {"empty", "", "is empty"},
      {"missing", "-", "is missing"},
      {"missing prefixes",
       "model_checkpoint_path: \"backup-9\"\nall_model_checkpoint_paths: \"backup-8\"\n"
       "all_model_checkpoint_paths: \"backup-9\"\n",
       "names only checkpoints that do not exist"},
      {"relative foreign path",
       "model_checkpoint_path: \"../other/backup-2\"\n"
       "all_model_checkpoint_paths: \"../other/backup-1\"\n"
       "all_model_checkpoint_paths: \"../other/backup-2\"\n",
       "names only checkpoints outside"},
      {"absolute foreign path",
       "model_checkpoint_path: \"" + other2 + "/backup-2\"\nall_model_checkpoint_paths: \"" +
           other2 + "/backup-1\"\nall_model_checkpoint_paths: \"" + other2 + "/backup-2\"\n",
       "names only checkpoints outside"},
  };
  for (const Damage& dmg : damages) {
    SCOPED_TRACE(dmg.name);
    restore_snapshot(d, backups);
    if (dmg.state == "-") {
      fs::remove(d + "/checkpoint");
    } else {
      write_bytes(d + "/checkpoint", dmg.state);
    }
    // Three more epochs: enough saves for retention to reach whatever the state file named.
    const auto r = dtrain::testutil::run_dtrain(fit_args(d, 6) + " --resume");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resumed from " + d + "/backup-3 at epoch 4")) << r.output;
    EXPECT_EQ(count_lines_with(r.output, d + "/checkpoint " + dmg.says), 1) << r.output;
    EXPECT_EQ(count_lines_with(r.output, "restored " + d + "/backup-3"), 1) << r.output;
    // Foreign entries get one more line, the one that ignores them; nothing else warns.
    const bool foreign = contains(dmg.says, "outside");
    EXPECT_EQ(count_lines_with(r.output, "WARNING"), foreign ? 2 : 1) << r.output;
    if (foreign) {
      EXPECT_EQ(count_lines_with(r.output, "; ignoring them"), 1) << r.output;
    }
    EXPECT_EQ(snapshot(other), others_before.first);
    EXPECT_EQ(snapshot(other2), others_before.second);
    // The damaged state file was rewritten: D's own newest three backups.
    const std::string state = read_bytes(d + "/checkpoint");
    EXPECT_TRUE(contains(state, "model_checkpoint_path: \"backup-6\"\n")) << state;
    for (int n : {4, 5, 6}) {
      EXPECT_TRUE(contains(state, "all_model_checkpoint_paths: \"backup-" + std::to_string(n)))
          << state;
      EXPECT_TRUE(fs::exists(d + "/backup-" + std::to_string(n) + ".index")) << n;
    }
    EXPECT_FALSE(contains(state, "other")) << state;
  }
}

// Starts `dtrain ARGS...` in the background (output discarded) and returns its pid.
pid_t spawn_dtrain(const std::string& args) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const std::string binary = std::string(DTRAIN_BINARY_DIR) + "/dtrain";
    std::vector<std::string> words;
    std::istringstream in(args);
    for (std::string w; in >> w;) words.push_back(w);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

TEST_F(CheckpointDirTest, ASecondJobOnTheDirectoryFailsAtOnceUntilTheFirstIsKilled) {
  const std::string d = tmp_.file("L");
  // A job that trains for a long time without writing backups (one every 10^8 steps).
  const pid_t first = spawn_dtrain(fit_args(d, 1000000, 0) + " --checkpoint-every 100000000");
  ASSERT_GT(first, 0);
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reaper{first};
  // It holds D's lock once its lock file names it (bounded wait: a loaded machine is slow).
  const std::string lock = d + "/.dtrain.lock";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!(fs::exists(lock) && read_bytes(lock) == std::to_string(first) + "\n")) {
    ASSERT_EQ(::waitpid(first, nullptr, WNOHANG), 0) << "the first job exited";
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the first job never took " << lock;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  const auto second = dtrain::testutil::run_dtrain(fit_args(d, 1));
  EXPECT_EQ(second.code, 8) << second.output;  // FAILED_PRECONDITION
  EXPECT_TRUE(contains(second.output, "FAILED_PRECONDITION")) << second.output;
  EXPECT_TRUE(contains(second.output, "checkpoint directory " + d + " is in use")) << second.output;
  EXPECT_TRUE(contains(second.output, "pid " + std::to_string(first))) << second.output;
  EXPECT_FALSE(fs::exists(d + "/checkpoint")) << "the second job wrote a backup";

  // kill -9: the kernel releases the lock; a restarted job trains and backs up.
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_EQ(::waitpid(first, nullptr, 0), first);
  reaper.pid = 0;
  const auto restarted = dtrain::testutil::run_dtrain(fit_args(d, 1) + " --resume");
  EXPECT_EQ(restarted.code, 0) << restarted.output;
  EXPECT_TRUE(fs::exists(d + "/backup-1.index")) << restarted.output;
  EXPECT_FALSE(fs::exists(lock)) << "a job that ends removes its lock file";
}

}  // namespace
