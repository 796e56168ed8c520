// A training process for the distributed fit() tests: trains a small classifier with
// Model::fit under no strategy, MirroredStrategy or MultiWorkerMirroredStrategy (cluster from
// TF_CONFIG) and writes every model and optimizer variable, raw, to --out.
//   fit_worker --mode single|mirrored|multi-worker --out FILE [--replicas N] [--epochs E]
//              [--verify-sync N] [--checkpoint-dir D --checkpoint-every N [--async-checkpoint 1]]
//              [--step-delay-us U] [--sync-bn 1] [--bn 1] [--resnet 1] [--batch-size B]
//              [--overlap-bucket-bytes N] [--arch mlp|cnn|lm] [--shard-optimizer-state S]
//              [--sharded-checkpoints 1] [--exit-at-epoch E] [--exit-at-step S]
//              [--report-progress 1]
//              [--input tensors|dataset] [--rows-out FILE] [--logdir D --profile-steps N]
//              [--clipnorm C | --global-clipnorm C]
//              [--logical-replicas L] [--dropout 1] [--rows-log PREFIX]
//              [--standby-delay-ms M] [--validation 1] [--die-in-validation E] [--die-at-step S]
//              [--early-stopping P]
// --overlap-bucket-bytes N (N > 0): multi-worker all-reduce overlapped with backward in buckets
// of N bytes. --arch cnn: a small Conv2D/MaxPooling2D classifier on 6x6 images. --arch lm: a
// one-block GPT (nn::GPT: vocabulary 11, context 6, d_model 8, 2 heads) on next-token windows of
// seeded arithmetic sequences.
// --exit-at-epoch E: the process exits with status 3 as epoch E (0-based) begins, after the
// backups of the epochs before it (a stop that keeps the backups, unlike the end of fit).
// --validation 1: validation data (the first 128 examples) evaluated after each epoch; the
// worker prints its History's epochs and the last val_loss. --die-in-validation E and
// --die-at-step S: rank 1 of a launched job's first generation SIGKILLs itself in the middle of
// epoch E's validation, or as the step after global step S begins (a failure at a chosen point).
// --early-stopping P: EarlyStopping(loss, min_delta 1e9, patience P), so that only epoch 0
// improves and training stops after epoch P whatever the losses are.
// --report-progress 1: under dtrain launch, report steps and heartbeats to the launcher
// (fault::install_progress_reporter), as the dtrain binary does.
// As a hot spare (dtrain launch --spares, DTRAIN_SPARE set), it makes its data and model, waits
// for a rank (--standby-delay-ms M: after sleeping M ms, a slow start-up), then joins as that rank.
// --input dataset: fit(dataset) on from_tensor_slices.shuffle.batch (every worker materialises the
// global batches and keeps its rows) instead of fit(x, y) (per-worker input).
// --rows-out FILE (MLP): writes "epoch step hash" for every input row this worker's replicas
// trained on, in order (a hash of the row's bytes).
// --rows-log PREFIX (MLP): appends "epoch step replica hash" lines (replica: the global replica
// id) to PREFIX.g<generation>.r<rank> as each replica's forward pass sees the rows (after a
// first line "world W"), so that a killed process leaves what it computed.
// --logical-replicas L: MultiWorkerOptions::logical_replicas (exact over any number of workers).
// --logdir D --profile-steps N: a TensorBoard callback writing every worker's step-time split and
// memory every N steps (the chief writes D/profile/worker_<rank>).
// With --checkpoint-dir, fit backs up its whole state there and resumes from it when restarted.
// Under dtrain launch, each worker appends ".rank<R>" to --out.
// Exit status 0, or 1 with "error: CODE: message" on stderr.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/fault/progress_reporter.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/merging.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/nn/reshaping.h"
#include "dtrain/nn/transformer.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/standby.h"
#include "dtrain/train/tensorboard.h"
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

