#include "dtrain/checkpoint/checkpoint_manager.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_state.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "testutil/checkpoint_state_check.h"
#include "testutil/temp_dir.h"

namespace dtrain::checkpoint {
namespace {

namespace fs = std::filesystem;

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::make_temp_dir("dtrain_manager_test");
    set_warning_handler([this](const std::string& w) { warnings_.push_back(w); });
  }
  void TearDown() override {
    set_warning_handler(nullptr);
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::vector<std::string> paths(std::initializer_list<int> numbers) const {
    std::vector<std::string> out;
    for (int n : numbers) out.push_back(path("ckpt-" + std::to_string(n)));
    return out;
  }
  bool exists(int n) const { return fs::exists(path("ckpt-" + std::to_string(n) + ".index")); }
  std::string dir_;
  std::vector<std::string> warnings_;
};

TEST_F(ManagerTest, KeepsTheNewestMaxToKeepAndDeletesOlderOnesAfterCommitting) {
  Variable v("v", Tensor::scalar(0.0f));
  Checkpoint ckpt({{"v", v}});
  {
    CheckpointManager manager(ckpt, dir_, {.max_to_keep = 3});
    EXPECT_FALSE(manager.latest_checkpoint().has_value());
    for (int i = 1; i <= 5; ++i) {
      v.tensor().fill(i);
      EXPECT_EQ(manager.save(), path("ckpt-" + std::to_string(i)));
    }
    EXPECT_EQ(manager.checkpoints(), paths({3, 4, 5}));
    EXPECT_EQ(manager.latest_checkpoint(), path("ckpt-5"));
  }  // (one manager per directory at a time)
  EXPECT_FALSE(exists(1));
  EXPECT_FALSE(exists(2));
  EXPECT_FALSE(fs::exists(path("ckpt-2.data-00000-of-00001")));
  EXPECT_TRUE(exists(3));
  EXPECT_EQ(latest_checkpoint(dir_), path("ckpt-5"));
  const std::string state = read_file(path("checkpoint"));
  EXPECT_NE(state.find("all_model_checkpoint_paths: \"ckpt-3\"\n"), std::string::npos) << state;
  EXPECT_EQ(state.find("\"ckpt-2\""), std::string::npos) << state;
  EXPECT_NE(state.find("all_model_checkpoint_timestamps: "), std::string::npos) << state;
  EXPECT_NE(state.find("last_preserved_timestamp: "), std::string::npos) << state;

  // A new manager (a restarted process) recovers the list and keeps rotating.
  Variable w("v", Tensor::scalar(0.0f));
  Checkpoint ckpt2({{"v", w}});
  CheckpointManager manager2(ckpt2, dir_, {.max_to_keep = 3});
  EXPECT_EQ(manager2.checkpoints(), paths({3, 4, 5}));
  EXPECT_EQ(manager2.restore_or_initialize(), path("ckpt-5"));
  EXPECT_EQ(w.tensor().data<float>()[0], 5.0f);
  EXPECT_EQ(manager2.save(), path("ckpt-6"));
  EXPECT_EQ(manager2.checkpoints(), paths({4, 5, 6}));
  EXPECT_FALSE(exists(3));
}

TEST_F(ManagerTest, RestoreOrInitializeCallsInitFnWhenThereIsNoCheckpoint) {
  Variable v("v", Tensor::scalar(0.0f));
  Checkpoint ckpt({{"v", v}});
  int inits = 0;
  CheckpointManager manager(ckpt, path("sub/dir"), {.init_fn = [&] { ++inits; }});
  EXPECT_TRUE(fs::is_directory(path("sub/dir")));
  EXPECT_FALSE(manager.restore_or_initialize().has_value());
  EXPECT_EQ(inits, 1);
  manager.save();
  EXPECT_EQ(manager.restore_or_initialize(), path("sub/dir/ckpt-1"));
  EXPECT_EQ(inits, 1);
}

TEST_F(ManagerTest, RestoreOrInitializeFallsBackPastACorruptLatest) {
  Variable v("v", Tensor::from_vector<float>({1, 2}, Shape{2}));
  Checkpoint ckpt({{"v", v}});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 2});
  manager.save();
  v.tensor().fill(7);
  const std::string second = *manager.save();
  fs::resize_file(second + ".data-00000-of-00001", 10);  // torn
  v.tensor().fill(0);
  EXPECT_EQ(manager.restore_or_initialize(), path("ckpt-1"));
  EXPECT_EQ(v.tensor().to_vector<float>(), (std::vector<float>{1, 2}));
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("truncated"), std::string::npos) << warnings_[0];
}

