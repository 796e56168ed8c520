// dtrain ps: runs one parameter server (the "ps" task of a ParameterServerStrategy job) until
// SIGINT or SIGTERM. The address comes from --port/--host, else from TF_CONFIG's ps task.
// Prints "dtrain ps: serving on host:port" once listening. Single-threaded setup; the server's
// gRPC threads are its own.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/cluster_resolver.h"
#include "dtrain/distribute/parameter_server.h"

namespace dtrain::cli {
namespace {

struct PsFlags {
  int port = -1;
  std::string host = "127.0.0.1";
  bool no_sync = false;
};

int run_ps(const PsFlags& flags) {
  std::string address;
  if (flags.port >= 0) {
    DTRAIN_CHECK(flags.port <= 65535, "dtrain ps: --port ", flags.port, " is not a port");
    address = str_cat(flags.host, ":", flags.port);
  } else {
    const distribute::ClusterSpec cluster = distribute::resolve_cluster();
    const auto it = cluster.jobs.find("ps");
    if (cluster.task_type != "ps" || it == cluster.jobs.end()) {
      throw InvalidArgumentError(
          "dtrain ps: give --port, or set TF_CONFIG with a \"ps\" job and task type \"ps\"");
    }
    address = it->second.at(static_cast<size_t>(cluster.task_index));
  }
  // Signals go to this thread only (sigwait below); the server's threads inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  distribute::ParameterServer server({.address = address, .sync_to_disk = !flags.no_sync});
  std::printf("dtrain ps: serving on %s\n", server.address().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::printf("dtrain ps: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  server.stop();
  return 0;
}

}  // namespace

void add_ps_command(CLI::App& app, std::function<int()>& run) {
  static PsFlags flags;
  CLI::App* cmd = app.add_subcommand(
      "ps", "Run a parameter server for ParameterServerStrategy (until SIGINT/SIGTERM)");
  cmd->add_option("--port", flags.port,
                  "Port to listen on (0: pick one and print it); default: TF_CONFIG's ps task")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", flags.host, "Address to listen on (0.0.0.0 for other machines)");
  cmd->add_flag("--no-sync", flags.no_sync, "Do not fsync checkpoint shards (scratch space only)");
  cmd->callback([&run] { run = [] { return run_ps(flags); }; });
}

}  // namespace dtrain::cli