// Identity layer that records a hash of every input row it sees in training, with the epoch and
// step the callbacks last announced. Under several replicas in sync each replica's rows are kept
// apart (replica threads call it concurrently) and written in replica order, so a worker's lines
// of a step are its rows of the global batch in order.
class RowRecorder : public nn::Layer {
 public:
  RowRecorder() : nn::Layer("row_recorder") {}
  std::string class_name() const override { return "RowRecorder"; }
  Tensor call(const Tensor& x, bool training) override {
    if (!training) return x;
    const int64_t row_bytes = x.dim(0) == 0 ? 0 : static_cast<int64_t>(x.nbytes()) / x.dim(0);
    const auto* p = static_cast<const unsigned char*>(x.raw_data());
    const int replica = current_replica_stream().replica;
    std::string mine;
    for (int64_t r = 0; r < x.dim(0); ++r) {
      uint64_t h = 1469598103934665603ull;  // FNV-1a
      for (int64_t b = 0; b < row_bytes; ++b) h = (h ^ p[r * row_bytes + b]) * 1099511628211ull;
      mine += std::to_string(epoch) + " " + std::to_string(step) + " " +
              (log != nullptr ? std::to_string(replica) + " " : "") + std::to_string(h) + "\n";
    }
    std::lock_guard<std::mutex> lock(mu);
    if (log != nullptr) {
      *log << mine << std::flush;  // before the step's collectives: a killed worker leaves it
    } else {
      lines[{epoch, step, replica}] += mine;
    }
    return x;
  }
  std::string text() const {
    std::string out;
    for (const auto& [key, l] : lines) out += l;
    return out;
  }
  int64_t epoch = 0, step = 0;
  std::ofstream* log = nullptr;  // --rows-log: written at once, with the replica
  std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int>, std::string> lines;  // by epoch, step, replica
};

constexpr int64_t kExamples = 384, kFeatures = 8;

void make_data(Tensor& x, Tensor& y, int64_t features = kFeatures) {
  Philox rng(7);
  x = Tensor(Shape{kExamples, features});
  y = Tensor(DType::kInt64, Shape{kExamples});
  for (int64_t i = 0; i < kExamples; ++i) {
    const int64_t c = static_cast<int64_t>(rng.uniform_int(3));
    y.data<int64_t>()[i] = c;
    for (int64_t d = 0; d < features; ++d) {
      x.data<float>()[i * features + d] = (d % 3 == c ? 1.0f : 0.0f) + 0.7f * rng.normal();
    }
  }
}