TEST_F(ManagerTest, CheckpointIntervalSkipsSavesUntilEnoughStepsPassed) {
  Variable v("v", Tensor::scalar(0.0f));
  Checkpoint ckpt({{"v", v}});
  int64_t step = 0;
  CheckpointManager manager(ckpt, dir_,
                            {.step_counter = [&] { return step; }, .checkpoint_interval = 10});
  EXPECT_TRUE(manager.save().has_value());
  step = 5;
  EXPECT_FALSE(manager.save().has_value());
  EXPECT_TRUE(manager.save(std::nullopt, /*check_interval=*/false).has_value());
  step = 14;
  EXPECT_FALSE(manager.save().has_value());
  step = 15;
  EXPECT_TRUE(manager.save().has_value());
  EXPECT_EQ(manager.save(100, false), path("ckpt-100"));
  EXPECT_THROW(CheckpointManager(ckpt, dir_, {.checkpoint_interval = 5}), InvalidArgumentError);
  EXPECT_THROW(CheckpointManager(ckpt, dir_, {.max_to_keep = 0}), InvalidArgumentError);
}

TEST_F(ManagerTest, KeepCheckpointEveryNHoursPreservesOldCheckpoints) {
  Variable v("v", Tensor::scalar(0.0f));
  {
    Checkpoint writer({{"v", v}});
    for (int n : {1, 2, 3}) writer.write(path("ckpt-" + std::to_string(n)));
  }
  write_file_atomically(path("checkpoint"),
                        "model_checkpoint_path: \"ckpt-3\"\n"
                        "all_model_checkpoint_paths: \"ckpt-1\"\n"
                        "all_model_checkpoint_paths: \"ckpt-2\"\n"
                        "all_model_checkpoint_paths: \"ckpt-3\"\n"
                        "all_model_checkpoint_timestamps: 1000.0\n"
                        "all_model_checkpoint_timestamps: 8200.0\n"
                        "all_model_checkpoint_timestamps: 8300.0\n"
                        "last_preserved_timestamp: 0.0\n");
  Checkpoint ckpt({{"v", v}});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 1, .keep_checkpoint_every_n_hours = 1});
  EXPECT_EQ(manager.checkpoints(), paths({1, 2, 3}));
  EXPECT_EQ(manager.save(10), path("ckpt-10"));
  EXPECT_EQ(manager.checkpoints(), paths({10}));
  EXPECT_FALSE(exists(1));
  EXPECT_TRUE(exists(2));  // 8200 s is ≥ 1 h after the last preserved one
  EXPECT_FALSE(exists(3));
  EXPECT_NE(read_file(path("checkpoint")).find("last_preserved_timestamp: 8200.0"),
            std::string::npos);
}

TEST_F(ManagerTest, AsyncSavesCommitAndRotateOnTheWriterThread) {
  Variable v("v", Tensor::full(Shape{1 << 18}, 0.0f));
  Checkpoint ckpt({{"v", v}}, {.enable_async = true});
  {
    CheckpointManager manager(ckpt, dir_, {.max_to_keep = 2});
    for (int i = 1; i <= 4; ++i) {
      v.tensor().fill(i);
      manager.save();
      v.tensor().fill(-1);  // after save() returned: must not reach the file
    }
    manager.sync();
    EXPECT_EQ(manager.checkpoints(), paths({3, 4}));
    EXPECT_FALSE(exists(2));
  }
  Variable r("v", Tensor::zeros(Shape{1 << 18}));
  Checkpoint reader({{"v", r}});
  reader.restore(path("ckpt-3")).assert_consumed();
  EXPECT_TRUE(r.tensor().equals(Tensor::full(Shape{1 << 18}, 3.0f)));
  reader.restore(path("ckpt-4")).assert_consumed();
  EXPECT_TRUE(r.tensor().equals(Tensor::full(Shape{1 << 18}, 4.0f)));
}

