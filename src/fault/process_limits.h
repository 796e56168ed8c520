// Up-front checks of how many processes a launcher may start and supervise, against a sane
// maximum and the limits of this process (RLIMIT_NOFILE, RLIMIT_NPROC), so that an absurd count
// fails at once with a usage error instead of running out of file descriptors halfway through
// starting them. Private to src/fault. Thread-safe.
#pragma once

#include <string>

namespace dtrain::fault {

// The most processes one launcher starts and supervises on one node.
inline constexpr int kMaxSupervisedProcesses = 1024;
// Descriptors a launcher holds per supervised process, with some to spare: its two output
// pipes, the pipes of a spawn in progress, its connection to the coordination service.
inline constexpr int kFdsPerProcess = 8;
// Descriptors a launcher needs besides them (its own streams, the service, logs, gRPC).
inline constexpr int kBaseFds = 64;

// Throws InvalidArgumentError when `count` processes (of `flag`, e.g. "--nproc-per-node 3000")
// are more than kMaxSupervisedProcesses, need more file descriptors than RLIMIT_NOFILE allows,
// or more processes than RLIMIT_NPROC allows (when it applies). The message says the limit and
// why.
void check_process_count(long long count, const std::string& flag);

}  // namespace dtrain::fault
