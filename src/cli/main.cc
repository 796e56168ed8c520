// The dtrain command-line tool: parses the sub-command, runs it, and turns dtrain errors into
// one clear line on stderr and an exit code (docs/errors.md).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/fault/progress_reporter.h"
#include "dtrain/train/preemption.h"

namespace {

// Exit codes: 0 ok, 1 unexpected, 2 usage / invalid argument, 3 not found, 4 data loss,
// 5 unavailable, 6 deadline exceeded, 7 aborted (preempted), 8 failed precondition, 9 permission
// denied (a read-only or unwritable destination).
int exit_code(dtrain::ErrorCode code) {
  switch (code) {
    case dtrain::ErrorCode::kInvalidArgument:
    case dtrain::ErrorCode::kOutOfRange:
      return 2;
    case dtrain::ErrorCode::kNotFound:
      return 3;
    case dtrain::ErrorCode::kDataLoss:
      return 4;
    case dtrain::ErrorCode::kUnavailable:
      return 5;
    case dtrain::ErrorCode::kDeadlineExceeded:
      return 6;
    case dtrain::ErrorCode::kAborted:
      return 7;
    case dtrain::ErrorCode::kFailedPrecondition:
      return 8;
    case dtrain::ErrorCode::kPermissionDenied:
      return 9;
    default:
      return 1;
  }
}

}  // namespace

// The sub-commands that start or serve processes rather than train: no progress reporter.
bool launching(const CLI::App& app) {
  for (const char* name : {"launch", "ps", "ckpt", "events"}) {
    if (app.got_subcommand(name)) return true;
  }
  return false;
}

int main(int argc, char** argv) {
  CLI::App app{
      "dtrain: distributed neural-network training with TensorFlow/Keras semantics, in C++.\n"
      "Trains Keras-style models on Fashion-MNIST (default), IDX or CSV data."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dtrain 0.1.0");
  std::function<int()> run;
  dtrain::cli::add_train_commands(app, run);
  dtrain::cli::add_ckpt_command(app, run);
  dtrain::cli::add_events_command(app, run);
  dtrain::cli::add_launch_command(app, run);
  dtrain::cli::add_ps_command(app, run);
  dtrain::cli::add_generate_command(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message; usage errors exit with 2, as most command-line tools do.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    // Under dtrain launch, report training progress and heartbeats to the launcher (its
    // watchdog and heartbeat checks); a no-op otherwise, and for the launcher itself.
    if (run && !launching(app)) dtrain::fault::install_progress_reporter();
    return run ? run() : 0;
  } catch (const dtrain::train::PreemptedError& e) {
    // Not a failure: the state is saved; the exit code tells the job manager to retry.
    std::fflush(stdout);
    std::cerr << e.what() << "\n";
    return e.exit_code();
  } catch (const dtrain::Error& e) {
    std::fflush(stdout);
    std::cerr << "dtrain: error: " << dtrain::error_code_name(e.code()) << ": " << e.what() << "\n";
    return exit_code(e.code());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "dtrain: error: " << e.what() << "\n";
    return 1;
  }
}
