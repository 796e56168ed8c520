// `dtrain launch --ps N --workers M`: a whole ParameterServerStrategy job on this machine, for a
// demo or a test (src/fault/launch_ps.cc). docs/parameter-server.md describes it for users.
// run_launch_ps() installs signal handlers for its duration and must run on one thread of a
// process that runs nothing else of this kind.
#pragma once

#include <string>
#include <vector>

namespace dtrain::fault {

struct LaunchPsOptions {
  int ps = 0;                        // parameter servers (`dtrain ps` processes), >= 1
  int workers = 0;                   // workers running the program (plus the chief), >= 0
  int max_restarts = 0;              // restarts of each dead server or worker, >= 0
  double grace_period_s = 5;         // SIGTERM → SIGKILL when stopping the job
  std::vector<std::string> command;  // the chief's and workers' program
};

// Starts N `dtrain ps` servers (this executable), M workers and the chief (both running the
// command), each with the TF_CONFIG a TFJob would give it (ports on 127.0.0.1); prefixes their
// output ("[ps 0] ", "[worker 1] ", "[chief] "), forwards SIGINT/SIGTERM/SIGHUP, restarts a
// server or a worker that dies (up to max_restarts, on the same address), and returns the
// chief's exit code. The processes die with the launcher (SIGKILL when it dies). Throws
// InvalidArgumentError for bad options (checked before anything starts), NotFoundError for a
// program that does not exist. Blocks for the whole job.
int run_launch_ps(const LaunchPsOptions& options);

}  // namespace dtrain::fault
