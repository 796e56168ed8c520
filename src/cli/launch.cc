// dtrain launch: starts the worker processes of a job on this node, like torchrun. Hosts (or
// joins) the coordination service, gives every worker the environment of launcher_env.h,
// prefixes each line of their output with "[rank N] ", forwards SIGINT / SIGTERM / SIGHUP, and
// exits with the first failure's code after stopping the other workers. Single-threaded: one
// poll loop reads the pipes, reaps the workers and handles signals (through a self-pipe).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"

extern char** environ;

namespace dtrain::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace dist = dtrain::distribute;

struct LaunchFlags {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv = "coordinator";
  double rdzv_timeout_s = 300;
  double grace_period_s = 5;
  std::string run_id = "default";
  std::vector<std::string> command;
};
LaunchFlags flags;

// ---- output -------------------------------------------------------------------------------

// Writes all of `data` to `fd`; drops it when the reader is gone (EPIPE: SIGPIPE is ignored).
void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// The launcher's own messages, on stderr, recognizable among the workers' lines.
template <class... Args>
void say(Args&&... args) {
  const std::string line = str_cat("[launch] ", std::forward<Args>(args)..., "\n");
  write_all(STDERR_FILENO, line.data(), line.size());
}

// One worker's stdout or stderr: a pipe and the bytes of a line not yet complete.
struct Stream {
  int fd = -1;  // read end; -1 when closed
  int out = 1;  // where its lines go (1 or 2)
  std::string partial;
};

constexpr size_t kMaxLine = 64 * 1024;  // longer lines are split, so memory stays bounded

// Emits every complete line in s.partial (all of it when `flush`), each prefixed.
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

// ---- signals --------------------------------------------------------------------------------

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(signal_pipe[1], &b, 1);
  errno = saved;
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

// Installs the handlers for the life of the object and restores the previous ones after.
class SignalRelay {
 public:
  SignalRelay() {
    if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
    }
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kForwarded) sigaction(sig, &sa, &previous_[index(sig)]);
    sigaction(SIGCHLD, &sa, &previous_chld_);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }
  ~SignalRelay() {
    for (int sig : kForwarded) sigaction(sig, &previous_[index(sig)], nullptr);
    sigaction(SIGCHLD, &previous_chld_, nullptr);
    sigaction(SIGPIPE, &previous_pipe_, nullptr);
    ::close(signal_pipe[0]);
    ::close(signal_pipe[1]);
    signal_pipe[0] = signal_pipe[1] = -1;
  }
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Signals received since the last call (SIGCHLD excluded).
  std::vector<int> take() {
    std::vector<int> out;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(signal_pipe[0], buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != SIGCHLD) out.push_back(buf[i]);
      }
    }
    return out;
  }

 private:
  static int index(int sig) { return sig == SIGINT ? 0 : sig == SIGTERM ? 1 : 2; }
  struct sigaction previous_[3]{};
  struct sigaction previous_chld_ {};
  struct sigaction previous_pipe_ {};
};

// ---- the worker group ---------------------------------------------------------------------

struct Worker {
  int rank = 0;
  pid_t pid = -1;  // also its process group
  bool running = false;
  int code = 0;  // exit code, or 128 + signal
  std::string prefix;
  Stream out, err;
};

// Decodes a waitpid status the way shells do: exit code, or 128 + signal.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Starts `command` with `env`, stdout and stderr into fresh pipes, in its own process group
// (so a signal reaches its whole process tree), with default signal handling.
void spawn(Worker& w, const std::vector<std::string>& command,
           const std::vector<std::string>& env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0)
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    throw InternalError(str_cat("launch: pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, empty;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT, SIGUSR1, SIGUSR2}) {
    sigaddset(&defaults, sig);
  }
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> argv, envp;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    const std::string msg = str_cat("launch: cannot start '", command[0], "' for rank ", w.rank,
                                    ": ", std::strerror(rc));
    if (rc == ENOENT) throw NotFoundError(msg);
    throw FailedPreconditionError(msg);
  }
  w.pid = pid;
  w.running = true;
  w.out = {.fd = out[0], .out = STDOUT_FILENO, .partial = {}};
  w.err = {.fd = err[0], .out = STDERR_FILENO, .partial = {}};
}

