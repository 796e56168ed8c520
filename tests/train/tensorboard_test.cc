// fit(..., {.logdir}) and the TensorBoard callback write Keras's tags into event files that the
// summary reader (and TensorBoard) can read.
#include "dtrain/train/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>

#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/summary/event_reader.h"
#include "dtrain/train/training.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

// tag -> (step -> value) of every scalar in the event files under `dir`; texts under "text:".
std::map<std::string, std::map<int64_t, double>> scalars(
    const fs::path& dir, std::vector<std::string>* texts = nullptr) {
  std::map<std::string, std::map<int64_t, double>> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    for (const summary::Event& e : summary::read_events(entry.path().string())) {
      for (const summary::SummaryValue& v : e.values) {
        if (v.metadata.plugin_name == "text") {
          if (texts) texts->push_back(v.tag + ": " + v.text());
        } else if (v.is_scalar()) {
          out[v.tag][e.step] = v.value;
        }
      }
    }
  }
  return out;
}

TEST(TensorBoardCallback, WritesKerasTagsForTrainingAndValidation) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_tb_" + std::to_string(getpid()));
  fs::remove_all(dir);
  set_random_seed(1);
  Philox rng(2);
  Tensor x(Shape{96, 4}), y(DType::kInt64, Shape{96});
  for (int64_t i = 0; i < 96; ++i) {
    y.data<int64_t>()[i] = i % 2;
    for (int64_t d = 0; d < 4; ++d) x.data<float>()[i * 4 + d] = rng.normal() + (i % 2) * d;
  }
  nn::Sequential model(
      {nn::Dense(8, {.activation = "relu", .input_shape = Shape{4}}), nn::Dense(2)});
  model.compile({.optimizer = "adam",
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  auto tb = std::make_shared<TensorBoard>(dir.string(), TensorBoardOptions{.update_freq = 2});
  const History h = model.fit(x, y,
                              {.epochs = 3,
                               .batch_size = 16,
                               .validation_data = std::make_pair(x, y),
                               .verbose = 0,
                               .callbacks = {tb}});
  tb->text("fault", "worker 1 exited on signal 9 at step 12; restarted", 12);

  std::vector<std::string> texts;
  const auto train = scalars(dir / "train", &texts);
  const auto validation = scalars(dir / "validation");
  ASSERT_EQ(train.at("epoch_loss").size(), 3u);
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(train.at("epoch_loss").at(e), h.history().at("loss")[e], 1e-6);
    EXPECT_NEAR(train.at("epoch_accuracy").at(e), h.history().at("accuracy")[e], 1e-6);
    EXPECT_NEAR(validation.at("epoch_loss").at(e), h.history().at("val_loss")[e], 1e-6);
  }
  EXPECT_NEAR(train.at("epoch_learning_rate").at(0), 0.001, 1e-9);
  EXPECT_GT(train.at("epoch_steps_per_second").at(2), 0);
  // 6 steps per epoch, update_freq 2: batch scalars at global steps 2, 4, ..., 18.
  EXPECT_EQ(train.at("batch_loss").size(), 9u);
  EXPECT_TRUE(train.at("batch_loss").count(18));
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_NE(texts[0].find("signal 9"), std::string::npos) << texts[0];
  fs::remove_all(dir);
}

