// A CheckpointManager never destroys work it did not write: a damaged `checkpoint` state file
// (empty, missing, malformed, naming checkpoints that do not exist or lie outside the directory)
// neither costs a valid checkpoint of the directory nor a file elsewhere; two writers (real
// processes) never share a directory; and a restore that skips corrupt checkpoints says so in
// one line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_state.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using testutil::expect_throws;
using testutil::expect_throws_with;

class ManagerSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_warning_handler([this](const std::string& w) { warnings_.push_back(w); });
  }
  void TearDown() override { set_warning_handler(nullptr); }

  std::string ckpt(int n) const { return tmp_.file("run/ckpt-" + std::to_string(n)); }
  std::string run() const { return tmp_.file("run"); }
  std::string state_file() const { return tmp_.file("run/checkpoint"); }

  // ckpt-1..3 in run/, holding 1, 2, 3, committed by a manager that is gone.
  void write_three() {
    Variable v("v", Tensor::scalar(0.0f));
    Checkpoint c({{"v", v}});
    CheckpointManager m(c, run(), {.max_to_keep = 3});
    for (int i = 1; i <= 3; ++i) {
      v.tensor().fill(static_cast<float>(i));
      m.save();
    }
  }
  // The value checkpoint `prefix` holds (restored into a fresh variable).
  static float value_of(const std::string& prefix) {
    Variable r("v", Tensor::scalar(-1.0f));
    Checkpoint c({{"v", r}});
    c.restore(prefix);
    return r.tensor().data<float>()[0];
  }
  // A valid checkpoint holding `value` at `prefix`, outside any manager.
  static void write_foreign(const std::string& prefix, float value) {
    fs::create_directories(fs::path(prefix).parent_path());
    Variable v("v", Tensor::scalar(value));
    Checkpoint c({{"v", v}});
    c.write(prefix);
  }
  std::string warnings() const {
    std::string out;
    for (const auto& w : warnings_) out += w + "\n";
    return out;
  }

  testutil::TempDir tmp_{"dtrain_manager_safety_test"};
  std::vector<std::string> warnings_;
};

TEST_F(ManagerSafetyTest, ADamagedStateFileResumesFromTheNewestCheckpointAndCostsNone) {
  struct Damage {
    const char* name;
    std::string text;  // what the state file holds; "-" removes it
    const char* says;
  };
  const std::vector<Damage> damages = {
      {"empty", "", "is empty"},
      {"missing", "-", "is missing"},
      {"malformed", "model_checkpoint_path: ckpt-3 without quotes\n", "is malformed"},
      {"missing prefixes",
       "model_checkpoint_path: \"ckpt-20\"\nall_model_checkpoint_paths: \"ckpt-19\"\n"
       "all_model_checkpoint_paths: \"ckpt-20\"\n",
       "names only checkpoints that do not exist"},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    fs::remove_all(run());
    write_three();
    if (d.text == "-") {
      fs::remove(state_file());
    } else {
      write_file_atomically(state_file(), d.text);
    }
    warnings_.clear();
    {
      Variable v("v", Tensor::scalar(0.0f));
      Checkpoint c({{"v", v}});
      CheckpointManager m(c, run(), {.max_to_keep = 4});
      EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{ckpt(1), ckpt(2), ckpt(3)}));
      EXPECT_EQ(m.restore_or_initialize(), ckpt(3));
      EXPECT_EQ(v.tensor().data<float>()[0], 3.0f);
      EXPECT_EQ(c.save_counter(), 3);
      // One line: which file was damaged, which checkpoint was restored.
      ASSERT_EQ(warnings_.size(), 1u) << warnings();
      EXPECT_NE(warnings_[0].find(state_file() + " " + d.says), std::string::npos) << warnings_[0];
      EXPECT_NE(warnings_[0].find("restored " + ckpt(3)), std::string::npos) << warnings_[0];
      v.tensor().fill(4.0f);
      EXPECT_EQ(m.save(), ckpt(4));  // continues numbering: overwrites nothing
    }
    for (int i = 1; i <= 4; ++i) EXPECT_EQ(value_of(ckpt(i)), static_cast<float>(i)) << i;
    // The save rewrote the state file correctly.
    const std::optional<CheckpointState> st = read_checkpoint_state(run());
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->all_model_checkpoint_paths,
              (std::vector<std::string>{ckpt(1), ckpt(2), ckpt(3), ckpt(4)}));
    EXPECT_EQ(st->model_checkpoint_path, ckpt(4));
    EXPECT_EQ(latest_checkpoint(run()), ckpt(4));
  }
}

