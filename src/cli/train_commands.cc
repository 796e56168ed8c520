// dtrain fit / evaluate / predict.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <memory>
#include <sstream>

#include "arch_resnet.h"
#include "commands.h"
#include "dtrain/core/cpus.h"
#include "dtrain/core/file.h"
#include "dtrain/core/random.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "dtrain/fault/progress_reporter.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/ops/tensor_ops.h"
#include "dtrain/train/backup_and_restore.h"
#include "dtrain/train/saving.h"
#include "dtrain/train/standby.h"
#include "dtrain/train/tensorboard.h"
#include "dtrain/train/training.h"
#include "flag_checks.h"
#include "language_model.h"
#include "train_data.h"

namespace dtrain::cli {
namespace {

struct ModelFlags {
  std::string model;  // Keras JSON; empty: the built-in --arch
  std::string arch = "mlp";
  int hidden = 128;
};

struct TrainFlags {
  int epochs = 5;
  int batch_size = 32;
  std::string optimizer = "adam";
  double learning_rate = -1;
  double global_clipnorm = 0;  // 0: no clipping
  std::optional<uint64_t> seed;
  int threads = 0;
  int verbose = -1;
  bool validate = false;
  int64_t steps_per_epoch = 0;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool async_checkpoint = false;
  std::optional<int64_t> snapshot_every;  // nullopt: the launcher's --snapshot-every
  bool sharded_checkpoints = false;
  bool resume = false;
  std::string strategy = "one";
  int replicas = 0;
  int64_t verify_sync = 0;
  bool overlap_gradients = false;  // multi-worker: all-reduce buckets during backward
  double bucket_cap_mb = 1.0;
  int shard_optimizer_state = 0;  // multi-worker ZeRO stage
  int logical_replicas = 0;       // multi-worker: exact elastic reduction over L replicas
  std::string save;
  std::string logdir;
  int64_t profile_steps = 0;  // with --logdir: per-worker step-time split and memory every N steps
};

// A batch beyond this would allocate gigabytes of batch buffers before the first step.
constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
// BLAS threads beyond this only oversubscribe the cores (and, far beyond, OpenBLAS cannot start
// them and hangs at exit).
int max_threads() { return 4 * usable_cpus(); }

void add_model_flags(CLI::App* cmd, ModelFlags& f) {
  cmd->add_option("--model", f.model,
                  "Keras model JSON (model.to_json()), or a model saved by Keras 2 or 3 or dtrain "
                  "(.h5, .keras); default: an MLP Dense(128, relu) -> Dense(classes)");
  cmd->add_option("--arch", f.arch,
                  "Built-in model when --model is not given: mlp, or cnn (Conv2D(32,3,relu) -> "
                  "MaxPooling2D -> Conv2D(64,3,relu) -> MaxPooling2D -> Flatten -> "
                  "Dense(128,relu) -> Dense(classes); images get a channel axis), or resnet (a "
                  "small Functional residual CNN: Conv2D -> BatchNormalization -> ReLU blocks "
                  "with Add() skips -> GlobalAveragePooling2D -> Dense(classes); its batch norm "
                  "is synchronized over the replicas of a mirrored or multi-worker strategy), or "
                  "gpt (a decoder language model on a text corpus: --corpus, --context, "
                  "--layers, ...)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mlp", "cnn", "resnet", "gpt"}));
  cmd->add_option("--hidden", f.hidden, "Units of the default MLP's hidden layer")
      ->capture_default_str()
      ->check(int_at_least(1));
}

bool is_h5(const std::string& path) {
  for (const char* ext : {".h5", ".hdf5", ".keras"}) {
    const std::string e = ext;
    if (path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) {
      return true;
    }
  }
  return false;
}

// --save is written after training: a path that cannot be written is refused before it starts.
void check_save_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw InvalidArgumentError(
        str_cat("--save ", path, ": is a directory; give a file name ending in .h5 or .keras"));
  }
  if (!is_h5(path)) {
    throw InvalidArgumentError(str_cat("--save ", path,
                                       ": needs a .h5, .hdf5 or .keras extension (dtrain saves "
                                       "whole models as Keras files: .h5 in Keras 2's HDF5 "
                                       "layout, .keras as Keras 3's zip)"));
  }
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    if (fs::exists(parent, ec)) {
      throw InvalidArgumentError(
          str_cat("--save ", path, ": '", parent.string(), "' is not a directory"));
    }
    throw NotFoundError(
        str_cat("--save ", path, ": directory '", parent.string(), "' does not exist"));
  }
}

