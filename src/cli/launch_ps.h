// `dtrain launch --ps N --workers M`: a ParameterServerStrategy job on one machine (launch_ps.cc).
#pragma once

#include <string>
#include <vector>

namespace dtrain::cli {

struct LaunchPsOptions {
  int ps = 0;                        // parameter servers (`dtrain ps` processes)
  int workers = 0;                   // workers running the program (plus the chief)
  int max_restarts = 0;              // restarts of each dead server or worker
  double grace_period_s = 5;         // SIGTERM → SIGKILL when stopping the job
  std::vector<std::string> command;  // the chief's and workers' program
};

// Runs the job; returns the chief's exit code. Throws InvalidArgumentError for bad options.
int run_launch_ps(const LaunchPsOptions& options);

}  // namespace dtrain::cli