// --arch lm: x [kExamples, kLmContext] token ids, each row a sequence t, t + c, t + 2c, ... (mod
// kLmVocab) with one token in five replaced by a random one; y the next token of each position.
constexpr int64_t kLmVocab = 11, kLmContext = 6;
void make_lm_data(Tensor& x, Tensor& y) {
  Philox rng(9);
  x = Tensor(DType::kInt64, Shape{kExamples, kLmContext});
  y = Tensor(DType::kInt64, Shape{kExamples, kLmContext});
  for (int64_t i = 0; i < kExamples; ++i) {
    const int64_t c = 1 + static_cast<int64_t>(rng.uniform_int(3));
    int64_t t = static_cast<int64_t>(rng.uniform_int(kLmVocab));
    for (int64_t j = 0; j <= kLmContext; ++j) {
      const int64_t token =
          rng.uniform_int(5) == 0 ? static_cast<int64_t>(rng.uniform_int(kLmVocab)) : t;
      if (j < kLmContext) x.data<int64_t>()[i * kLmContext + j] = token;
      if (j > 0) y.data<int64_t>()[i * kLmContext + j - 1] = token;
      t = (t + c) % kLmVocab;
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
  // --bn 1: the same with a plain (per-replica) BatchNormalization.
  bool bn = false;
  // --resnet 1: the examples as 2×2×2 images through a Functional residual CNN with
  // SyncBatchNormalization (Conv2D → SyncBN → ReLU → Conv2D → SyncBN, Add() skip, ReLU,
  // GlobalAveragePooling2D, Dense(3)).
  bool resnet = false;
  int64_t batch_size = 32;          // --batch-size: the global batch
  size_t overlap_bucket_bytes = 0;  // 0: the all-reduce after backward
  bool cnn = false;
  bool lm = false;                           // --arch lm
  int shard = 0;                             // --shard-optimizer-state: ZeRO stage
  double clipnorm = 0, global_clipnorm = 0;  // Adam's clipping by norm (0: none)
  bool sharded = false;                      // --sharded-checkpoints 1
  int64_t exit_at_epoch = -1;
  // --exit-at-step S: exit with status 3 as this process's step S (0-based, counted from its
  // start, so after a resume from there) begins.
  int64_t exit_at_step = -1;
  bool dataset_input = false;    // --input dataset
  std::string rows_out;          // --rows-out
  std::string logdir;            // --logdir
  int64_t profile_steps = 0;     // --profile-steps
  int logical_replicas = 0;      // --logical-replicas
  std::string rows_log;          // --rows-log
  bool dropout = false;          // --dropout 1: Dropout(0.25, seeded) after the hidden layer
  int64_t standby_delay_ms = 0;  // --standby-delay-ms
  bool report_progress = false;  // --report-progress 1
  bool validation = false;       // --validation 1: the first 128 examples after each epoch
  // --die-in-validation E / --die-at-step S: rank 1 of the job's first generation SIGKILLs
  // itself after the first validation batch of epoch E / as the step after the S-th begins.
  int64_t die_in_validation = -1;
  int64_t die_at_step = -1;
  int64_t early_stopping = -1;  // --early-stopping P
};

// Rank 1 of a launched job's first generation, 1 (a restarted worker has a later one).
bool first_generation_rank_1() {
  const char* rank = std::getenv("DTRAIN_RANK");
  const char* gen = std::getenv("DTRAIN_RDZV_GENERATION");
  return rank != nullptr && std::string(rank) == "1" && (gen == nullptr || std::string(gen) == "1");
}

// --die-in-validation / --die-at-step: a failure at a chosen point of fit.
class DieAt : public train::Callback {
 public:
  DieAt(int64_t in_validation, int64_t at_step)
      : in_validation_(in_validation), at_step_(at_step), armed_(first_generation_rank_1()) {}
  void on_epoch_begin(int64_t epoch, const nn::Logs&) override { epoch_ = epoch; }
  void on_train_batch_begin(int64_t, const nn::Logs&) override {
    if (armed_ && model()->optimizer()->iterations() == at_step_) ::raise(SIGKILL);
  }
  void on_test_batch_end(int64_t, const nn::Logs&) override {
    if (armed_ && epoch_ == in_validation_) ::raise(SIGKILL);
  }

 private:
  int64_t in_validation_, at_step_;
  bool armed_;
  int64_t epoch_ = -1;
};

int run(const std::string& mode, std::string out, int replicas, int epochs, int64_t verify_every,
        const Backup& backup) {
  std::unique_ptr<distribute::Strategy> strategy;
  std::optional<distribute::Strategy::ScopeGuard> scope;
  const auto enter_strategy = [&] {
    if (mode == "mirrored") {
      strategy = std::make_unique<distribute::MirroredStrategy>(replicas);
    } else if (mode == "multi-worker") {
      strategy = std::make_unique<distribute::MultiWorkerMirroredStrategy>(
          distribute::MultiWorkerOptions{.overlap_gradients = backup.overlap_bucket_bytes > 0,
                                         .overlap_bucket_bytes = backup.overlap_bucket_bytes,
                                         .shard_optimizer_state = backup.shard,
                                         .local_replicas = replicas,
                                         .logical_replicas = backup.logical_replicas});
    } else if (mode != "single") {
      throw InvalidArgumentError("unknown --mode " + mode);
    }
    if (strategy) scope.emplace(strategy.get());
  };
  // A hot spare (dtrain launch --spares) makes its data and model first and its strategy once it
  // has a rank (train/standby.h).
  const bool standby = train::is_standby();
  if (!standby) enter_strategy();
  // Workers other than the chief start from different weights: the chief's broadcast must
  // make them equal.
  set_random_seed(strategy ? 11 + strategy->worker_rank() : 11);
  Tensor x, y;
  if (backup.lm) {
    make_lm_data(x, y);
  } else {
    make_data(x, y, backup.cnn ? 36 : kFeatures);
  }
  if (backup.cnn) x = x.reshape(Shape{kExamples, 6, 6, 1});
  // Rows this process's replicas computed on, counted where they are computed (replica threads
  // call the layer concurrently): proves the global batches are split.
  auto counter = std::make_shared<RowCounter>();
  auto recorder = std::make_shared<RowRecorder>();
  std::unique_ptr<nn::Model> owned;
  if (backup.lm) {
    owned = std::make_unique<nn::GPT>(nn::GPTConfig{.vocab_size = kLmVocab,
                                                    .context = kLmContext,
                                                    .num_layers = 1,
                                                    .d_model = 8,
                                                    .num_heads = 2});
  } else if (backup.resnet) {
    x = x.reshape(Shape{kExamples, 2, 2, 2});
    auto conv_bn = [](const nn::KerasTensor& t) {
      nn::KerasTensor h =
          nn::call(nn::Conv2D(8, {2, 2}, {.padding = "same", .use_bias = false}), t);
      return nn::call(nn::BatchNormalization({.synchronized = true}), h);
    };
    nn::KerasTensor in = nn::Input(Shape{2, 2, 2});
    nn::KerasTensor h = nn::call(nn::ReLU(), conv_bn(in));
    nn::KerasTensor r = conv_bn(nn::call(nn::ReLU(), conv_bn(h)));
    h = nn::call(nn::LayerRef(counter), nn::call(nn::ReLU(), nn::call(nn::Add(), {h, r})));
    nn::KerasTensor o = nn::call(nn::Dense(3), nn::call(nn::GlobalAveragePooling2D(), h));
    owned = std::make_unique<nn::Functional>(std::vector<nn::KerasTensor>{in},
                                             std::vector<nn::KerasTensor>{o});
  } else if (backup.cnn) {
    auto seq = std::make_unique<nn::Sequential>();
    seq->add_layer(nn::Conv2D(4, {3}, {.activation = "relu", .input_shape = Shape{6, 6, 1}}));
    seq->add_layer(nn::MaxPooling2D());
    seq->add_layer(nn::Flatten());
    seq->add_layer(nn::Dense(16, {.activation = "relu"}));
    seq->add_layer(nn::LayerRef(counter));
    seq->add_layer(nn::Dense(3));
    owned = std::move(seq);
  } else {
    auto seq = std::make_unique<nn::Sequential>();
    if (backup.sync_bn || backup.bn) {
      seq->add_layer(nn::Dense(16, {.use_bias = false, .input_shape = Shape{kFeatures}}));
      seq->add_layer(nn::BatchNormalization({.synchronized = backup.sync_bn}));
      seq->add_layer(nn::Activation("relu"));
    } else if (!backup.rows_out.empty() || !backup.rows_log.empty()) {
      seq->add_layer(nn::LayerRef(recorder));
      seq->add_layer(nn::Dense(16, {.activation = "relu"}));
    } else {
      seq->add_layer(nn::Dense(16, {.activation = "relu", .input_shape = Shape{kFeatures}}));
    }
    if (backup.dropout) seq->add_layer(nn::Dropout(0.25f, {.seed = 3}));
    seq->add_layer(nn::LayerRef(counter));
    seq->add_layer(nn::Dense(3));
    owned = std::move(seq);
  }
  nn::Model& model = *owned;
  // compile() binds the model to the strategy in scope: a spare compiles once it has one.
  if (standby) {
    // --standby-delay-ms: a spare whose start-up (say, its data load) takes this long.
    std::this_thread::sleep_for(std::chrono::milliseconds(backup.standby_delay_ms));
    train::await_standby_assignment();
    if (backup.report_progress) {
      fault::uninstall_progress_reporter();
      fault::install_progress_reporter();
    }
    enter_strategy();
  }
  model.compile({.optimizer = std::make_shared<optim::Adam>(
                     optim::AdamOptions{.learning_rate = 0.01,
                                        .clipnorm = backup.clipnorm,
                                        .global_clipnorm = backup.global_clipnorm}),
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
                 .metrics = {"accuracy"}});
  std::vector<std::shared_ptr<train::Callback>> callbacks;
  if (backup.step_delay_us > 0) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(
        train::LambdaCallbackOptions{.on_batch_end = [&](int64_t, const nn::Logs&) {
          static bool announced = false;  // tells a test that training is under way
          if (!announced) {
            announced = true;
            std::printf("first step done\n");
            std::fflush(stdout);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(backup.step_delay_us));
        }}));
  }
  std::ofstream rows_log;
  if (!backup.rows_log.empty()) {
    const char* gen = std::getenv("DTRAIN_RDZV_GENERATION");
    const char* rank = std::getenv("DTRAIN_RANK");
    const char* world = std::getenv("DTRAIN_WORLD_SIZE");
    rows_log.open(backup.rows_log + ".g" + (gen ? gen : "0") + ".r" + (rank ? rank : "0"),
                  std::ios::app);
    rows_log << "world " << (world ? world : "1") << "\n" << std::flush;
    recorder->log = &rows_log;
  }
  if (!backup.rows_out.empty() || !backup.rows_log.empty()) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(train::LambdaCallbackOptions{
        .on_epoch_begin = [&](int64_t epoch, const nn::Logs&) { recorder->epoch = epoch; },
        .on_batch_begin = [&](int64_t step, const nn::Logs&) { recorder->step = step; }}));
  }
  if (!backup.logdir.empty()) {
    callbacks.push_back(std::make_shared<train::TensorBoard>(
        backup.logdir, train::TensorBoardOptions{.profile_steps = backup.profile_steps}));
  }
  int64_t steps_begun = 0;
  if (backup.exit_at_step >= 0) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(
        train::LambdaCallbackOptions{.on_batch_begin = [&](int64_t, const nn::Logs&) {
          if (steps_begun++ == backup.exit_at_step) std::_Exit(3);
        }}));
  }
  if (backup.exit_at_epoch >= 0) {
    callbacks.push_back(std::make_shared<train::LambdaCallback>(
        train::LambdaCallbackOptions{.on_epoch_begin = [&](int64_t epoch, const nn::Logs&) {
          if (epoch == backup.exit_at_epoch) std::_Exit(3);
        }}));
  }
  if (backup.die_in_validation >= 0 || backup.die_at_step >= 0) {
    callbacks.push_back(std::make_shared<DieAt>(backup.die_in_validation, backup.die_at_step));
  }
  if (backup.early_stopping >= 0) {
    callbacks.push_back(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{
        .monitor = "loss", .min_delta = 1e9, .patience = backup.early_stopping}));
  }
  std::optional<train::ValidationData> validation;
  if (backup.validation) validation.emplace(std::pair{x.slice(0, 128), y.slice(0, 128)});
  const train::FitOptions fit_options{.epochs = epochs,
                                      .batch_size = backup.batch_size,
                                      .validation_data = validation,
                                      .seed = 5,
                                      .verbose = 0,
                                      .callbacks = callbacks,
                                      .save_checkpoints = !backup.dir.empty(),
                                      .checkpoint_dir = backup.dir,
                                      .checkpoint_every = backup.every,
                                      .async_checkpoints = backup.async,
                                      .sharded_checkpoints = backup.sharded,
                                      .verify_sync_every = verify_every};
  // The global batches, shuffled as fit(x, y) shuffles them (its seed 5 is every worker's).
  const auto h = backup.dataset_input
                     ? model.fit(data::Dataset::from_tensor_slices({x, y})
                                     .shuffle(kExamples, 5, /*reshuffle_each_iteration=*/true)
                                     .batch(backup.batch_size),
                                 fit_options)
                     : model.fit(x, y, fit_options);
  if (!backup.rows_out.empty()) {
    std::string path = backup.rows_out;
    if (const char* rank = std::getenv("DTRAIN_RANK")) path += std::string(".rank") + rank;
    std::ofstream(path) << recorder->text();
  }
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
  if (backup.shard > 0) {
    std::printf("sharded: optimizer_slot_bytes %.0f gradient_bytes %.0f\n",
                h.last("optimizer_slot_bytes"), h.last("gradient_bytes"));
  }
  // The epochs History holds: each once and in order, also for a survivor that rolled back
  // over an epoch's end.
  const std::vector<int64_t>& he = h.epochs();
  bool in_order = !he.empty();
  for (size_t i = 1; i < he.size(); ++i) in_order &= he[i] == he[i - 1] + 1;
  for (const auto& [key, values] : h.history()) in_order &= values.size() == he.size();
  std::printf("history: epochs %lld to %lld, %s\n",
              he.empty() ? -1LL : static_cast<long long>(he[0]),
              he.empty() ? -1LL : static_cast<long long>(he.back()),
              in_order ? "each once in order" : "NOT each once in order");
  if (backup.validation) std::printf("val_loss %.9g\n", h.last("val_loss"));
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
  bool report_progress = false;
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
    else if (k == "--bn")
      backup.bn = v == "1";
    else if (k == "--resnet")
      backup.resnet = v == "1";
    else if (k == "--overlap-bucket-bytes")
      backup.overlap_bucket_bytes = static_cast<size_t>(std::atoll(v.c_str()));
    else if (k == "--shard-optimizer-state")
      backup.shard = std::atoi(v.c_str());
    else if (k == "--arch")
      backup.cnn = v == "cnn", backup.lm = v == "lm";
    else if (k == "--clipnorm")
      backup.clipnorm = std::atof(v.c_str());
    else if (k == "--global-clipnorm")
      backup.global_clipnorm = std::atof(v.c_str());
    else if (k == "--batch-size")
      backup.batch_size = std::atoll(v.c_str());
    else if (k == "--sharded-checkpoints")
      backup.sharded = v == "1";
    else if (k == "--input")
      backup.dataset_input = v == "dataset";
    else if (k == "--rows-out")
      backup.rows_out = v;
    else if (k == "--logdir")
      backup.logdir = v;
    else if (k == "--profile-steps")
      backup.profile_steps = std::atoll(v.c_str());
    else if (k == "--exit-at-epoch")
      backup.exit_at_epoch = std::atoll(v.c_str());
    else if (k == "--exit-at-step")
      backup.exit_at_step = std::atoll(v.c_str());
    else if (k == "--logical-replicas")
      backup.logical_replicas = std::atoi(v.c_str());
    else if (k == "--rows-log")
      backup.rows_log = v;
    else if (k == "--dropout")
      backup.dropout = v == "1";
    else if (k == "--standby-delay-ms")
      backup.standby_delay_ms = std::atoll(v.c_str());
    else if (k == "--validation")
      backup.validation = v == "1";
    else if (k == "--die-in-validation")
      backup.die_in_validation = std::atoll(v.c_str());
    else if (k == "--early-stopping")
      backup.early_stopping = std::atoll(v.c_str());
    else if (k == "--die-at-step")
      backup.die_at_step = std::atoll(v.c_str());
    else if (k == "--report-progress")
      report_progress = v == "1";
    else {
      std::fprintf(stderr, "error: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    backup.report_progress = report_progress;
    if (report_progress) fault::install_progress_reporter();
    return run(mode, out, replicas, epochs, verify_every, backup);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
}
