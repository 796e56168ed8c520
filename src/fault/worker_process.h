// The launcher's process plumbing: spawning a worker in its own process group with its output
// through pipes, forwarding complete lines with a "[rank N] " prefix, the launcher's own
// "[launch] " messages, the self-pipe that turns signals into poll events, and stack dumps of a
// hung worker. Private to src/fault. Single-threaded use (the launcher's poll loop), except
// say(), which may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain::fault {

// Writes all of `data` to `fd`; drops it when the reader is gone (EPIPE: SIGPIPE is ignored).
void write_all(int fd, const char* data, size_t n);

// The launcher's own messages, on stderr, recognizable among the workers' lines.
template <class... Args>
void say(Args&&... args) {
  const std::string line = str_cat("[launch] ", std::forward<Args>(args)..., "\n");
  write_all(2, line.data(), line.size());
}

// One worker's stdout or stderr: a pipe and the bytes of a line not yet complete.
struct Stream {
  int fd = -1;  // read end; -1 when closed
  int out = 1;  // where its lines go (1 or 2)
  std::string partial;
};

// Emits every complete line in s.partial (all of it when `flush`), each prefixed.
void emit_lines(Stream& s, const std::string& prefix, bool flush);
// Reads what is available from s.fd and emits complete lines; closes it at EOF or on error.
void pump(Stream& s, const std::string& prefix);
// Emits what is left and closes the pipe (no-op when closed).
void close_stream(Stream& s, const std::string& prefix);

// A started worker process: its pid (also its process group) and its output pipes.
struct Process {
  pid_t pid = -1;
  Stream out, err;
};

// Starts `command` with `env` (the program found on PATH unless it names a path), stdout and
// stderr into fresh pipes, in its own process group (so a signal reaches its whole process
// tree), with default signal handling, and asks the kernel to SIGKILL it when the calling
// thread dies (PR_SET_PDEATHSIG: a launcher killed with SIGKILL leaves no orphaned worker; its
// grandchildren are the worker's to stop). Call it from the thread that lives as long as the
// launcher. Throws
// NotFoundError when the program does not exist, FailedPreconditionError when it cannot be
// started, naming `what`. `inherit_fd` >= 0: that descriptor stays open in the child (the
// launcher's are close-on-exec), at the same number.
Process spawn_process(const std::vector<std::string>& command, const std::vector<std::string>& env,
                      const std::string& what, int inherit_fd = -1);

// The current environment without the variables named in `drop`, plus `set` ("NAME=value").
std::vector<std::string> environment_with(const std::vector<std::string>& drop,
                                          const std::vector<std::string>& set);

// Whether process `pid` is stopped (by a signal or a tracer): state T or t in /proc/<pid>/stat.
bool process_stopped(pid_t pid);

// Decodes a waitpid status the way shells do: exit code, or 128 + signal.
int exit_code_of(int status);

// What process `pid` is doing, for a hang report: its state from /proc, each thread's state
// and wait channel, and, when gdb is on PATH and `gdb_timeout` > 0, every thread's backtrace
// (gdb is killed after `gdb_timeout`). Never throws; blocks up to about gdb_timeout.
std::string describe_stuck_process(pid_t pid, std::chrono::milliseconds gdb_timeout);

// Signals forwarded to the workers.
inline constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Installs handlers for SIGINT/SIGTERM/SIGHUP/SIGCHLD that write the signal's number to a
// self-pipe (poll fd()), and ignores SIGPIPE, for the life of the object; restores the previous
// dispositions after. One instance per process at a time.
class SignalRelay {
 public:
  // Throws InternalError when the pipe cannot be made.
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // The read end to poll.
  int fd() const;
  // Signals received since the last call (SIGCHLD excluded).
  std::vector<int> take();

 private:
  struct sigaction previous_[3]{};
  struct sigaction previous_chld_ {};
  struct sigaction previous_pipe_ {};
};

}  // namespace dtrain::fault
