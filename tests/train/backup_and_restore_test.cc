// BackupAndRestore resumes fit() exactly: a run interrupted mid-epoch and resumed ends with the
// weights of an uninterrupted run, bit for bit.
#include "dtrain/train/backup_and_restore.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/ops/tensor_ops.h"
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

// A callback that throws Interrupted at the end of its `crash_at_step`-th batch (1-based; a crash:
// no on_train_end); never for a value < 1.
std::shared_ptr<Callback> crash_after(int64_t crash_at_step) {
  auto steps = std::make_shared<int64_t>(0);
  return std::make_shared<LambdaCallback>(
      LambdaCallbackOptions{.on_batch_end = [steps, crash_at_step](int64_t, const nn::Logs&) {
        if (++*steps == crash_at_step) throw Interrupted();
      }});
}

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
  auto crasher = crash_after(crash_at_step);
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

// A finished run deletes the files its backups wrote, not the user's files beside them.
TEST_F(BackupAndRestoreTest, AFinishedRunDeletesOnlyItsOwnFiles) {
  const Data d = make_data(64);
  fs::create_directories(dir_);
  { std::ofstream(fs::path(dir_) / "notes.txt") << "mine"; }
  { std::ofstream(fs::path(dir_) / "backup-notes.txt") << "mine too"; }
  ASSERT_FALSE(train(d, dir_, -1, 2).empty());
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "notes.txt"));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "backup-notes.txt"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left.size(), 2u) << "backups left behind: " << ::testing::PrintToString(left);
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

struct Stopped {
  int64_t stopped_epoch = -1;
  size_t epochs = 0;
  std::vector<Tensor> weights;
};

// Trains with EarlyStopping(loss, min_delta 1e9, patience 3, restore_best_weights): only epoch 0
// counts as an improvement, so training stops after epoch 3 with epoch 0's weights put back.
// EarlyStopping comes after BackupAndRestore, so its on_train_begin runs after the restore.
std::optional<Stopped> train_with_early_stopping(const Data& d, const std::string& dir,
                                                 int64_t crash_at_step, int64_t save_freq = 3) {
  set_random_seed(77);
  nn::clear_session();
  nn::Sequential model(
      {nn::Dense(8, {.activation = "relu", .input_shape = Shape{6}}), nn::Dense(3)});
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  auto stop = std::make_shared<EarlyStopping>(EarlyStoppingOptions{
      .monitor = "loss", .min_delta = 1e9, .patience = 3, .restore_best_weights = true});
  auto crasher = crash_after(crash_at_step);
  std::vector<std::shared_ptr<Callback>> callbacks;
  if (!dir.empty()) {
    callbacks.push_back(
        std::make_shared<BackupAndRestore>(dir, BackupAndRestoreOptions{.save_freq = save_freq}));
  }
  callbacks.push_back(stop);
  callbacks.push_back(crasher);
  Stopped out;
  try {
    out.epochs =
        model.fit(d.x, d.y, {.epochs = 10, .batch_size = 16, .verbose = 0, .callbacks = callbacks})
            .epochs()
            .size();
  } catch (const Interrupted&) {
    return std::nullopt;
  }
  out.stopped_epoch = stop->stopped_epoch();
  for (Variable* v : model.weights()) out.weights.push_back(v->tensor().clone());
  return out;
}

// EarlyStopping's wait count, best value and best weights are part of every backup: a run
// interrupted after epochs without improvement stops at the same epoch as an uninterrupted one,
// with the same weights put back (a fresh EarlyStopping would wait three more epochs and keep
// the last ones).
TEST_F(BackupAndRestoreTest, EarlyStoppingResumesItsPatienceAndBestWeights) {
  const Data d = make_data(64);  // 4 steps per epoch
  const auto reference = train_with_early_stopping(d, "", -1);
  ASSERT_TRUE(reference.has_value());
  ASSERT_EQ(reference->stopped_epoch, 3);
  // Crash in epoch 2 (step 10); the newest backup is after step 9, with epoch 1's wait of 1.
  EXPECT_FALSE(train_with_early_stopping(d, dir_, 10).has_value());
  testing::internal::CaptureStderr();
  const auto resumed = train_with_early_stopping(d, dir_, -1);
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(resumed.has_value());
  EXPECT_NE(err.find("resumed from"), std::string::npos) << err;
  EXPECT_EQ(resumed->stopped_epoch, reference->stopped_epoch);
  EXPECT_EQ(resumed->epochs, 2u) << "epochs 2 and 3 ran after the resume";
  ASSERT_EQ(resumed->weights.size(), reference->weights.size());
  for (size_t i = 0; i < reference->weights.size(); ++i) {
    EXPECT_TRUE(resumed->weights[i].equals(reference->weights[i])) << "weight " << i;
  }
}