// The environment of one worker: ours, minus every DTRAIN_* variable the contract defines,
// plus the contract's values.
std::vector<std::string> worker_environment(const dist::LauncherEnv& e) {
  const auto vars = e.to_variables();
  std::vector<std::string> env;
  for (char** p = environ; *p != nullptr; ++p) {
    const std::string entry = *p;
    const std::string name = entry.substr(0, entry.find('='));
    bool ours = name == dist::kEnvMasterAddr || name == dist::kEnvMasterPort;
    for (const auto& [k, v] : vars) ours = ours || k == name;
    if (!ours) env.push_back(entry);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

// How the node learns about failures elsewhere (multi-node jobs through the service).
struct JobLink {
  dist::CoordinationClient* client = nullptr;  // null: single node, or no service
  std::string prefix = "";                     // "dtrain/<run_id>/launch/g<generation>/"
  int node_rank = 0;
  Clock::time_point next_check{};
};

// Runs the group until every worker has exited; returns the launcher's exit code.
int supervise(std::vector<Worker>& workers, SignalRelay& signals, JobLink& link,
              milliseconds grace) {
  std::optional<int> failure;                // exit code of the first failure
  int received_signal = 0;                   // last signal forwarded
  std::optional<Clock::time_point> kill_at;  // SIGKILL the rest then
  bool lost_service = false;
  const auto stop_all = [&](int sig) {
    for (auto& w : workers) {
      if (w.running) ::kill(-w.pid, sig);
    }
    if (!kill_at) kill_at = Clock::now() + grace;
  };
  bool published = false;  // the job's first failure is on the service for the other nodes
  const auto publish = [&](const std::string& what, int code) {
    if (published || link.client == nullptr) return;
    published = true;
    {
      try {
        if (link.client->add(link.prefix + "failures", 1) == 1) {
          link.client->set(link.prefix + "failure", str_cat(code, " ", what));
        }
      } catch (const Error& e) {
        say("cannot report the failure to the other nodes: ", e.what());
      }
    }
  };
  const auto report_failure = [&](const std::string& what, int code) {
    if (failure) return;
    failure = code;
    publish(what, code);
  };
  std::optional<Clock::time_point> drain_until;  // all reaped: read what is left, this long
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({.fd = signal_pipe[0], .events = POLLIN, .revents = 0});
    for (auto& w : workers) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({.fd = s->fd, .events = POLLIN, .revents = 0});
          streams.push_back(s);
        }
      }
    }
    const bool any_running =
        std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
    if (!any_running) {
      if (streams.empty()) break;
      if (!drain_until) drain_until = Clock::now() + milliseconds(1000);
      if (Clock::now() >= *drain_until) break;  // a leftover grandchild holds a pipe
    }
    ::poll(fds.data(), fds.size(), 100);

    for (size_t i = 1; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Stream& s = *streams[i - 1];
      const Worker* owner = nullptr;
      for (const auto& w : workers) {
        if (&w.out == &s || &w.err == &s) owner = &w;
      }
      char buf[16384];
      const ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0) {
        s.partial.append(buf, static_cast<size_t>(n));
        emit_lines(s, owner->prefix, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit_lines(s, owner->prefix, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }

    for (int sig : signals.take()) {
      say("received ", strsignal(sig), "; forwarding it to the workers");
      received_signal = sig;
      // The other nodes stop too; this node's exit code stays the workers' (see docs).
      publish(str_cat("node ", link.node_rank, " received ", strsignal(sig)), 128 + sig);
      for (auto& w : workers) {
        if (w.running) ::kill(-w.pid, sig);
      }
      if (!kill_at) kill_at = Clock::now() + grace;
    }

    for (auto& w : workers) {
      if (!w.running) continue;
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r != w.pid) continue;
      w.running = false;
      w.code = exit_code_of(status);
      if (w.code != 0 && !failure && received_signal == 0) {
        say("rank ", w.rank, " (pid ", w.pid, ") ",
            WIFSIGNALED(status) ? str_cat("was killed by signal ", WTERMSIG(status), " (",
                                          strsignal(WTERMSIG(status)), ")")
                                : str_cat("exited with code ", w.code),
            "; stopping the other workers");
        report_failure(str_cat("rank ", w.rank), w.code);
        stop_all(SIGTERM);
      } else if (w.code != 0 && !failure) {
        failure = w.code;
      }
    }

    if (link.client != nullptr && !failure && !published && Clock::now() >= link.next_check) {
      link.next_check = Clock::now() + milliseconds(200);
      try {
        const std::vector<std::string> key = {link.prefix + "failure"};
        if (link.client->check(key)) {
          const std::string what = link.client->get(key[0], milliseconds(1000));
          const int code = std::atoi(what.c_str());
          say("failure on another node (", what.substr(what.find(' ') + 1), ", code ", code,
              "); stopping the workers");
          failure = code != 0 ? code : 1;
          stop_all(SIGTERM);
        }
      } catch (const UnavailableError& e) {
        say("lost the coordination service: ", e.what(), "; stopping the workers");
        lost_service = true;
        failure = 1;
        stop_all(SIGTERM);
      }
    }

    if (kill_at && Clock::now() >= *kill_at) {
      for (auto& w : workers) {
        if (w.running) {
          say("rank ", w.rank, " (pid ", w.pid,
              ") still running after the grace period; killing it");
          ::kill(-w.pid, SIGKILL);
        }
      }
      kill_at = Clock::now() + std::chrono::hours(24);  // once
    }
  }
  for (auto& w : workers) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd >= 0) {  // a process of the worker's group outlived it and holds the pipe
        emit_lines(*s, w.prefix, true);
        ::close(s->fd);
        s->fd = -1;
        ::kill(-w.pid, SIGKILL);
      }
    }
  }
  if (lost_service && link.client != nullptr) {
    throw UnavailableError(
        str_cat("launch: lost the coordination service at ", link.client->address()));
  }
  if (failure) return *failure;
  if (received_signal != 0) return 128 + received_signal;
  return 0;
}