TEST_F(ManagerTest, PipelinedAsyncSavesCommitInOrderAndRotateAfterCommitting) {
  Variable v("v", Tensor::full(Shape{1 << 16}, 0.0f));
  Checkpoint ckpt({{"v", v}}, {.enable_async = true, .max_in_flight = 8});
  constexpr int kSaves = 40;
  {
    CheckpointManager manager(ckpt, dir_, {.max_to_keep = 3});
    // The state file only ever lists consecutive checkpoints, newest last, moving forward.
    testutil::StateFilePoller poller(dir_, 3);
    for (int i = 1; i <= kSaves; ++i) {
      v.tensor().fill(static_cast<float>(i));
      EXPECT_EQ(manager.save(), path("ckpt-" + std::to_string(i)));
      v.tensor().fill(-1.0f);  // after save() returned: must not reach the file
    }
    manager.sync();
    poller.stop();
    EXPECT_EQ(poller.bad(), 0) << poller.first_bad();
    EXPECT_EQ(manager.checkpoints(), paths({kSaves - 2, kSaves - 1, kSaves}));
    EXPECT_EQ(manager.latest_checkpoint(), path("ckpt-" + std::to_string(kSaves)));
    for (int i = 1; i < kSaves - 2; ++i) {
      EXPECT_FALSE(exists(i)) << i;
      EXPECT_FALSE(fs::exists(path("ckpt-" + std::to_string(i) + ".data-00000-of-00001"))) << i;
    }
  }
  for (int i = kSaves - 2; i <= kSaves; ++i) {
    Variable r("v", Tensor::zeros(Shape{1 << 16}));
    Checkpoint reader({{"v", r}});
    reader.restore(path("ckpt-" + std::to_string(i))).assert_consumed();
    EXPECT_TRUE(r.tensor().equals(Tensor::full(Shape{1 << 16}, static_cast<float>(i)))) << i;
  }
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(ManagerTest, PipelinedErrorKeepsTheLastGoodCheckpointCommittedAndSurfacesOnce) {
  // ckpt-4 cannot be written; saves 1..8 are queued, most of them before it fails.
  fs::create_directories(path("ckpt-4.data-00000-of-00001"));
  Variable v("v", Tensor::full(Shape{1 << 14}, 0.0f));
  Checkpoint ckpt({{"v", v}}, {.enable_async = true, .max_in_flight = 8});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 2});
  int errors = 0;
  std::vector<std::string> before, after;
  for (int i = 1; i <= 8; ++i) {
    v.tensor().fill(static_cast<float>(i));
    try {
      (errors ? after : before).push_back(*manager.save());
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("ckpt-4.data"), std::string::npos) << e.what();
    }
  }
  try {
    manager.sync();
  } catch (const Error& e) {
    ++errors;
    EXPECT_NE(std::string(e.what()).find("ckpt-4.data"), std::string::npos) << e.what();
  }
  EXPECT_EQ(errors, 1);
  EXPECT_NO_THROW(manager.sync());
  ASSERT_GE(before.size(), 4u);
  // ckpt-2 and ckpt-3 stay committed (nothing after the failure committed or rotated them
  // out), followed by whatever was saved after the error was reported, within max_to_keep.
  std::vector<std::string> expected = {path("ckpt-2"), path("ckpt-3")};
  expected.insert(expected.end(), after.begin(), after.end());
  expected.erase(expected.begin(), expected.end() - std::min<ptrdiff_t>(2, expected.size()));
  EXPECT_EQ(manager.checkpoints(), expected);
  EXPECT_EQ(latest_checkpoint(dir_), expected.back());
  for (size_t i = 4; i < before.size(); ++i) EXPECT_FALSE(fs::exists(before[i] + ".index"));
  Variable r("v", Tensor::zeros(Shape{1 << 14}));
  Checkpoint reader({{"v", r}});
  EXPECT_EQ(restore_newest_checkpoint(reader, dir_)->save_path(), expected.back());
}

