// A training process for the distributed fit() tests: trains a small classifier with
// Model::fit under no strategy, MirroredStrategy or MultiWorkerMirroredStrategy (cluster from
// TF_CONFIG) and writes every model and optimizer variable, raw, to --out.
//   fit_worker --mode single|mirrored|multi-worker --out FILE [--replicas N] [--epochs E]
//              [--verify-sync N] [--checkpoint-dir D --checkpoint-every N [--async-checkpoint 1]]
//              [--step-delay-us U] [--sync-bn 1] [--batch-size B] [--sharded-checkpoints 1]
//              [--exit-at-epoch E]
// --exit-at-epoch E: the process exits with status 3 as epoch E (0-based) begins, after the
// backups of the epochs before it (a stop that keeps the backups, unlike the end of fit).
// With --checkpoint-dir, fit backs up its whole state there and resumes from it when restarted.
// Under dtrain launch, each worker appends ".rank<R>" to --out.
// Exit status 0, or 1 with "error: CODE: message" on stderr.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

using namespace dtrain;

namespace {

// Identity layer that counts the rows it sees in training (every replica's forward pass).
class RowCounter : public nn::Layer {
 public:
  RowCounter() : nn::Layer("row_counter") {}
  std::string class_name() const override { return "RowCounter"; }
  Tensor call(const Tensor& x, bool training) override {
    if (training) rows += x.dim(0);
    return x;
  }
  std::atomic<int64_t> rows{0};
};

constexpr int64_t kExamples = 384, kFeatures = 8;

void make_data(Tensor& x, Tensor& y) {
  Philox rng(7);
  x = Tensor(Shape{kExamples, kFeatures});
  y = Tensor(DType::kInt64, Shape{kExamples});
  for (int64_t i = 0; i < kExamples; ++i) {
    const int64_t c = static_cast<int64_t>(rng.uniform_int(3));
    y.data<int64_t>()[i] = c;
    for (int64_t d = 0; d < kFeatures; ++d) {
      x.data<float>()[i * kFeatures + d] = (d % 3 == c ? 1.0f : 0.0f) + 0.7f * rng.normal();
    }
  }
}

struct Backup {
  std::string dir;            // empty: no backups
  int64_t every = 0;          // steps between backups (0: each epoch)
  int64_t step_delay_us = 0;  // sleep after each step (gives chaos tests time to strike)
  bool async = false;         // backups written on background threads
  // --sync-bn 1: Dense(16, no bias) → SyncBatchNormalization → relu instead of Dense(16, relu).
  bool sync_bn = false;
  int64_t batch_size = 32;  // --batch-size: the global batch
  bool sharded = false;     // --sharded-checkpoints 1
  int64_t exit_at_epoch = -1;
};

int run(const std::string& mode, std::string out, int replicas, int epochs, int64_t verify_every,
        const Backup& backup) {
  std::unique_ptr<distribute::Strategy> strategy;
  if (mode == "mirrored") {
    strategy = std::make_unique<distribute::MirroredStrategy>(replicas);
  } else if (mode == "multi-worker") {
    strategy = std::make_unique<distribute::MultiWorkerMirroredStrategy>(
        distribute::MultiWorkerOptions{.local_replicas = replicas});
  } else if (mode != "single") {
    throw InvalidArgumentError("unknown --mode " + mode);
  }
  std::optional<distribute::Strategy::ScopeGuard> scope;
  if (strategy) scope.emplace(strategy.get());
  // Workers other than the chief start from different weights: the chief's broadcast must
  // make them equal.
  set_random_seed(strategy ? 11 + strategy->worker_rank() : 11);
  Tensor x, y;
  make_data(x, y);
  // Rows this process's replicas computed on, counted where they are computed (replica threads
  // call the layer concurrently): proves the global batches are split.
  auto counter = std::make_shared<RowCounter>();
  nn::Sequential model;
  if (backup.sync_bn) {
    model.add_layer(nn::Dense(16, {.use_bias = false, .input_shape = Shape{kFeatures}}));
    model.add_layer(nn::BatchNormalization({.synchronized = true}));
    model.add_layer(nn::Activation("relu"));
  } else {
    model.add_layer(nn::Dense(16, {.activation = "relu", .input_shape = Shape{kFeatures}}));
  }
  model.add_layer(nn::LayerRef(counter));
  model.add_layer(nn::Dense(3));
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.01}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});
  std::vector<std::shared_ptr<train::Callback>> callbacks;
  if (backup.step_delay_us > 0) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(
        train::LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) {
          std::this_thread::sleep_for(std::chrono::microseconds(backup.step_delay_us));
        }}));
  }
  if (backup.exit_at_epoch >= 0) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(
        train::LambdaCallbackOptions{.on_epoch_begin = [&](int64_t epoch, const nn::Logs&) {
          if (epoch == backup.exit_at_epoch) std::_Exit(3);
        }}));
  }
  const auto h = model.fit(x, y,
                           {.epochs = epochs,
                            .batch_size = backup.batch_size,
                            .seed = 5,
                            .verbose = 0,
                            .callbacks = callbacks,
                            .save_checkpoints = !backup.dir.empty(),
                            .checkpoint_dir = backup.dir,
                            .checkpoint_every = backup.every,
                            .async_checkpoints = backup.async,
                            .sharded_checkpoints = backup.sharded,
                            .verify_sync_every = verify_every});
  // Under dtrain launch every worker writes its own file.
  if (const char* rank = std::getenv("DTRAIN_RANK")) out += std::string(".rank") + rank;
  std::printf(
      "rows %lld of %lld, replicas in sync %d\n", static_cast<long long>(counter->rows.load()),
      static_cast<long long>(kExamples * epochs), strategy ? strategy->num_replicas_in_sync() : 1);
  std::ofstream f(out, std::ios::binary);
  for (Variable* v : model.weights())
    f.write(static_cast<const char*>(v->tensor().raw_data()), v->tensor().nbytes());
  for (Variable* v : model.optimizer()->variables()) {
    f.write(static_cast<const char*>(v->tensor().raw_data()), v->tensor().nbytes());
  }
  std::printf("%s done: loss %.6f accuracy %.6f\n", mode.c_str(), h.last("loss"),
              h.last("accuracy"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "single", out;
  int replicas = 1, epochs = 2;
  int64_t verify_every = 0;
  Backup backup;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      mode = v;
    else if (k == "--out")
      out = v;
    else if (k == "--replicas")
      replicas = std::atoi(v.c_str());
    else if (k == "--epochs")
      epochs = std::atoi(v.c_str());
    else if (k == "--verify-sync")
      verify_every = std::atoll(v.c_str());
    else if (k == "--checkpoint-dir")
      backup.dir = v;
    else if (k == "--checkpoint-every")
      backup.every = std::atoll(v.c_str());
    else if (k == "--step-delay-us")
      backup.step_delay_us = std::atoll(v.c_str());
    else if (k == "--async-checkpoint")
      backup.async = v == "1";
    else if (k == "--sync-bn")
      backup.sync_bn = v == "1";
    else if (k == "--batch-size")
      backup.batch_size = std::atoll(v.c_str());
    else if (k == "--sharded-checkpoints")
      backup.sharded = v == "1";
    else if (k == "--exit-at-epoch")
      backup.exit_at_epoch = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "error: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    return run(mode, out, replicas, epochs, verify_every, backup);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
}