TEST_F(ManagerSafetyTest, ADamagedStateFileIsRewrittenByTheNextSaveWithoutARestore) {
  write_three();
  write_file_atomically(state_file(), "");
  Variable v("v", Tensor::scalar(9.0f));
  Checkpoint c({{"v", v}});
  CheckpointManager m(c, run(), {.max_to_keep = 3});
  EXPECT_TRUE(warnings_.empty()) << warnings();
  EXPECT_EQ(m.save(7), ckpt(7));
  ASSERT_EQ(warnings_.size(), 1u) << warnings();
  EXPECT_NE(warnings_[0].find(state_file() + " is empty"), std::string::npos) << warnings_[0];
  // Retention continues over what the directory held, as if the file had listed it.
  EXPECT_EQ(m.checkpoints(), (std::vector<std::string>{ckpt(2), ckpt(3), ckpt(7)}));
  EXPECT_EQ(read_checkpoint_state(run())->all_model_checkpoint_paths, m.checkpoints());
  EXPECT_FALSE(fs::exists(ckpt(1) + ".index"));
  EXPECT_EQ(value_of(ckpt(2)), 2.0f);
}

TEST_F(ManagerSafetyTest, StateFileEntriesOutsideTheDirectoryAreNeitherRestoredNorDeleted) {
  // Valid checkpoints elsewhere, reached by `..`, by an absolute path, and through a symlinked
  // directory inside run/: none of them may be restored, tracked or deleted.
  write_foreign(tmp_.file("other/ckpt-2"), 20.0f);
  write_foreign(tmp_.file("elsewhere/ckpt-5"), 50.0f);
  write_foreign(tmp_.file("linked/ckpt-6"), 60.0f);
  write_file_atomically(tmp_.file("elsewhere/keep.txt"), "precious");
  fs::create_directories(run());
  fs::create_directory_symlink(tmp_.file("linked"), tmp_.file("run/link"));
  const std::string abs = tmp_.file("elsewhere/ckpt-5");
  for (const bool with_local_entry : {false, true}) {
    SCOPED_TRACE(with_local_entry ? "foreign and local entries" : "only foreign entries");
    for (const auto& e : fs::directory_iterator(run())) {
      if (e.path().filename() != "link") fs::remove(e.path());
    }
    write_foreign(ckpt(1), 1.0f);
    write_file_atomically(
        state_file(), str_cat("model_checkpoint_path: \"", abs, "\"\n",
                              with_local_entry ? "all_model_checkpoint_paths: \"ckpt-1\"\n" : "",
                              "all_model_checkpoint_paths: \"../other/ckpt-2\"\n",
                              "all_model_checkpoint_paths: \"link/ckpt-6\"\n",
                              "all_model_checkpoint_paths: \"", abs, "\"\n"));
    warnings_.clear();
    {
      Variable v("v", Tensor::scalar(0.0f));
      Checkpoint c({{"v", v}});
      CheckpointManager m(c, run(), {.max_to_keep = 1});
      EXPECT_EQ(m.checkpoints(), std::vector<std::string>{ckpt(1)});
      EXPECT_EQ(m.restore_or_initialize(), ckpt(1));
      EXPECT_EQ(v.tensor().data<float>()[0], 1.0f);
      ASSERT_FALSE(warnings_.empty());
      for (const char* entry : {"'../other/ckpt-2'", "'link/ckpt-6'"}) {
        EXPECT_NE(warnings_[0].find(entry), std::string::npos) << warnings();
      }
      EXPECT_NE(warnings_[0].find("'" + abs + "'"), std::string::npos) << warnings();
      EXPECT_LE(warnings_.size(), with_local_entry ? 1u : 2u) << warnings();
      for (int i = 0; i < 3; ++i) m.save();  // retention drops everything it tracks but one
      // A plain Checkpoint::save into run/ also commits without following the entries.
      Checkpoint plain({{"v", v}});
      plain.save(tmp_.file("run/plain"));
      EXPECT_EQ(plain.restore_latest(run())->save_path(), tmp_.file("run/plain-1"));
    }
    EXPECT_EQ(value_of(tmp_.file("other/ckpt-2")), 20.0f);
    EXPECT_EQ(value_of(abs), 50.0f);
    EXPECT_EQ(value_of(tmp_.file("linked/ckpt-6")), 60.0f);
    EXPECT_EQ(read_file(tmp_.file("elsewhere/keep.txt")), "precious");
    const std::string state = read_file(state_file());
    EXPECT_EQ(state.find(".."), std::string::npos) << state;
    EXPECT_EQ(state.find(abs), std::string::npos) << state;
    EXPECT_EQ(state.find("link/"), std::string::npos) << state;
  }
}