TEST_F(ManagerTest, OverwritingATrackedCheckpointUncommitsItFirst) {
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"v", v}});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 5});
  manager.save();
  manager.save();
  v.tensor().fill(9);
  EXPECT_EQ(manager.save(1), path("ckpt-1"));  // rewrites ckpt-1, which moves to the end
  EXPECT_EQ(manager.checkpoints(), paths({2, 1}));
  EXPECT_EQ(manager.latest_checkpoint(), path("ckpt-1"));
  Variable r("v", Tensor::scalar(0.0f));
  Checkpoint reader({{"v", r}});
  reader.restore_latest(dir_);
  EXPECT_EQ(r.tensor().data<float>()[0], 9.0f);
}

ino_t inode_of(const std::string& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) out.push_back(name);
  }
  return out;
}

TEST_F(ManagerTest, RecyclesTheFilesOfDroppedCheckpointsAndRemovesSparesAtTheEnd) {
  for (const bool recycle : {true, false}) {
    SCOPED_TRACE(recycle ? "recycle_files" : "delete");
    fs::remove_all(dir_);
    Variable v("v", Tensor::zeros(Shape{1000}));
    Checkpoint ckpt({{"v", v}});
    {
      CheckpointManager manager(ckpt, dir_, {.max_to_keep = 2, .recycle_files = recycle});
      v.tensor().fill(1.0f);
      manager.save();
      const ino_t data1 = inode_of(path("ckpt-1.data-00000-of-00001"));
      const ino_t index1 = inode_of(path("ckpt-1.index"));
      v.tensor().fill(2.0f);
      manager.save();
      v.tensor().fill(3.0f);
      manager.save();  // drops ckpt-1
      EXPECT_FALSE(exists(1));
      EXPECT_FALSE(fs::exists(path("ckpt-1.data-00000-of-00001")));
      EXPECT_EQ(temporaries(dir_).size(), recycle ? 2u : 0u);
      v.tensor().fill(4.0f);
      manager.save();  // written over ckpt-1's files when recycling
      if (recycle) {   // (ext4 may also hand a deleted inode's number to a new file)
        EXPECT_EQ(inode_of(path("ckpt-4.data-00000-of-00001")), data1);
        EXPECT_EQ(inode_of(path("ckpt-4.index")), index1);
        EXPECT_EQ(temporaries(dir_).size(), 2u);  // ckpt-1's taken, ckpt-2's new
      }
      EXPECT_EQ(manager.checkpoints(), paths({3, 4}));
      Variable r("v", Tensor::zeros(Shape{1000}));
      Checkpoint reader({{"v", r}});
      EXPECT_EQ(reader.restore_latest(dir_)->save_path(), path("ckpt-4"));
      EXPECT_TRUE(r.tensor().equals(v.tensor()));
      reader.restore(path("ckpt-3"));
      EXPECT_EQ(r.tensor().data<float>()[999], 3.0f);
    }
    EXPECT_TRUE(temporaries(dir_).empty());  // the manager removed its spares
  }
}