// With backups at each epoch's end the same holds, although BackupAndRestore is listed before
// EarlyStopping: fit runs the backups' on_epoch_end after the other callbacks', so the backup
// of epoch 1 holds epoch 1's count.
TEST_F(BackupAndRestoreTest, EpochEndBackupsHoldTheEpochsEarlyStoppingState) {
  const Data d = make_data(64);  // 4 steps per epoch
  const auto reference = train_with_early_stopping(d, "", -1);
  ASSERT_TRUE(reference.has_value());
  EXPECT_FALSE(train_with_early_stopping(d, dir_, 10, 0).has_value());  // after epoch 1's backup
  const auto resumed = train_with_early_stopping(d, dir_, -1, 0);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->stopped_epoch, reference->stopped_epoch);
  ASSERT_EQ(resumed->weights.size(), reference->weights.size());
  for (size_t i = 0; i < reference->weights.size(); ++i) {
    EXPECT_TRUE(resumed->weights[i].equals(reference->weights[i])) << "weight " << i;
  }
}

// A user's callback with state of its own (docs/guide.md): two of them, so the second is saved
// as "epoch_counter_1"; each starts at a different count.
class EpochCounter : public Callback {
 public:
  explicit EpochCounter(int64_t start) : n_(start) {}
  void on_epoch_end(int64_t, const nn::Logs&) override { ++n_; }
  std::string state_name() const override { return "epoch_counter"; }
  std::vector<Tensor> state() const override {
    Tensor t(DType::kInt64, Shape{});
    t.data<int64_t>()[0] = n_;
    return {t};
  }
  void set_state(const std::vector<Tensor>& s) override { n_ = s.at(0).data<int64_t>()[0]; }
  int64_t count() const { return n_; }

 private:
  int64_t n_;
};