// ---- the command ----------------------------------------------------------------------------

bool is_store_url(const std::string& rdzv) { return rdzv.find("://") != std::string::npos; }

int run_launch() {
  DTRAIN_CHECK(flags.nproc_per_node >= 1, "launch: --nproc-per-node must be >= 1, got ",
               flags.nproc_per_node);
  DTRAIN_CHECK(flags.nnodes >= 1, "launch: --nnodes must be >= 1, got ", flags.nnodes);
  DTRAIN_CHECK(flags.node_rank >= 0 && flags.node_rank < flags.nnodes, "launch: --node-rank ",
               flags.node_rank, " is not in [0, ", flags.nnodes, ")");
  DTRAIN_CHECK(!flags.command.empty(),
               "launch: no program to run (dtrain launch ... -- PROGRAM ARGS)");
  DTRAIN_CHECK(flags.rdzv != "coordinator" || flags.nnodes == 1, "launch: with --nnodes ",
               flags.nnodes,
               ", --rdzv must be host:port of node 0 (where it hosts the coordination service), "
               "file:///shared/dir or redis://host:port");
  DTRAIN_CHECK(flags.rdzv_timeout_s > 0 && flags.grace_period_s >= 0,
               "launch: --rdzv-timeout must be > 0 and --grace-period >= 0");
  const auto rdzv_timeout = milliseconds(static_cast<int64_t>(flags.rdzv_timeout_s * 1000));
  const auto grace = milliseconds(static_cast<int64_t>(flags.grace_period_s * 1000));

  // The coordination service: hosted here (single node, or node 0 of host:port), joined by
  // every node of a host:port job, absent for multi-node jobs on a store URL.
  std::unique_ptr<dist::CoordinationServer> server;
  std::unique_ptr<dist::CoordinationClient> client;
  std::string service;  // host:port workers connect to
  const bool store_url = is_store_url(flags.rdzv);
  if (flags.rdzv == "coordinator" || (store_url && flags.nnodes == 1)) {
    server = std::make_unique<dist::CoordinationServer>(
        dist::CoordinationServerOptions{.address = "127.0.0.1:0"});
    service = server->address();
  } else if (!store_url) {
    dist::parse_host_port(flags.rdzv, "launch: --rdzv");  // a usage error before anything else
    service = flags.rdzv;
    if (flags.node_rank == 0) {
      server = std::make_unique<dist::CoordinationServer>(
          dist::CoordinationServerOptions{.address = flags.rdzv});
      say("coordination service listening on ", server->address());
    }
  }

  dist::LauncherEnv env{.local_world_size = flags.nproc_per_node,
                        .node_rank = flags.node_rank,
                        .nnodes = flags.nnodes,
                        .rdzv = store_url ? flags.rdzv : service,
                        .generation = 1,
                        .run_id = flags.run_id};
  if (!service.empty()) env.master = dist::parse_host_port(service, "coordination service");
  int rank_offset = flags.node_rank * flags.nproc_per_node;
  int world_size = flags.nnodes * flags.nproc_per_node;
  JobLink link{.node_rank = flags.node_rank};
  if (!service.empty()) {
    client = std::make_unique<dist::CoordinationClient>(
        service, dist::CoordinationClientOptions{.connect_timeout = rdzv_timeout});
    // Node-level rendezvous: every node's launcher joins; nodes may run different numbers of
    // workers, so global ranks follow node order.
    const dist::Membership m =
        client->join(str_cat("node-", flags.node_rank), flags.nnodes, rdzv_timeout);
    env.generation = m.generation;
    link.prefix = str_cat("dtrain/", flags.run_id, "/launch/g", m.generation, "/");
    client->set(str_cat(link.prefix, "nproc/", flags.node_rank),
                std::to_string(flags.nproc_per_node));
    rank_offset = 0;
    world_size = 0;
    for (int node = 0; node < flags.nnodes; ++node) {
      const int n = std::stoi(client->get(str_cat(link.prefix, "nproc/", node), rdzv_timeout));
      if (node < flags.node_rank) rank_offset += n;
      world_size += n;
    }
    if (flags.nnodes > 1) link.client = client.get();
  }
  env.world_size = world_size;

  SignalRelay signals;
  std::vector<Worker> workers(flags.nproc_per_node);
  for (int local = 0; local < flags.nproc_per_node; ++local) {
    Worker& w = workers[local];
    w.rank = rank_offset + local;
    w.prefix = str_cat("[rank ", w.rank, "] ");
    dist::LauncherEnv we = env;
    we.rank = w.rank;
    we.local_rank = local;
    try {
      spawn(w, flags.command, worker_environment(we));
    } catch (...) {
      for (auto& started : workers) {
        if (started.running) {
          ::kill(-started.pid, SIGKILL);
          ::waitpid(started.pid, nullptr, 0);
          ::close(started.out.fd);
          ::close(started.err.fd);
        }
      }
      throw;
    }
  }
  const int code = supervise(workers, signals, link, grace);

  if (client != nullptr && flags.nnodes > 1) {
    // The service must outlive every node's workers: node 0 waits for the others to finish.
    try {
      client->set(str_cat(link.prefix, "done/", flags.node_rank), std::to_string(code));
      if (server != nullptr) {
        std::vector<std::string> done;
        for (int node = 0; node < flags.nnodes; ++node) {
          done.push_back(str_cat(link.prefix, "done/", node));
        }
        client->wait(done, rdzv_timeout);
      }
    } catch (const Error& e) {
      say("while finishing: ", e.what());
    }
  }
  return code;
}

}  // namespace