TEST(TensorBoardCallback, FitLogdirOptionAddsTheCallback) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_tb2_" + std::to_string(getpid()));
  fs::remove_all(dir);
  nn::Sequential model({nn::Dense(2, {.input_shape = Shape{3}})});
  model.compile({.optimizer = "sgd", .loss = "mse"});
  const Tensor x = Tensor::ones(Shape{8, 3}), y = Tensor::zeros(Shape{8, 2});
  model.fit(x, y, {.epochs = 2, .batch_size = 4, .verbose = 0, .logdir = dir.string()});
  EXPECT_EQ(scalars(dir / "train").at("epoch_loss").size(), 2u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::train

#include "dtrain/distribute/mirrored_strategy.h"

namespace dtrain::train {
namespace {

// The tutorial's MirroredStrategy/MultiWorkerMirroredStrategy(report_tensorboard=true).
TEST(TensorBoardCallback, StrategyReportTensorboardWritesEventFiles) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_tb3_" + std::to_string(getpid()));
  fs::remove_all(dir);
  distribute::MirroredStrategy strategy(2, {.report_tensorboard = true, .logdir = dir.string()});
  auto scope = strategy.scope();
  nn::Sequential model({nn::Dense(2, {.input_shape = Shape{3}})});
  model.compile({.optimizer = "sgd", .loss = "mse"});
  const Tensor x = Tensor::ones(Shape{8, 3}), y = Tensor::zeros(Shape{8, 2});
  model.fit(x, y, {.epochs = 3, .batch_size = 4, .verbose = 0});
  EXPECT_EQ(scalars(dir / "train").at("epoch_loss").size(), 3u);
  fs::remove_all(dir);
}

TEST(TensorBoardCallback, ReportsCheckpointSaveTimeWithBackups) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_tb4_" + std::to_string(getpid()));
  fs::remove_all(dir);
  nn::Sequential model({nn::Dense(2, {.input_shape = Shape{3}})});
  model.compile({.optimizer = "sgd", .loss = "mse"});
  const Tensor x = Tensor::ones(Shape{8, 3}), y = Tensor::zeros(Shape{8, 2});
  model.fit(x, y,
            {.epochs = 2,
             .batch_size = 4,
             .verbose = 0,
             .save_checkpoints = true,
             .checkpoint_dir = (dir / "backup").string(),
             .logdir = (dir / "tb").string()});
  const auto train = scalars(dir / "tb" / "train");
  ASSERT_EQ(train.at("epoch_checkpoint_save_seconds").size(), 2u);
  EXPECT_GT(train.at("epoch_checkpoint_save_seconds").at(1), 0.0);
  fs::remove_all(dir);
}

// profile_steps: the step-time split and memory of the (one) worker at every 3rd step, under
// MirroredStrategy (measured split) and without a strategy (the step time and memory only).
TEST(TensorBoardCallback, ProfileStepsWritesStepSplitAndMemory) {
  const fs::path dir = fs::temp_directory_path() / ("dtrain_tb5_" + std::to_string(getpid()));
  for (bool mirrored : {true, false}) {
    SCOPED_TRACE(mirrored ? "mirrored" : "no strategy");
    fs::remove_all(dir);
    std::optional<distribute::MirroredStrategy> strategy;
    std::optional<distribute::Strategy::ScopeGuard> scope;
    if (mirrored) {
      strategy.emplace(2);
      scope.emplace(&*strategy);
    }
    nn::Sequential model({nn::Dense(2, {.input_shape = Shape{3}})});
    model.compile({.optimizer = "sgd", .loss = "mse"});
    const Tensor x = Tensor::ones(Shape{24, 3}), y = Tensor::zeros(Shape{24, 2});
    auto tb = std::make_shared<TensorBoard>(dir.string(), TensorBoardOptions{.profile_steps = 3});
    model.fit(x, y, {.epochs = 2, .batch_size = 4, .verbose = 0, .callbacks = {tb}});
    auto s = scalars(dir / "profile" / "worker_0");
    // 6 steps per epoch, 12 in all: reports at steps 3, 6, 9, 12.
    ASSERT_EQ(s["profile/step_seconds"].size(), 4u);
    EXPECT_EQ(s["profile/step_seconds"].rbegin()->first, 12);
    EXPECT_EQ(s.count("profile/compute_seconds"), mirrored ? 1u : 0u);
    for (const auto& [step, total] : s["profile/step_seconds"]) {
      EXPECT_GT(total, 0) << step;
      EXPECT_GT(s["memory/peak_rss_bytes"][step], 1 << 20) << step;
      EXPECT_GT(s["memory/tensor_peak_bytes"][step], 0) << step;
      if (!mirrored) continue;
      const double compute = s["profile/compute_seconds"][step];
      const double comm = s["profile/communication_seconds"][step];
      const double wait = s["profile/waiting_seconds"][step];
      EXPECT_GT(compute, 0) << step;
      EXPECT_GE(comm, 0) << step;
      EXPECT_EQ(wait, 0) << step;  // one worker: nobody to wait for
      EXPECT_GE(s["profile/other_seconds"][step], 0) << step;
      EXPECT_LE(compute + comm + wait, total * (1 + 1e-5)) << step;
      EXPECT_NEAR(compute + comm + wait + s["profile/other_seconds"][step], total,
                  total * 1e-5 + 1e-9)
          << step;
    }
  }
  fs::remove_all(dir);
  EXPECT_THROW(TensorBoard("logs", {.profile_steps = -1}), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::train
