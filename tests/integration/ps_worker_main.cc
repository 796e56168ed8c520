// A task of a ParameterServerStrategy test job, chosen by TF_CONFIG's task type: "ps" serves a
// ParameterServer until SIGTERM; "chief" and "worker" run Model::fit on Fashion-MNIST (an MLP)
// under ParameterServerStrategy (or MultiWorkerMirroredStrategy with --mode mwms). The chief
// evaluates on the test set, prints "test_accuracy A" and the servers' versions, and writes the
// model's weights, raw, to --out.
//   ps_worker [--mode async|sync|mwms] [--epochs E] [--steps S] [--batch B] [--hidden H]
//             [--ckpt DIR] [--ckpt-every N] [--connect-timeout-ms T] [--out FILE] [--bn 1]
// Exit status 0, or 1 with "error: CODE: message" on stderr.
#include <signal.h>
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "dtrain/core/random.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/distribute/parameter_server_strategy.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/optim/adam.h"
#include "dtrain/train/training.h"

using namespace dtrain;

namespace {

struct Flags {
  std::string mode = "async";
  int epochs = 1;
  int64_t steps = 0;  // 0: whole epochs
  int64_t batch = 32;
  int64_t hidden = 128;
  bool bn = false;  // --bn 1: a BatchNormalization after the hidden layer
  std::string ckpt;
  int64_t ckpt_every = 0;
  int64_t connect_timeout_ms = 30000;
  std::string out;
};

int serve_ps(const distribute::ClusterSpec& cluster) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  distribute::ParameterServer server(
      {.address = cluster.jobs.at("ps").at(static_cast<size_t>(cluster.task_index)),
       .sync_to_disk = false});
  std::printf("ps serving on %s\n", server.address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  server.stop();
  return 0;
}

int run(const Flags& f) {
  const distribute::ClusterSpec cluster = distribute::resolve_cluster();
  if (cluster.task_type == "ps") return serve_ps(cluster);
  std::unique_ptr<distribute::Strategy> strategy;
  distribute::ParameterServerStrategy* ps = nullptr;
  if (f.mode == "mwms") {
    strategy = std::make_unique<distribute::MultiWorkerMirroredStrategy>();
  } else {
    auto p = std::make_unique<distribute::ParameterServerStrategy>(
        distribute::ParameterServerStrategyOptions{
            .synchronous = f.mode == "sync",
            .connect_timeout = std::chrono::milliseconds(f.connect_timeout_ms),
            .worker_idle_timeout = std::chrono::seconds(120)});
    ps = p.get();
    strategy = std::move(p);
  }
  auto scope = strategy->scope();
  set_random_seed(11);
  const data::FashionMnist fm = data::fashion_mnist::load_data();
  nn::Sequential model(
      {nn::Flatten({.input_shape = Shape{28, 28}}), nn::Dense(f.hidden, {.activation = "relu"})});
  if (f.bn) model.add_layer(nn::BatchNormalization());
  model.add_layer(nn::Dense(10));
  model.compile(
      {.optimizer = std::make_shared<optim::Adam>(optim::AdamOptions{.learning_rate = 0.001}),
       .loss = nn::SparseCategoricalCrossentropy({.from_logits = true}),
       .metrics = {"accuracy"}});
  train::FitOptions options{.epochs = f.epochs, .batch_size = f.batch, .seed = 5, .verbose = 2};
  if (f.steps > 0) options.steps_per_epoch = f.steps;
  if (!f.ckpt.empty()) {
    options.save_checkpoints = true;
    options.checkpoint_dir = f.ckpt;
    options.checkpoint_every = f.ckpt_every;
  }
  const train::History h = model.fit(fm.x_train, fm.y_train, options);
  // MultiWorkerMirrored evaluates on every worker (its metrics are all-reduced); a
  // ParameterServerStrategy worker's fit returned when the chief was done.
  if (!strategy->is_chief() && ps != nullptr) return 0;
  if (ps != nullptr) {
    std::printf("ps versions:");
    for (const auto& s : ps->server_stats())
      std::printf(" %lld", static_cast<long long>(s.version));
    std::printf("\n");
    std::printf("staleness_mean %.3f pull_ms %.3f push_ms %.3f\n", h.last("staleness_mean"),
                h.last("pull_ms"), h.last("push_ms"));
  }
  const nn::Logs test = model.evaluate(fm.x_test, fm.y_test, {.batch_size = 256});
  if (!strategy->is_chief()) return 0;
  std::printf("test_accuracy %.4f\n", test.at("accuracy"));
  if (!f.out.empty()) {
    std::ofstream out(f.out, std::ios::binary);
    for (Variable* v : model.weights())
      out.write(static_cast<const char*>(v->tensor().raw_data()), v->tensor().nbytes());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode")
      f.mode = v;
    else if (k == "--epochs")
      f.epochs = std::atoi(v.c_str());
    else if (k == "--steps")
      f.steps = std::atoll(v.c_str());
    else if (k == "--batch")
      f.batch = std::atoll(v.c_str());
    else if (k == "--hidden")
      f.hidden = std::atoll(v.c_str());
    else if (k == "--bn")
      f.bn = v == "1";
    else if (k == "--ckpt")
      f.ckpt = v;
    else if (k == "--ckpt-every")
      f.ckpt_every = std::atoll(v.c_str());
    else if (k == "--connect-timeout-ms")
      f.connect_timeout_ms = std::atoll(v.c_str());
    else if (k == "--out")
      f.out = v;
  }
  try {
    return run(f);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
}