TEST_F(ManagerSafetyTest, StatePathsInsideTheDirectoryWorkAbsoluteOrRelative) {
  // TF1's Saver writes absolute paths, TF2 relative ones; "./x" and "../run/x" name run/ too.
  write_foreign(ckpt(1), 1.0f);
  write_foreign(ckpt(2), 2.0f);
  write_foreign(ckpt(3), 3.0f);
  write_file_atomically(state_file(), str_cat("model_checkpoint_path: \"", ckpt(3), "\"\n",
                                              "all_model_checkpoint_paths: \"./ckpt-1\"\n",
                                              "all_model_checkpoint_paths: \"../run/ckpt-2\"\n",
                                              "all_model_checkpoint_paths: \"", ckpt(3), "\"\n"));
  {
    Variable v("v", Tensor::scalar(0.0f));
    Checkpoint c({{"v", v}});
    CheckpointManager m(c, run(), {.max_to_keep = 2});
    EXPECT_EQ(m.checkpoints().size(), 3u);
    EXPECT_EQ(m.restore_or_initialize(), ckpt(3));
    m.save(4);  // retention deletes ckpt-1 and ckpt-2, which are the manager's
  }
  EXPECT_TRUE(warnings_.empty()) << warnings();
  EXPECT_FALSE(fs::exists(ckpt(1) + ".index"));
  EXPECT_FALSE(fs::exists(ckpt(2) + ".index"));
  EXPECT_EQ(value_of(ckpt(3)), 3.0f);
  // TF's own fixture directory (a relative entry) still loads.
  const std::string fixture =
      std::string(DTRAIN_SOURCE_DIR) + "/../shared/fixtures/tf_checkpoints/keras_lso_two_shards";
  EXPECT_EQ(latest_checkpoint(fixture), fixture + "/ckpt");
}

TEST_F(ManagerSafetyTest, RetentionDeletesOnlyItsOwnRegularFiles) {
  // The state file lists something that is not one of the manager's checkpoints, and a
  // checkpoint-named symlink to a file elsewhere: retention drops them from its list but
  // deletes neither.
  write_foreign(tmp_.file("run/weights"), 7.0f);
  write_foreign(tmp_.file("elsewhere/ckpt-9"), 90.0f);
  fs::create_symlink(tmp_.file("elsewhere/ckpt-9.index"), ckpt(2) + ".index");
  fs::create_symlink(tmp_.file("elsewhere/ckpt-9.data-00000-of-00001"),
                     ckpt(2) + ".data-00000-of-00001");
  write_foreign(ckpt(1), 1.0f);
  write_file_atomically(state_file(),
                        "model_checkpoint_path: \"ckpt-2\"\n"
                        "all_model_checkpoint_paths: \"weights\"\n"
                        "all_model_checkpoint_paths: \"ckpt-1\"\n"
                        "all_model_checkpoint_paths: \"ckpt-2\"\n");
  {
    Variable v("v", Tensor::scalar(0.0f));
    Checkpoint c({{"v", v}});
    CheckpointManager m(c, run(), {.max_to_keep = 1});
    for (int n = 10; n < 13; ++n) m.save(n);
    EXPECT_EQ(m.checkpoints(), std::vector<std::string>{ckpt(12)});
  }
  EXPECT_EQ(value_of(tmp_.file("run/weights")), 7.0f);
  EXPECT_FALSE(fs::exists(ckpt(1) + ".index"));  // its own: deleted
  EXPECT_TRUE(fs::is_symlink(ckpt(2) + ".index"));
  EXPECT_EQ(value_of(tmp_.file("elsewhere/ckpt-9")), 90.0f);
}

