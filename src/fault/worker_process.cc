// Process plumbing for the launcher: spawn (fork and exec, so the child can ask to die with the
// launcher), pipes, line prefixes, the signal self-pipe, and stack dumps of hung workers.
// Single-threaded use (see worker_process.h).
#include "fault/worker_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace dtrain::fault {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are split, so memory stays bounded

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

int signal_index(int sig) { return sig == SIGINT ? 0 : sig == SIGTERM ? 1 : 2; }

// The first line of /proc/<pid>/... file `name` that starts with `field`, or "".
std::string proc_field(const std::string& path, const std::string& field) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return line;
  }
  return "";
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

// `program` as exec would run it: a path when it contains '/', else the first executable
// regular file of that name on PATH; "" when there is none.
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

void close_pair(int fds[2]) {
  ::close(fds[0]);
  ::close(fds[1]);
}

// The child between fork and exec: only async-signal-safe calls (the launcher has threads).
// Its own process group; SIGKILL when the launcher dies (PR_SET_PDEATHSIG, and at once when the
// launcher died before that was set: the child was re-parented already); default signal
// handling and, after that, an empty mask; stdout and stderr into the pipes; `inherit` (>= 0)
// kept open across the exec. Writes errno to `report` and exits 127 when exec fails.
[[noreturn]] void exec_child(pid_t parent, const char* program, char* const argv[],
                             char* const envp[], int out, int err, int report, int inherit) {
  ::setpgid(0, 0);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::raise(SIGKILL);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {  // no handler of the launcher's may run in the child
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_DFL &&
        now.sa_handler != SIG_IGN) {
      ::sigaction(sig, &dfl, nullptr);
    }
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2}) {
    ::sigaction(sig, &dfl, nullptr);  // ignored ones too (SIGPIPE)
  }
  sigset_t empty;
  sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  if (::dup2(out, STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0 ||
      (inherit >= 0 && ::fcntl(inherit, F_SETFD, 0) != 0)) {
    const int e = errno;
    [[maybe_unused]] const ssize_t n = ::write(report, &e, sizeof e);
    ::_exit(127);
  }
  ::execve(program, argv, envp);
  const int e = errno;
  [[maybe_unused]] const ssize_t n = ::write(report, &e, sizeof e);
  ::_exit(127);
}

}  // namespace

void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void emit_lines(Stream& s, const std::string& prefix, bool flush) {
  size_t start = 0;
  while (true) {
    const size_t nl = s.partial.find('\n', start);
    size_t end = nl;
    if (nl == std::string::npos) {
      if (s.partial.size() - start >= kMaxLine || (flush && start < s.partial.size())) {
        end = s.partial.size();
      } else {
        break;
      }
    }
    std::string line = prefix;
    line.append(s.partial, start, end - start);
    line.push_back('\n');
    write_all(s.out, line.data(), line.size());
    start = nl == std::string::npos ? end : nl + 1;
  }
  s.partial.erase(0, start);
}

void pump(Stream& s, const std::string& prefix) {
  if (s.fd < 0) return;
  char buf[16384];
  const ssize_t n = ::read(s.fd, buf, sizeof buf);
  if (n > 0) {
    s.partial.append(buf, static_cast<size_t>(n));
    emit_lines(s, prefix, false);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    close_stream(s, prefix);
  }
}

void close_stream(Stream& s, const std::string& prefix) {
  if (s.fd < 0) return;
  emit_lines(s, prefix, true);
  ::close(s.fd);
  s.fd = -1;
}