// Images of [N, 28, 28] for a model declared on [28, 28, 1] (a Keras CNN, channels last): the
// examples are reshaped to the model's input shape when they hold as many values, as a Keras user
// does with np.expand_dims.
void shape_inputs_for(const nn::Model& model, Data& d) {
  if (!model.input_shape()) return;
  const Shape want = *model.input_shape();
  for (Split* s : {&d.train, &d.test}) {
    if (!s->x.defined()) continue;
    const Shape have = s->x.shape().without_first();
    if (have != want && have.num_elements() == want.num_elements()) {
      s->x = s->x.reshape(want.with_first(s->x.dim(0)));
    }
  }
}

std::unique_ptr<nn::Model> make_model(const ModelFlags& f, const Data& d) {
  const Tensor& x = d.train.x.defined() ? d.train.x : d.test.x;
  const Shape example = x.shape().without_first();
  if (is_h5(f.model)) {
    // A model saved with model.save("x.h5"): architecture, weights, optimizer and compile
    // settings, so fit continues where it stopped.
    return train::load_model(f.model);
  }
  if (!f.model.empty()) {
    std::ifstream in(f.model);
    if (!in) throw NotFoundError("cannot open model file '" + f.model + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    auto model = nn::model_from_json(ss.str());
    if (!model->built()) model->build(example);
    return model;
  }
  if (f.arch == "resnet") return make_resnet(example, num_classes(d));
  auto model = std::make_unique<nn::Sequential>();
  if (f.arch == "cnn") {
    // Images [h, w] get a channel axis [h, w, 1] (shape_inputs_for reshapes the data).
    DTRAIN_CHECK(example.rank() == 2 || example.rank() == 3,
                 "--arch cnn: needs image inputs [height, width] or [height, width, channels], "
                 "got examples of shape ",
                 example.to_string());
    const Shape image = example.rank() == 2 ? Shape{example[0], example[1], 1} : example;
    model->add_layer(nn::Conv2D(32, {3}, {.activation = "relu", .input_shape = image}));
    model->add_layer(nn::MaxPooling2D());
    model->add_layer(nn::Conv2D(64, {3}, {.activation = "relu"}));
    model->add_layer(nn::MaxPooling2D());
    model->add_layer(nn::Flatten());
    model->add_layer(nn::Dense(128, {.activation = "relu"}));
    model->add_layer(nn::Dense(num_classes(d)));
    return model;
  }
  if (example.rank() > 1) model->add_layer(nn::Flatten({.input_shape = example}));
  model->add_layer(
      nn::Dense(f.hidden, {.activation = "relu",
                           .input_shape = example.rank() > 1 ? std::optional<Shape>()
                                                             : std::optional<Shape>(example)}));
  model->add_layer(nn::Dense(num_classes(d)));
  if (!model->built()) model->build(example);
  return model;
}

// Grayscale images [n, h, w] fed to a model that takes [h, w, 1] (the built-in CNN, a loaded
// Keras CNN) get the channel axis, as Keras users write x[..., None].
std::shared_ptr<optim::Optimizer> make_optimizer(const TrainFlags& f) {
  std::shared_ptr<optim::Optimizer> opt = optim::optimizer_from_name(f.optimizer);
  if (f.global_clipnorm > 0) {
    // Keras's global_clipnorm argument, through the optimizer's config (as Keras would rebuild it).
    optim::OptimizerConfig config = opt->get_config();
    config.hyperparameters.emplace_back("global_clipnorm", f.global_clipnorm);
    opt = optim::optimizer_from_config(config);
  }
  if (f.learning_rate > 0) opt->set_learning_rate(static_cast<float>(f.learning_rate));
  return opt;
}

void compile(nn::Model& model, const TrainFlags& f) {
  if (model.compiled()) {
    // Loaded from .h5 with its optimizer state: keep it, unless asked for another optimizer.
    if (f.learning_rate > 0)
      model.optimizer()->set_learning_rate(static_cast<float>(f.learning_rate));
    return;
  }
  // The built-in model ends in logits; a JSON model ending in softmax gets probabilities.
  bool softmax_output = false;
  if (!model.layers().empty()) {
    if (auto* dense = dynamic_cast<nn::Dense*>(model.layers().back().get())) {
      softmax_output = dense->activation() == ops::Activation::kSoftmax;
    }
  }
  model.compile({.optimizer = make_optimizer(f),
                 .loss = nn::SparseCategoricalCrossentropy({.from_logits = !softmax_output}),
                 .metrics = {"accuracy"}});
}

std::unique_ptr<distribute::Strategy> make_strategy(const TrainFlags& f) {
  if (f.replicas > 0 && f.strategy != "mirrored" && f.strategy != "multi-worker") {
    throw InvalidArgumentError(str_cat("--replicas ", f.replicas,
                                       " applies to --strategy mirrored "
                                       "or multi-worker, not '",
                                       f.strategy, "'"));
  }
  if ((f.overlap_gradients || f.shard_optimizer_state > 0) && f.strategy != "multi-worker") {
    throw InvalidArgumentError(
        str_cat(f.overlap_gradients ? "--overlap-gradients" : "--shard-optimizer-state",
                " applies to --strategy multi-worker, not '", f.strategy, "'"));
  }
  if (f.logical_replicas > 0 && f.strategy != "multi-worker") {
    throw InvalidArgumentError(
        str_cat("--logical-replicas applies to --strategy multi-worker, not '", f.strategy, "'"));
  }
  if (f.strategy == "mirrored") return std::make_unique<distribute::MirroredStrategy>(f.replicas);
  if (f.strategy == "parameter-server") {
    // Cluster from TF_CONFIG (chief, worker and ps tasks), e.g. under dtrain launch --ps N.
    return std::make_unique<distribute::ParameterServerStrategy>();
  }
  if (f.strategy == "multi-worker") {
    return std::make_unique<distribute::MultiWorkerMirroredStrategy>(distribute::MultiWorkerOptions{
        .overlap_gradients = f.overlap_gradients,
        .overlap_bucket_bytes = static_cast<size_t>(f.bucket_cap_mb * (1 << 20)),
        .shard_optimizer_state = f.shard_optimizer_state,
        .local_replicas = std::max(1, f.replicas),
        .logical_replicas = f.logical_replicas});
  }
  return nullptr;
}

void apply_runtime(const TrainFlags& f) {
  if (f.seed) set_random_seed(*f.seed);
  ops::set_num_threads(f.threads > 0 ? f.threads : 1);
}

void print_logs(const char* prefix, const nn::Logs& logs) {
  std::string line;
  for (const auto& [k, v] : logs) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s_%s: %.4f", line.empty() ? "" : " - ", prefix, k.c_str(),
                  v);
    line += buf;
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace

void add_train_commands(CLI::App& app, std::function<int()>& run) {
  static DataFlags data_flags;
  static ModelFlags model_flags;
  static TrainFlags train_flags;
  static LmFlags lm_flags;
  static std::string predict_out;
  static int64_t predict_count = 10;

  auto add_common = [](CLI::App* cmd) {
    add_data_flags(cmd, data_flags);
    add_model_flags(cmd, model_flags);
    cmd->add_option("--batch-size", train_flags.batch_size, "Examples per batch")
        ->capture_default_str()
        ->check(int_at_least(1))
        ->check(int_at_most(kMaxBatchSize, "larger batches are a mistake"));
    cmd->add_option("--seed", train_flags.seed,
                    "Global random seed: with it, two runs give bitwise-identical weights")
        ->check(unsigned_integer());
    cmd->add_option("--threads", train_flags.threads, "Threads for the step's kernels (default 1)")
        ->check(int_at_least(1))
        ->check(
            int_at_most(max_threads(), str_cat("4 per CPU this process may use: ", usable_cpus(),
                                               ", from its affinity mask and CPU quota")));
    cmd->add_option("--verbose", train_flags.verbose,
                    "0 silent, 1 progress bar, 2 one line per epoch (default: 1 on a terminal)")
        ->check(int_at_least(0))
        ->check(int_at_most(2, "0, 1 or 2"));
  };

  CLI::App* fit = app.add_subcommand("fit", "Train a model (default: an MLP on Fashion-MNIST)");
  add_common(fit);
  fit->add_option("--epochs", train_flags.epochs, "Passes over the training data")
      ->capture_default_str()
      ->check(int_at_least(1));
  fit->add_option("--optimizer", train_flags.optimizer, "sgd, adam, adamw or rmsprop")
      ->capture_default_str();
  fit->add_option("--learning-rate", train_flags.learning_rate,
                  "Learning rate (default: the optimizer's Keras default)")
      ->check(finite_positive());
  fit->add_option("--global-clipnorm", train_flags.global_clipnorm,
                  "Clip the gradients by their global norm, as Keras's global_clipnorm "
                  "(default: no clipping)")
      ->check(finite_positive());
  fit->add_option("--steps-per-epoch", train_flags.steps_per_epoch,
                  "Batches per epoch (default: one pass)")
      ->check(int_at_least(1));
  fit->add_flag("--validate", train_flags.validate,
                "Evaluate on the test split after every epoch (val_loss, val_accuracy)");
  fit->add_option("--checkpoint-dir", train_flags.checkpoint_dir,
                  "Save TensorFlow-format checkpoints of the whole training state here "
                  "(weights, optimizer, epoch, step, data position)");
  fit->add_option("--checkpoint-every", train_flags.checkpoint_every,
                  "Checkpoint every N steps (default: at the end of each epoch)")
      ->check(int_at_least(1));
  fit->add_flag("--async-checkpoint", train_flags.async_checkpoint,
                "Write checkpoints on background threads (the step only copies the state)");
  fit->add_option("--snapshot-every", train_flags.snapshot_every,
                  "Under dtrain launch: snapshot the state into the launcher's memory every N "
                  "steps besides the checkpoints (default: launch's --snapshot-every; 0: none)")
      ->check(CLI::NonNegativeNumber);
  fit->add_flag("--sharded-checkpoints", train_flags.sharded_checkpoints,
                "With --strategy multi-worker: each worker writes its partition of every "
                "checkpoint (TF's sharded format; restores on any number of workers)");
  fit->add_flag("--resume", train_flags.resume,
                "Resume exactly from the newest valid checkpoint in --checkpoint-dir");
  fit->add_option("--strategy", train_flags.strategy,
                  "one (default), mirrored (replicas as threads), multi-worker (one process "
                  "per worker; cluster from TF_CONFIG, Slurm, Open MPI or dtrain launch), or "
                  "parameter-server (TF_CONFIG with ps tasks; dtrain launch --ps N --workers M)")
      ->check(CLI::IsMember({"one", "mirrored", "multi-worker", "parameter-server"}));
  fit->add_option("--replicas", train_flags.replicas,
                  "Replica threads per process for mirrored/multi-worker (default: mirrored one "
                  "per core, multi-worker 1)")
      ->check(int_at_least(1));
  fit->add_option("--logical-replicas", train_flags.logical_replicas,
                  "multi-worker: split every global batch into L fixed logical replicas, mapped "
                  "onto whatever workers exist, with a reduction whose order does not depend on "
                  "them: bitwise the same weights for any number of workers <= L, so an elastic "
                  "job (dtrain launch --nnodes MIN:MAX) can shrink and grow exactly")
      ->check(int_at_least(1));
  fit->add_option("--verify-sync", train_flags.verify_sync,
                  "Every N steps, check that all workers hold bitwise-identical variables "
                  "(0, the default: never)")
      ->check(int_at_least(0));
  fit->add_flag("--overlap-gradients", train_flags.overlap_gradients,
                "multi-worker: all-reduce the gradients in buckets while backward runs "
                "(bitwise the same result)");
  fit->add_option("--bucket-cap-mb", train_flags.bucket_cap_mb,
                  "multi-worker --overlap-gradients: bucket size in MiB (default 1)")
      ->check(finite_positive());
  fit->add_option("--shard-optimizer-state", train_flags.shard_optimizer_state,
                  "multi-worker: 1 partitions the optimizer slots across workers (ZeRO stage 1), "
                  "2 also reduce-scatters the gradients (stage 2); 0 (default) replicates them")
      ->check(int_at_least(0) & int_at_most(2, "the ZeRO stages are 1 and 2"));
  fit->add_option("--logdir", train_flags.logdir,
                  "Write TensorBoard event files here (train/ and validation/ runs)");
  fit->add_option("--profile-steps", train_flags.profile_steps,
                  "With --logdir: every N steps, each worker's step-time split (compute, "
                  "communication, waiting) and peak memory to the profile/worker_<rank> runs")
      ->check(int_at_least(0));
  add_lm_flags(fit, lm_flags);
  fit->add_option("--save", train_flags.save,
                  "Save the trained model (architecture, weights, optimizer) to this .h5 (Keras "
                  "2's HDF5 layout) or .keras (Keras 3's zip) file");
  fit->callback([&run] {
    run = [] {
      check_save_path(train_flags.save);
      apply_runtime(train_flags);
      std::unique_ptr<distribute::Strategy> strategy;
      std::optional<distribute::Strategy::ScopeGuard> scope;
      bool chief = true;
      const int verbose = train_flags.verbose;
      const auto enter_strategy = [&] {
        strategy = make_strategy(train_flags);
        if (strategy) scope.emplace(strategy.get());
        chief = !strategy || strategy->is_chief();
        train_flags.verbose = chief ? verbose : 0;  // the chief reports for everyone
      };
      // A hot spare (dtrain launch --spares) loads its data and builds its model, and only then
      // waits for a rank: its strategy (the rendezvous) and compile() come after the wait.
      const bool standby = train::is_standby();
      bool taken = false;
      const auto take_over = [&] {
        taken = true;
        train::await_standby_assignment();
        fault::uninstall_progress_reporter();  // none ran without a rank: now as the worker
        // The reporter connects on a thread of its own while the strategy meets the survivors
        // (both are on a takeover's critical path); its errors surface here, before compile().
        auto reporter = std::async(std::launch::async, [] { fault::install_progress_reporter(); });
        enter_strategy();
        reporter.get();
      };
      if (standby) {
        chief = false;
        train_flags.verbose = 0;
      } else {
        enter_strategy();
      }
      // --arch gpt: next-token windows of a text corpus, validated on its held-out end.
      const bool lm = model_flags.arch == "gpt" && model_flags.model.empty();
      std::optional<LmData> text;
      Data d;
      std::unique_ptr<nn::Model> model;
      if (lm) {
        text = load_lm_data(lm_flags);
        d.train = {text->x_train, text->y_train};
        d.test = {text->x_val, text->y_val};
        model = make_gpt(lm_flags, text->tokenizer->vocab_size());
        if (chief) {
          std::printf(
              "corpus: %lld training and %lld validation windows of %lld tokens, "
              "vocabulary %lld\n",
              static_cast<long long>(d.train.x.dim(0)),
              static_cast<long long>(d.test.x.defined() ? d.test.x.dim(0) : 0),
              static_cast<long long>(lm_flags.context),
              static_cast<long long>(text->tokenizer->vocab_size()));
        }
      } else {
        d = load_data(data_flags, true);
        // --arch resnet chooses its batch normalization by the strategy's replica count, and a
        // model loaded with its optimizer is compiled as it loads.
        if (standby && (model_flags.arch == "resnet" || !model_flags.model.empty())) take_over();
        model = make_model(model_flags, d);
        shape_inputs_for(*model, d);
      }
      // compile() binds the model to the strategy in scope: a spare compiles once it has one.
      if (standby && !taken) take_over();
      compile(*model, train_flags);
      if (train_flags.verbose != 0) model->summary();
      if (strategy && chief && train_flags.strategy != "parameter-server") {
        std::printf("%s: %d replicas in sync (%d workers x %d local)\n", strategy->name().c_str(),
                    strategy->num_replicas_in_sync(), strategy->num_workers(),
                    strategy->num_local_replicas());
      } else if (strategy && chief) {
        // Workers pull and push on their own: there is no synchronous replica count to show.
        std::printf("%s: the chief schedules steps on the workers\n", strategy->name().c_str());
      }
      train::FitOptions opts{.epochs = train_flags.epochs,
                             .batch_size = train_flags.batch_size,
                             .seed = train_flags.seed,
                             .verbose = train_flags.verbose};
      if (train_flags.steps_per_epoch > 0) opts.steps_per_epoch = train_flags.steps_per_epoch;
      opts.verify_sync_every = train_flags.verify_sync;
      DTRAIN_CHECK(train_flags.profile_steps == 0 || !train_flags.logdir.empty(),
                   "--profile-steps needs --logdir");
      if (train_flags.profile_steps > 0) {
        opts.callbacks.push_back(std::make_shared<train::TensorBoard>(
            train_flags.logdir,
            train::TensorBoardOptions{.profile_steps = train_flags.profile_steps}));
      } else {
        opts.logdir = train_flags.logdir;
      }
      DTRAIN_CHECK(!train_flags.resume || !train_flags.checkpoint_dir.empty(),
                   "--resume needs --checkpoint-dir");
      if (!train_flags.checkpoint_dir.empty() && train_flags.strategy == "parameter-server") {
        // The servers hold the variables and slots: they write the backups (fit's
        // save_checkpoints under the strategy), and --resume continues from the newest.
        opts.save_checkpoints = true;
        opts.checkpoint_dir = train_flags.checkpoint_dir;
        opts.checkpoint_every = train_flags.checkpoint_every;
        opts.resume = train_flags.resume;
      } else if (!train_flags.checkpoint_dir.empty()) {
        opts.callbacks.push_back(std::make_shared<train::BackupAndRestore>(
            train_flags.checkpoint_dir,
            train::BackupAndRestoreOptions{.save_freq = train_flags.checkpoint_every,
                                           .delete_checkpoint = false,
                                           .max_to_keep = 3,
                                           .enable_async = train_flags.async_checkpoint,
                                           .restore = train_flags.resume,
                                           .snapshot_every = train_flags.snapshot_every,
                                           .sharded = train_flags.sharded_checkpoints}));
      }
      if ((train_flags.validate || lm) && d.test.x.defined()) {
        opts.validation_data = train::ValidationData(std::make_pair(d.test.x, d.test.y));
      }
      const auto start = std::chrono::steady_clock::now();
      model->fit(d.train.x, d.train.y, opts);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (chief) std::printf("trained %d epochs in %.2f s\n", train_flags.epochs, secs);
      // Under parameter servers only the chief holds a copy of the variables to evaluate;
      // under the other strategies evaluate is a collective every worker joins.
      const bool ps = train_flags.strategy == "parameter-server";
      if (d.test.x.defined() && (chief || !ps)) {
        const nn::Logs test = model->evaluate(d.test.x, d.test.y, {.batch_size = 256});
        if (chief) print_logs("test", test);
      }
      if (!train_flags.save.empty() && chief) {
        // A language model carries its tokenizer (train::load_tokenizer reads it back).
        train::save_model(*model, train_flags.save,
                          {.tokenizer = text ? text->tokenizer.get() : nullptr});
        std::printf("saved %s\n", train_flags.save.c_str());
      }
      return 0;
    };
  });

  CLI::App* evaluate =
      app.add_subcommand("evaluate", "Evaluate a model on the test split (loss and accuracy)");
  add_common(evaluate);
  evaluate->callback([&run] {
    run = [] {
      apply_runtime(train_flags);
      Data d = load_data(data_flags, false);
      DTRAIN_CHECK(d.test.x.defined(), "evaluate: no test data given");
      auto model = make_model(model_flags, d);
      shape_inputs_for(*model, d);
      compile(*model, train_flags);
      print_logs("test", model->evaluate(d.test.x, d.test.y,
                                         {.batch_size = train_flags.batch_size,
                                          .verbose = train_flags.verbose > 0 ? 1 : 0}));
      return 0;
    };
  });

  CLI::App* predict =
      app.add_subcommand("predict", "Print the predicted class of the first test examples");
  add_common(predict);
  predict->add_option("--count", predict_count, "How many examples to print")
      ->capture_default_str()
      ->check(int_at_least(0));
  predict->add_option("--output", predict_out, "Write all model outputs as CSV to this file");
  predict->callback([&run] {
    run = [] {
      apply_runtime(train_flags);
      Data d = load_data(data_flags, false);
      DTRAIN_CHECK(d.test.x.defined(), "predict: no test data given");
      auto model = make_model(model_flags, d);
      shape_inputs_for(*model, d);
      // Created before predicting, so that an unwritable destination fails first; the CSV
      // replaces the file whole at the end, or (on any error) not at all.
      std::optional<AtomicFile> csv;
      if (!predict_out.empty()) csv.emplace(predict_out);
      const Tensor out = model->predict(d.test.x, {.batch_size = train_flags.batch_size});
      const Tensor classes = ops::argmax(out.rank() == 2 ? out : out.reshape(Shape{out.dim(0), 1}));
      for (int64_t i = 0; i < std::min<int64_t>(predict_count, classes.num_elements()); ++i) {
        std::printf("%lld: predicted %lld, label %lld\n", static_cast<long long>(i),
                    static_cast<long long>(classes.data<int64_t>()[i]),
                    static_cast<long long>(ops::label_at(d.test.y, i)));
      }
      if (csv) {
        const int64_t cols = out.num_elements() / out.dim(0);
        const float* p = out.data<float>();
        std::string row;
        for (int64_t r = 0; r < out.dim(0); ++r) {
          row.clear();
          for (int64_t c = 0; c < cols; ++c) {
            char buf[32];
            // %g: what an ostream prints for a float by default.
            const int n = std::snprintf(buf, sizeof buf, c ? ",%g" : "%g",
                                        static_cast<double>(p[r * cols + c]));
            row.append(buf, static_cast<size_t>(n));
          }
          row += '\n';
          csv->append(row);
        }
        csv->commit();
      }
      return 0;
    };
  });
}

}  // namespace dtrain::cli