TEST_F(ManagerSafetyTest, ASkippedCorruptCheckpointGivesOneWarningLine) {
  Variable v("v", Tensor::scalar(0.0f));
  {
    Checkpoint c({{"v", v}});
    CheckpointManager m(c, run(), {.max_to_keep = 5});
    for (int i = 1; i <= 4; ++i) {
      v.tensor().fill(static_cast<float>(i));
      m.save();
    }
  }
  fs::resize_file(ckpt(4) + ".data-00000-of-00001", 10);  // torn
  fs::remove(ckpt(3) + ".index");
  warnings_.clear();
  Checkpoint c({{"v", v}});
  EXPECT_EQ(c.restore_latest(run())->save_path(), ckpt(2));
  EXPECT_EQ(v.tensor().data<float>()[0], 2.0f);
  ASSERT_EQ(warnings_.size(), 1u) << warnings();
  for (const std::string& part :
       {ckpt(4) + " is corrupt", ckpt(3) + " is named by", "falling back to " + ckpt(2)}) {
    EXPECT_NE(warnings_[0].find(part), std::string::npos) << warnings_[0];
  }
  EXPECT_EQ(warnings_[0].find('\n'), std::string::npos) << warnings_[0];

  // The same directory with its state file gone: one line as well.
  fs::remove(state_file());
  warnings_.clear();
  EXPECT_EQ(restore_newest_checkpoint(c, run())->save_path(), ckpt(2));
  ASSERT_EQ(warnings_.size(), 1u) << warnings();
  EXPECT_NE(warnings_[0].find(ckpt(4) + " is corrupt"), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("restored " + ckpt(2)), std::string::npos) << warnings_[0];

  // Nothing valid left: DataLossError, not a silent fresh start.
  fs::resize_file(ckpt(2) + ".data-00000-of-00001", 10);
  fs::resize_file(ckpt(1) + ".data-00000-of-00001", 10);
  expect_throws_with<DataLossError>([&] { restore_newest_checkpoint(c, run()); },
                                    {"no valid checkpoint in " + run(), ckpt(1)});
}

TEST_F(ManagerSafetyTest, EveryCommittedCheckpointCorruptFallsBackToAnOlderUnlistedOne) {
  write_three();
  write_file_atomically(state_file(),
                        "model_checkpoint_path: \"ckpt-3\"\n"
                        "all_model_checkpoint_paths: \"ckpt-3\"\n");
  fs::resize_file(ckpt(3) + ".data-00000-of-00001", 10);
  Variable v("v", Tensor::scalar(0.0f));
  Checkpoint c({{"v", v}});
  CheckpointManager m(c, run());
  EXPECT_EQ(m.restore_or_initialize(), ckpt(2));
  EXPECT_EQ(v.tensor().data<float>()[0], 2.0f);
}

// The child holds a manager on `dir` until it is killed; it says so through `ready_fd`.
[[noreturn]] void hold_directory(const std::string& dir, int ready_fd) {
  try {
    Variable v("v", Tensor::scalar(1.0f));
    Checkpoint c({{"v", v}});
    CheckpointManager m(c, dir);
    m.save();
    const char byte = 1;
    if (::write(ready_fd, &byte, 1) != 1) _exit(4);
    for (;;) ::pause();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "holder failed: %s\n", e.what());
    _exit(3);
  }
}

TEST_F(ManagerSafetyTest, ASecondWriterFailsFastUntilTheFirstDies) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    hold_directory(run(), fds[1]);
  }
  ::close(fds[1]);
  char byte = 0;
  const bool ready = ::read(fds[0], &byte, 1) == 1;
  ::close(fds[0]);
  ASSERT_TRUE(ready) << "the first writer did not start";
  Variable v("v", Tensor::scalar(2.0f));
  Checkpoint c({{"v", v}});
  expect_throws_with<FailedPreconditionError>(
      [&] { CheckpointManager second(c, run()); },
      {run(), "pid " + std::to_string(pid), run() + "/.dtrain.lock"});
  // Readers need no lock.
  EXPECT_EQ(restore_newest_checkpoint(c, run())->save_path(), ckpt(1));
  // SIGKILL: the kernel releases the lock; a restarted writer gets it and continues.
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the holder exited on its own: " << status;
  CheckpointManager third(c, run());
  EXPECT_EQ(third.restore_or_initialize(), ckpt(1));
  EXPECT_EQ(third.save(), ckpt(2));
}

TEST_F(ManagerSafetyTest, OneManagerPerDirectoryInAProcessAndTheLockFileGoesWithIt) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint c({{"v", v}});
  {
    CheckpointManager first(c, run());
    const std::string what = expect_throws<FailedPreconditionError>(
        [&] { CheckpointManager second(c, tmp_.file("run/../run")); });
    EXPECT_NE(what.find("this process (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
        << what;
    EXPECT_TRUE(fs::exists(tmp_.file("run/.dtrain.lock")));
    first.save();
  }
  EXPECT_FALSE(fs::exists(tmp_.file("run/.dtrain.lock")));  // released and removed
  CheckpointManager again(c, run());
  EXPECT_EQ(again.restore_or_initialize(), ckpt(1));
  expect_throws_with<InvalidArgumentError>(
      [&] { CheckpointManager bad(c, tmp_.file("x"), {.checkpoint_name = "../ckpt"}); },
      {"checkpoint_name", "../ckpt"});
}

}  // namespace
}  // namespace dtrain::checkpoint
