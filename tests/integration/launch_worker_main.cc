// A worker program for the launcher's fault tests (launch_fault_test.cc): a "training loop" of
// --steps steps of --step-ms each, optionally with a Gloo all-reduce per step
// (MultiWorkerMirroredStrategy), that checkpoints its step to DIR/ckpt every --ckpt-every steps
// (rank 0, atomically) and resumes from it, reports progress through fault::ProgressReporter
// (the step observer, as fit() does) and tells the launcher where it resumed. On SIGTERM it
// checkpoints and exits with DTRAIN_PREEMPTION_EXIT_CODE (143), as fit() does on preemption.
//   launch_worker --dir DIR [--steps N] [--step-ms M] [--ckpt-every K] [--collective]
//                 [--fail-slot S | --fail-rank R] [--fail-code C]
// Prints "pid P rank R gen G", "at step S rank R gen G" every 5 steps, and "DONE rank R world W
// gen G step N" at the end. Errors: "error: ..." on stderr, exit 5 (UNAVAILABLE) / 6
// (DEADLINE_EXCEEDED) / 1.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/fault/progress_reporter.h"
#include "dtrain/train/step_observer.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_terminate{false};
extern "C" void on_term(int) { g_terminate = true; }

int64_t read_ckpt(const fs::path& dir) {
  std::ifstream in(dir / "ckpt");
  int64_t step = 0;
  if (in >> step) return step;
  return 0;
}

void write_ckpt(const fs::path& dir, int64_t step) {
  const fs::path tmp = dir / ("ckpt.tmp." + std::to_string(getpid()));
  {
    std::ofstream out(tmp);
    out << step << "\n";
  }
  fs::rename(tmp, dir / "ckpt");
}

int run(int argc, char** argv) {
  fs::path dir;
  int64_t steps = 60, step_ms = 20, ckpt_every = 10;
  int fail_slot = -1, fail_rank = -1, fail_code = 3;
  bool collective = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--dir")
      dir = next();
    else if (a == "--steps")
      steps = std::stoll(next());
    else if (a == "--step-ms")
      step_ms = std::stoll(next());
    else if (a == "--ckpt-every")
      ckpt_every = std::stoll(next());
    else if (a == "--collective")
      collective = true;
    else if (a == "--fail-slot")
      fail_slot = std::stoi(next());
    else if (a == "--fail-rank")
      fail_rank = std::stoi(next());
    else if (a == "--fail-code")
      fail_code = std::stoi(next());
    else
      throw InvalidArgumentError("launch_worker: unknown argument " + a);
  }
  const auto env = distribute::LauncherEnv::from_environment();
  const char* slot_text = std::getenv(fault::kEnvWorkerSlot);
  const int slot = slot_text != nullptr ? std::atoi(slot_text) : env.local_rank;
  std::printf("pid %d rank %d gen %lld slot %d\n", getpid(), env.rank,
              static_cast<long long>(env.generation), slot);
  std::fflush(stdout);
  if (slot == fail_slot || env.rank == fail_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "slot %d rank %d fails on purpose with %d\n", slot, env.rank, fail_code);
    return fail_code;
  }
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, nullptr);
  const char* preempt = std::getenv("DTRAIN_PREEMPTION_EXIT_CODE");
  const int preemption_code = preempt != nullptr ? std::atoi(preempt) : 143;

  fault::ProgressReporter* reporter = fault::install_progress_reporter();
  std::unique_ptr<distribute::MultiWorkerMirroredStrategy> strategy;
  if (collective) {
    strategy = std::make_unique<distribute::MultiWorkerMirroredStrategy>(
        distribute::MultiWorkerOptions{.timeout = std::chrono::seconds(10)});
  }
  const int64_t start = read_ckpt(dir);
  if (reporter != nullptr && env.generation > 1) {
    reporter->report_resumed(start, "ckpt-" + std::to_string(start));
  }
  int64_t step = start;
  while (step < steps) {
    if (g_terminate) {
      if (env.rank == 0) write_ckpt(dir, step);
      std::printf("preempted at step %lld rank %d\n", static_cast<long long>(step), env.rank);
      std::fflush(stdout);
      return preemption_code;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    if (strategy) strategy->all_reduce_scalar(1.0, distribute::ReduceOp::kSum);
    ++step;
    train::notify_step(step);
    if (env.rank == 0 && step % ckpt_every == 0) write_ckpt(dir, step);
    if (step % 5 == 0) {
      std::printf("at step %lld rank %d gen %lld\n", static_cast<long long>(step), env.rank,
                  static_cast<long long>(env.generation));
      std::fflush(stdout);
    }
  }
  if (strategy) strategy->barrier();
  std::printf("DONE rank %d world %d gen %lld step %lld\n", env.rank, env.world_size,
              static_cast<long long>(env.generation), static_cast<long long>(step));
  std::fflush(stdout);
  fault::uninstall_progress_reporter();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (e.code() == ErrorCode::kUnavailable) return 5;
    if (e.code() == ErrorCode::kDeadlineExceeded) return 6;
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
