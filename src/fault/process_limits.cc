// Process-count checks against this process's limits (see process_limits.h).
#include "fault/process_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include "dtrain/core/error.h"

namespace dtrain::fault {

void check_process_count(long long count, const std::string& flag) {
  DTRAIN_CHECK(count <= kMaxSupervisedProcesses, "launch: ", flag,
               ": dtrain launch starts at most ", kMaxSupervisedProcesses,
               " processes on one node (one launcher supervises them all)");
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
    const long long needed = kBaseFds + count * kFdsPerProcess;
    DTRAIN_CHECK(needed <= static_cast<long long>(files.rlim_cur), "launch: ", flag,
                 ": the launcher needs about ", needed, " file descriptors (", kFdsPerProcess,
                 " per process) but may open ", files.rlim_cur,
                 " (RLIMIT_NOFILE); raise it (ulimit -n) or start fewer processes");
  }
  rlimit procs{};
  // RLIMIT_NPROC counts every process and thread of the user; root is not held to it.
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &procs) == 0 &&
      procs.rlim_cur != RLIM_INFINITY) {
    DTRAIN_CHECK(count < static_cast<long long>(procs.rlim_cur), "launch: ", flag, ": ", count,
                 " processes are more than this user may run (", procs.rlim_cur,
                 ", RLIMIT_NPROC; ulimit -u)");
  }
}

}  // namespace dtrain::fault