TEST_F(ManagerTest, AReaderKeepsTheBytesOfACheckpointThatIsDroppedWhileItReads) {
  Variable v("v", Tensor::zeros(Shape{4096}));
  Checkpoint ckpt({{"v", v}});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 1});
  manager.save();
  BundleReader old_reader(path("ckpt-1"));  // holds ckpt-1's data file (a shared flock)
  EXPECT_FALSE(old_reader.files_replaced());
  v.tensor().fill(5.0f);
  manager.save();  // drops ckpt-1: its files become spares
  manager.save();  // ckpt-3 may not overwrite the held data file: it is deleted instead
  EXPECT_FALSE(old_reader.files_replaced());
  EXPECT_TRUE(old_reader.read("v/.ATTRIBUTES/VARIABLE_VALUE").equals(Tensor::zeros(Shape{4096})));
  EXPECT_EQ(temporaries(dir_).size(), 2u);  // ckpt-2's spares; ckpt-1's data spare is gone
  BundleReader reader(path("ckpt-3"));
  EXPECT_FALSE(reader.files_replaced());
  EXPECT_EQ(reader.read("v/.ATTRIBUTES/VARIABLE_VALUE").data<float>()[4095], 5.0f);
}

// Another thread restores the newest checkpoint over and over while saves (every one dropping
// the previous checkpoint and recycling its files) run as fast as they can: every restore gets
// one complete checkpoint, never a mix.
TEST_F(ManagerTest, RestoresWhileSavingNeverMixCheckpoints) {
  constexpr int kElems = 1 << 15;
  Variable a("a", Tensor::zeros(Shape{kElems}));
  Variable b("b", Tensor::zeros(Shape{kElems}));
  Checkpoint ckpt({{"a", a}, {"b", b}}, {.enable_async = true});
  CheckpointManager manager(ckpt, dir_, {.max_to_keep = 1});
  a.tensor().fill(0.0f);
  b.tensor().fill(0.0f);
  manager.save();
  manager.sync();
  std::atomic<bool> done{false};
  int restored = 0, aborted = 0, mixed = 0;
  std::string failure;
  std::thread restorer([&] {
    Variable ra("a", Tensor::zeros(Shape{kElems}));
    Variable rb("b", Tensor::zeros(Shape{kElems}));
    Checkpoint reader({{"a", ra}, {"b", rb}});
    while (!done.load()) {
      try {
        if (!reader.restore_latest(dir_)) continue;
      } catch (const AbortedError&) {
        ++aborted;  // five recycled in a row: allowed, never a wrong value
        continue;
      } catch (const std::exception& e) {
        if (failure.empty()) failure = e.what();
        continue;
      }
      ++restored;
      const float* pa = ra.tensor().data<float>();
      const float* pb = rb.tensor().data<float>();
      for (int i = 0; i < kElems; i += 1021) {
        if (pa[i] != pa[0] || pb[i] != pa[0]) {
          ++mixed;
          break;
        }
      }
    }
  });
  for (int k = 1; k <= 400 || restored < 20; ++k) {
    a.tensor().fill(static_cast<float>(k));
    b.tensor().fill(static_cast<float>(k));
    manager.save();
    if (k > 100000) break;
  }
  manager.sync();
  done = true;
  restorer.join();
  EXPECT_EQ(failure, "");
  EXPECT_EQ(mixed, 0);
  EXPECT_GE(restored, 20) << aborted << " aborted";
}

TEST_F(ManagerTest, RemovesTemporariesOfDeadWriters) {
  write_file_atomically(path("ckpt-7.data-00000-of-00001.tmp.999999999.1234"), "torn");
  write_file_atomically(path("checkpoint.tmp.999999999.77"), "torn");
  write_file_atomically(path("unrelated.tmp.999999999.1"), "keep");
  Variable v("v", Tensor::scalar(1.0f));
  Checkpoint ckpt({{"v", v}});
  CheckpointManager manager(ckpt, dir_);
  EXPECT_FALSE(fs::exists(path("ckpt-7.data-00000-of-00001.tmp.999999999.1234")));
  EXPECT_FALSE(fs::exists(path("checkpoint.tmp.999999999.77")));
  EXPECT_TRUE(fs::exists(path("unrelated.tmp.999999999.1")));
}

}  // namespace
}  // namespace dtrain::checkpoint