Process spawn_process(const std::vector<std::string>& command, const std::vector<std::string>& env,
                      const std::string& what, int inherit_fd) {
  DTRAIN_INTERNAL_CHECK(!command.empty(), "spawn_process: no command");
  const std::string cannot = str_cat("launch: cannot start '", command[0], "' for ", what, ": ");
  // Resolved here, not in the child: between fork and exec only async-signal-safe calls.
  const std::string program = resolve_program(command[0]);
  if (program.empty()) throw NotFoundError(cannot + std::strerror(ENOENT));
  int out[2], err[2], report[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    close_pair(out);
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  }
  if (::pipe2(report, O_CLOEXEC) != 0) {  // the child's exec error; closed by a successful exec
    close_pair(out);
    close_pair(err);
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  }
  std::vector<char*> argv, envp;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // Signals stay blocked until the child has reset its handlers (inherited ones would write to
  // the launcher's self-pipe), as posix_spawn does.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    exec_child(parent, program.c_str(), argv.data(), envp.data(), out[1], err[1], report[1],
               inherit_fd);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  ::close(report[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    ::close(report[0]);
    throw FailedPreconditionError(cannot + std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first (EACCES after its exec)
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n > 0) {  // exec failed: the child exited
    ::waitpid(pid, nullptr, 0);
    ::close(out[0]);
    ::close(err[0]);
    if (child_errno == ENOENT) throw NotFoundError(cannot + std::strerror(child_errno));
    throw FailedPreconditionError(cannot + std::strerror(child_errno));
  }
  Process p;
  p.pid = pid;
  p.out = {.fd = out[0], .out = STDOUT_FILENO, .partial = {}};
  p.err = {.fd = err[0], .out = STDERR_FILENO, .partial = {}};
  return p;
}

std::vector<std::string> environment_with(const std::vector<std::string>& drop,
                                          const std::vector<std::string>& set) {
  std::vector<std::string> env;
  for (char** p = environ; *p != nullptr; ++p) {
    const std::string entry = *p;
    const std::string name = entry.substr(0, entry.find('='));
    bool dropped = false;
    for (const auto& d : drop) dropped = dropped || d == name;
    for (const auto& s : set) dropped = dropped || s.substr(0, s.find('=')) == name;
    if (!dropped) env.push_back(entry);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool process_stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')' (comm may contain parentheses).
  const char* close = std::strrchr(buf, ')');
  if (n == 0 || close == nullptr || close[1] != ' ') return false;
  return close[2] == 'T' || close[2] == 't';
}

std::string describe_stuck_process(pid_t pid, milliseconds gdb_timeout) {
  const std::string proc = str_cat("/proc/", pid);
  std::string out = str_cat("pid ", pid, ": ", proc_field(proc + "/status", "State:"), "\n");
  if (DIR* d = ::opendir((proc + "/task").c_str())) {
    int shown = 0;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (++shown > 64) {
        out += "  ... more threads\n";
        break;
      }
      const std::string task = proc + "/task/" + e->d_name;
      out += str_cat("  thread ", e->d_name, " (", read_small_file(task + "/comm"),
                     "): ", proc_field(task + "/status", "State:"), ", waiting in '",
                     read_small_file(task + "/wchan"), "'\n");
    }
    ::closedir(d);
  }
  if (gdb_timeout.count() <= 0) return out;
  const std::string gdb = resolve_program("gdb");
  if (gdb.empty()) return out + "(gdb is not installed: no backtraces)\n";
  Process p;
  try {
    p = spawn_process(
        {gdb, "-p", std::to_string(pid), "-batch", "-nx", "-q", "-ex", "thread apply all bt 30"},
        environment_with({}, {}), "stack dump");
  } catch (const Error& e) {
    return out + str_cat("(gdb: ", e.what(), ")\n");
  }
  std::string text;
  const auto deadline = Clock::now() + gdb_timeout;
  bool timed_out = false;
  for (Stream* s : {&p.out, &p.err}) ::fcntl(s->fd, F_SETFL, O_NONBLOCK);
  while (p.out.fd >= 0 || p.err.fd >= 0) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2];
    int n = 0;
    Stream* streams[2];
    for (Stream* s : {&p.out, &p.err}) {
      if (s->fd >= 0) {
        fds[n] = {.fd = s->fd, .events = POLLIN, .revents = 0};
        streams[n++] = s;
      }
    }
    ::poll(fds, n, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    for (int i = 0; i < n; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[8192];
      const ssize_t r = ::read(streams[i]->fd, buf, sizeof buf);
      if (r > 0) {
        if (text.size() < 256 * 1024) text.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(streams[i]->fd);
        streams[i]->fd = -1;
      }
    }
  }
  for (Stream* s : {&p.out, &p.err}) {
    if (s->fd >= 0) ::close(s->fd);
  }
  if (timed_out) ::kill(-p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
  // Keep the backtraces, drop gdb's chatter about symbols and threads.
  std::istringstream lines(text);
  std::string kept;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("#", 0) == 0 || line.rfind("Thread ", 0) == 0) kept += line + "\n";
  }
  if (kept.empty()) kept = text.substr(0, 4096);
  out += "gdb backtraces:\n" + kept;
  if (timed_out) out += str_cat("(gdb stopped after ", gdb_timeout.count(), " ms)\n");
  return out;
}

SignalRelay::SignalRelay() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kForwardedSignals) sigaction(sig, &sa, &previous_[signal_index(sig)]);
  sigaction(SIGCHLD, &sa, &previous_chld_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous_pipe_);
}

SignalRelay::~SignalRelay() {
  for (int sig : kForwardedSignals) sigaction(sig, &previous_[signal_index(sig)], nullptr);
  sigaction(SIGCHLD, &previous_chld_, nullptr);
  sigaction(SIGPIPE, &previous_pipe_, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

int SignalRelay::fd() const { return g_signal_pipe[0]; }

std::vector<int> SignalRelay::take() {
  std::vector<int> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != SIGCHLD) out.push_back(buf[i]);
    }
  }
  return out;
}

}  // namespace dtrain::fault
