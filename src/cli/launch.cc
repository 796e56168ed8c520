// dtrain launch: starts the worker processes of a job on this node, like torchrun, and keeps the
// job alive through failures (--max-restarts). The work is fault::run_launch_agent, or
// fault::run_launch_ps for --ps (src/fault); this file maps the command line onto their
// options (which they check before starting anything). Single-threaded.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/fault/launch_agent.h"
#include "dtrain/fault/launch_ps.h"

namespace dtrain::cli {
namespace {

fault::LaunchOptions options;
std::string nnodes = "1";
int ps_servers = 0;
int ps_workers = 0;

bool ps_job = false;  // --ps given

int run_launch() {
  if (ps_job) {
    return fault::run_launch_ps({.ps = ps_servers,
                                 .workers = ps_workers,
                                 .max_restarts = options.max_restarts,
                                 .grace_period_s = options.grace_period_s,
                                 .command = options.command});
  }
  const auto [lo, hi] = fault::parse_nnodes(nnodes);
  options.min_nodes = lo;
  options.max_nodes = hi;
  return fault::run_launch_agent(options);
}

}  // namespace

void add_launch_command(CLI::App& app, std::function<int()>& run) {
  if (const char* code = std::getenv("DTRAIN_PREEMPTION_EXIT_CODE")) {
    options.preemption_exit_code = std::atoi(code);
  }
  CLI::App* cmd =
      app.add_subcommand("launch",
                         "Start the worker processes of a job on this node, like torchrun, and "
                         "restart them after failures (dtrain launch --nproc-per-node N -- "
                         "PROGRAM ARGS...)");
  cmd->add_option("--nproc-per-node", options.nproc_per_node, "Worker processes on this node")
      ->capture_default_str();
  cmd->add_option("--nnodes", nnodes,
                  "Nodes in the job: N, or MIN:MAX for an elastic job that goes on with fewer "
                  "nodes (down to MIN) and admits returning ones")
      ->capture_default_str();
  cmd->add_option("--node-rank", options.node_rank,
                  "Id of this node, 0 .. nnodes-1 (node 0 hosts the coordination service)")
      ->capture_default_str();
  cmd->add_option("--rdzv", options.rdzv,
                  "Rendezvous: 'coordinator' (a service inside this launcher; one node), "
                  "host:port (node 0 hosts the service there, the others join it), "
                  "file:///shared/dir, redis://host:port or etcd://host:port[,host:port...] "
                  "(workers' Gloo store)")
      ->capture_default_str();
  cmd->add_option("--rdzv-timeout", options.rdzv_timeout_s,
                  "Seconds to wait for the service and for the nodes of each rendezvous")
      ->capture_default_str();
  cmd->add_option("--rdzv-settle", options.rdzv_settle_s,
                  "Elastic jobs: a rendezvous with at least MIN nodes closes this many seconds "
                  "after the last node arrived")
      ->capture_default_str();
  cmd->add_option("--grace-period", options.grace_period_s,
                  "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  cmd->add_option("--run-id", options.run_id, "Job id, separates jobs that share a store")
      ->capture_default_str();
  cmd->add_option("--max-restarts", options.max_restarts,
                  "Restart the whole group this many times after failures (0: exit with the "
                  "first failure's code)")
      ->capture_default_str();
  cmd->add_option("--heartbeat-interval", options.heartbeat_interval_s,
                  "Seconds between the workers' heartbeats (0: none)")
      ->capture_default_str();
  cmd->add_option("--heartbeat-timeout", options.heartbeat_timeout_s,
                  "A worker (node) without a heartbeat for this many seconds is dead (0: never)")
      ->capture_default_str();
  cmd->add_option("--watchdog-timeout", options.watchdog_timeout_s,
                  "A worker whose training step does not advance for this many seconds is hung "
                  "(0: off)")
      ->capture_default_str();
  cmd->add_option("--stack-timeout", options.stack_timeout_s,
                  "Seconds gdb may take to dump a hung worker's stacks (0: no gdb)")
      ->capture_default_str();
  cmd->add_option("--exclude-after", options.exclude_after,
                  "Exclude a worker slot (with several nodes: a node) after this many failures "
                  "within --exclude-window (0: never)")
      ->capture_default_str();
  cmd->add_option("--exclude-window", options.exclude_window_s, "Seconds; see --exclude-after")
      ->capture_default_str();
  cmd->add_option("--preemption-exit-code", options.preemption_exit_code,
                  "A worker exit code that means preempted: passed through, no restart "
                  "(default: $DTRAIN_PREEMPTION_EXIT_CODE, else 143)")
      ->capture_default_str();
  cmd->add_option("--event-log", options.event_log,
                  "Append every failure, restart and recovery to this JSON-lines file");
  cmd->add_option("--logdir", options.logdir,
                  "TensorBoard directory: the launcher writes its events to LOGDIR/launcher");
  cmd->add_option("--snapshot-every", options.snapshot_every,
                  "Workers that fit with backups also snapshot their state into this launcher's "
                  "memory every this many steps (replicated to a neighbour node); a restart "
                  "resumes from there before any disk read (0: none)")
      ->capture_default_str();
  cmd->add_option("--snapshot-commit", options.snapshot_commit,
                  "journal: a snapshot is whole once its slot's trailer is, and its TensorFlow "
                  "files are made when needed; files: every snapshot makes them at once (about "
                  "17 system calls each)")
      ->capture_default_str();
  cmd->add_option("--on-failure", options.on_failure,
                  "restart-all: every failure restarts every worker; survivors: only the failed "
                  "workers restart, the others keep running and roll back to the newest "
                  "in-memory snapshot (--snapshot-every > 0)")
      ->capture_default_str();
  cmd->add_option("--spares", options.spares,
                  "Hot spares: keep this many standby workers started (data loaded, model built, "
                  "connected) that take over a failed rank of their node at once "
                  "(--snapshot-every > 0; at most 64)")
      ->capture_default_str();
  cmd->add_option("--spare-start", options.spare_start,
                  "fork (the default): one fork server loads the data and builds the model "
                  "once, and each spare is a fork of it (milliseconds of CPU); exec: each spare "
                  "is a new process that loads and builds on its own")
      ->capture_default_str();
  cmd->add_option("--snapshot-root", options.snapshot_root,
                  "Directory for the snapshots' tmpfs directory (default /dev/shm)");
  CLI::Option* ps =
      cmd->add_option("--ps", ps_servers,
                      "Start a ParameterServerStrategy job instead: this many `dtrain ps` "
                      "servers, --workers workers and a chief, with TF_CONFIG "
                      "(docs/parameter-server.md)");
  cmd->add_option("--workers", ps_workers, "Workers of a --ps job (besides the chief)")->needs(ps);
  cmd->add_option("command", options.command, "PROGRAM ARGS... (after --)")->required();
  // A --ps job has no nodes, rendezvous, heartbeats or exclusion: those flags do not apply.
  for (CLI::Option* o : cmd->get_options()) {
    const std::string name = o->get_name();
    if (o != ps && name.rfind("--", 0) == 0 && name != "--workers" && name != "--max-restarts" &&
        name != "--grace-period" && name != "--help") {
      ps->excludes(o);
    }
  }
  cmd->callback([&run, ps] {
    ps_job = ps->count() > 0;
    run = run_launch;
  });
}

}  // namespace dtrain::cli
