// BackupAndRestore resumes fit() exactly: a run interrupted mid-epoch and resumed ends with the
// weights of an uninterrupted run, bit for bit.
#include "dtrain/train/backup_and_restore.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

struct Data {
  Tensor x, y;
};
Data make_data(int64_t n) {
  Philox rng(99);
  Tensor x(Shape{n, 6});
  Tensor y(DType::kInt32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    const int32_t c = static_cast<int32_t>(rng.uniform_int(3));
    y.data<int32_t>()[i] = c;
    for (int64_t d = 0; d < 6; ++d)
      x.data<float>()[i * 6 + d] = (d % 3 == c ? 1.5f : 0) + rng.normal();
  }
  return {x, y};
}

class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("simulated crash") {}
};

// Builds, compiles and trains the same model from the same global seed. `crash_at_step` >= 0
// throws from a callback after that many global steps (a crash: no on_train_end).
std::vector<Tensor> train(const Data& d, const std::string& dir, int64_t crash_at_step,
                          int64_t save_freq, std::optional<std::string>* restored = nullptr) {
  set_random_seed(2024);
  nn::clear_session();
  nn::Sequential model({nn::Dense(12, {.activation = "relu", .input_shape = Shape{6}}),
                        nn::Dropout(0.3f), nn::Dense(3)});
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});
  int64_t steps = 0;
  auto crasher = std::make_shared<LambdaCallback>(
      LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) {
        if (++steps == crash_at_step) throw Interrupted();
      }});
  std::shared_ptr<BackupAndRestore> backup;
  std::vector<std::shared_ptr<Callback>> callbacks;
  if (!dir.empty()) {
    backup =
        std::make_shared<BackupAndRestore>(dir, BackupAndRestoreOptions{.save_freq = save_freq});
    callbacks.push_back(backup);
  }
  callbacks.push_back(crasher);
  try {
    model.fit(d.x, d.y, {.epochs = 4, .batch_size = 16, .verbose = 0, .callbacks = callbacks});
  } catch (const Interrupted&) {
    return {};
  }
  if (restored && backup) *restored = backup->restored_from();
  std::vector<Tensor> w;
  for (Variable* v : model.weights()) w.push_back(v->tensor().clone());
  for (Variable* v : model.optimizer()->variables()) w.push_back(v->tensor().clone());
  return w;
}

class BackupAndRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("dtrain_bar_" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(BackupAndRestoreTest, ResumedRunMatchesUninterruptedRunBitwise) {
  const Data d = make_data(200);  // 13 batches per epoch (12 of 16, one of 8)
  const std::vector<Tensor> reference = train(d, "", -1, 0);
  ASSERT_FALSE(reference.empty());
  // Crash mid-epoch 2 (step 20 of 52); backups every 3 steps: the newest is after step 18.
  EXPECT_TRUE(train(d, dir_, 20, 3).empty());
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "checkpoint"));
  std::optional<std::string> restored;
  const std::vector<Tensor> resumed = train(d, dir_, -1, 3, &restored);
  ASSERT_TRUE(restored.has_value());
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(resumed[i].equals(reference[i])) << "variable " << i;
  }
  EXPECT_FALSE(fs::exists(dir_)) << "a finished run deletes its backups";
}

TEST_F(BackupAndRestoreTest, EpochBackupsResumeAtTheNextEpoch) {
  const Data d = make_data(100);
  const std::vector<Tensor> reference = train(d, "", -1, 0);
  EXPECT_TRUE(train(d, dir_, 17, 0).empty());  // epoch 1 of 7-step epochs is complete
  const std::vector<Tensor> resumed = train(d, dir_, -1, 0);
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(resumed[i].equals(reference[i]));
}

TEST_F(BackupAndRestoreTest, RepeatedCrashesStillConverge) {
  const Data d = make_data(120);
  const std::vector<Tensor> reference = train(d, "", -1, 0);
  EXPECT_TRUE(train(d, dir_, 5, 2).empty());
  EXPECT_TRUE(train(d, dir_, 9, 2).empty());  // counts steps of this run: crashes again later
  const std::vector<Tensor> resumed = train(d, dir_, -1, 2);
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(resumed[i].equals(reference[i]));
}

}  // namespace
}  // namespace dtrain::train