TEST_F(BackupAndRestoreTest, AUsersCallbackStateResumes) {
  const Data d = make_data(64);  // 4 steps per epoch
  const auto run = [&](int64_t crash_at_step) -> std::optional<std::pair<int64_t, int64_t>> {
    set_random_seed(3);
    nn::clear_session();
    nn::Sequential model({nn::Dense(3, {.input_shape = Shape{6}})});
    model.compile(
        {.optimizer = "sgd", .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
    auto a = std::make_shared<EpochCounter>(0);
    auto b = std::make_shared<EpochCounter>(100);
    auto crasher = crash_after(crash_at_step);
    try {
      model.fit(d.x, d.y,
                {.epochs = 5,
                 .batch_size = 16,
                 .verbose = 0,
                 .callbacks = {a, b, crasher},
                 .save_checkpoints = true,
                 .checkpoint_dir = dir_,
                 .checkpoint_every = 3});
    } catch (const Interrupted&) {
      return std::nullopt;
    }
    return std::pair{a->count(), b->count()};
  };
  EXPECT_FALSE(run(14).has_value());  // in epoch 3; the newest backup is after step 12
  const auto resumed = run(-1);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->first, 5);
  EXPECT_EQ(resumed->second, 105);
}

TEST(EarlyStoppingState, RoundTripsThroughSetState) {
  EarlyStopping a(EarlyStoppingOptions{.monitor = "loss", .patience = 5});
  a.on_train_begin({});
  a.on_epoch_end(0, {{"loss", 2.0}});
  a.on_epoch_end(1, {{"loss", 3.0}});
  EXPECT_EQ(a.wait(), 1);
  EarlyStopping b(EarlyStoppingOptions{.monitor = "loss", .patience = 5});
  b.on_train_begin({});
  b.set_state(a.state());
  EXPECT_EQ(b.wait(), 1);
  b.on_epoch_end(2, {{"loss", 1.9}});  // improves on the restored best (2.0)
  EXPECT_EQ(b.wait(), 0);
  EXPECT_THROW(b.set_state({Tensor::zeros(Shape{3}, DType::kFloat64)}), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::train

namespace dtrain::train {
namespace {

// A step whose gradients are non-finite is skipped; three in a row roll back to the last backup.
// The model's weights and the optimizer's variables (slots and iteration count), copied.
std::vector<Tensor> training_state(nn::Model& model) {
  std::vector<Tensor> out;
  for (Variable* v : model.weights()) out.push_back(v->tensor().clone());
  for (Variable* v : model.optimizer()->variables()) out.push_back(v->tensor().clone());
  return out;
}

bool bitwise_equal(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].nbytes() != b[i].nbytes() ||
        std::memcmp(a[i].raw_data(), b[i].raw_data(), static_cast<size_t>(a[i].nbytes())) != 0) {
      return false;
    }
  }
  return true;
}

TEST_F(BackupAndRestoreTest, NonFiniteStepsAreSkippedAndRolledBack) {
  Data d = make_data(160);  // 10 batches of 16 per epoch, not shuffled below
  // Backups are taken after steps 4 and 8. Step 5 (batch 4) trains, so the live state moves
  // away from the backup of step 4; batches 5, 6 and 7 (steps 6-8) carry a NaN, so their
  // updates are skipped and the third one rolls back to the backup of step 4 before step 8's
  // own backup; batches 8 and 9 train again.
  for (int64_t row : {5 * 16 + 1, 6 * 16 + 2, 7 * 16 + 3}) d.x.data<float>()[row * 6] = NAN;
  set_random_seed(5);
  nn::Sequential model(
      {nn::Dense(8, {.activation = "relu", .input_shape = Shape{6}}), nn::Dense(3)});
  model.compile(
      {.optimizer = "adam", .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  std::vector<std::vector<Tensor>> after;  // the state after each batch
  std::vector<int64_t> iterations;         // the optimizer's iterations after each batch
  auto watch = std::make_shared<LambdaCallback>(
      LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) {
        after.push_back(training_state(model));
        iterations.push_back(model.optimizer()->iterations());
      }});
  testing::internal::CaptureStderr();
  const auto h =
      model.fit(d.x, d.y,
                {.epochs = 1,
                 .batch_size = 16,
                 .shuffle = false,
                 .verbose = 0,
                 .callbacks = {watch, std::make_shared<BackupAndRestore>(
                                          dir_, BackupAndRestoreOptions{.save_freq = 4})},
                 .skip_nonfinite = true,
                 .rollback_after_nonfinite = 3});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("update skipped (3 in a row)"), std::string::npos) << err;
  EXPECT_NE(err.find("rolled back to the last good checkpoint"), std::string::npos) << err;
  EXPECT_TRUE(std::isfinite(h.last("loss")));
  ASSERT_EQ(after.size(), 10u);
  EXPECT_EQ(iterations, (std::vector<int64_t>{1, 2, 3, 4, 5, 5, 5, 4, 5, 6}));
  // The step after the backup changed the state: a rollback to it is observable.
  EXPECT_FALSE(bitwise_equal(after[4], after[3]));
  // The first two skipped steps leave the state alone; the third restores the backup of step 4,
  // weights, Adam's slots and iteration count, bit for bit.
  EXPECT_TRUE(bitwise_equal(after[5], after[4]));
  EXPECT_TRUE(bitwise_equal(after[6], after[4]));
  EXPECT_TRUE(bitwise_equal(after[7], after[3]));
  for (const auto& state : after) {
    for (const Tensor& t : state) ASSERT_TRUE(ops::all_finite(t));
  }
}

TEST_F(BackupAndRestoreTest, NonFiniteStateIsNeverBackedUp) {
  const Data d = make_data(64);
  set_random_seed(6);
  nn::Sequential model({nn::Dense(3, {.input_shape = Shape{6}})});
  model.compile(
      {.optimizer = "sgd", .loss = nn::SparseCategoricalCrossentropy({.from_logits = true})});
  auto poison = std::make_shared<LambdaCallback>(
      LambdaCallbackOptions{.on_batch_end = [&](int64_t b, const nn::Logs&) {
        if (b == 1) model.weights()[0]->tensor().data<float>()[0] = NAN;
      }});
  testing::internal::CaptureStderr();
  model.fit(d.x, d.y,
            {.epochs = 1,
             .batch_size = 16,
             .verbose = 0,
             .callbacks = {poison, std::make_shared<BackupAndRestore>(
                                       dir_, BackupAndRestoreOptions{
                                                 .save_freq = 1, .delete_checkpoint = false})}});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("not backing up"), std::string::npos) << err;
  // Only the backup of step 1 (before the poison) exists.
  EXPECT_EQ(checkpoint::latest_checkpoint(dir_).value_or(""), dir_ + "/backup-1");
}

}  // namespace
}  // namespace dtrain::train