void add_launch_command(CLI::App& app, std::function<int()>& run) {
  CLI::App* cmd =
      app.add_subcommand("launch",
                         "Start the worker processes of a job on this node, like torchrun "
                         "(dtrain launch --nproc-per-node N -- PROGRAM ARGS...)");
  cmd->add_option("--nproc-per-node", flags.nproc_per_node, "Worker processes on this node")
      ->capture_default_str();
  cmd->add_option("--nnodes", flags.nnodes, "Nodes in the job")->capture_default_str();
  cmd->add_option("--node-rank", flags.node_rank, "Index of this node, 0 .. nnodes-1")
      ->capture_default_str();
  cmd->add_option("--rdzv", flags.rdzv,
                  "Rendezvous: 'coordinator' (a service inside this launcher; one node), "
                  "host:port (node 0 hosts the service there, the others join it), "
                  "file:///shared/dir or redis://host:port (workers' Gloo store)")
      ->capture_default_str();
  cmd->add_option("--rdzv-timeout", flags.rdzv_timeout_s,
                  "Seconds to wait for the service and for every node to arrive")
      ->capture_default_str();
  cmd->add_option("--grace-period", flags.grace_period_s,
                  "Seconds between SIGTERM and SIGKILL when stopping workers")
      ->capture_default_str();
  cmd->add_option("--run-id", flags.run_id, "Job id, separates jobs that share a store")
      ->capture_default_str();
  cmd->add_option("command", flags.command, "PROGRAM ARGS... (after --)")->required();
  cmd->callback([&run] { run = run_launch; });
}

}  // namespace dtrain::cli
