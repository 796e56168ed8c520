// dtrain launch --ps N --workers M -- PROGRAM ARGS: starts a whole ParameterServerStrategy job
// on this machine for a demo or a test — N `dtrain ps` servers, M workers and the chief (both
// running PROGRAM), each with the TF_CONFIG a TFJob would give it (ports on 127.0.0.1) — prefixes
// their output ("[ps 0] ", "[worker 1] ", "[chief] "), forwards signals, restarts a server or a
// worker that dies (up to --max-restarts, on the same address: the chief restores servers from
// its checkpoint and reschedules a dead worker's steps), and exits with the chief's code.
// Single-threaded (one poll loop).
#include "dtrain/fault/launch_ps.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "dtrain/core/error.h"
#include "fault/process_limits.h"
#include "fault/worker_process.h"

namespace dtrain::fault {
namespace {

int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  DTRAIN_INTERNAL_CHECK(s >= 0, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  DTRAIN_INTERNAL_CHECK(ok == 0, "bind to a free port");
  return ntohs(a.sin_port);
}

struct Task {
  std::string type;  // "ps", "worker", "chief"
  int index = 0;
  int port = 0;
  std::string prefix = {};
  std::vector<std::string> command = {};
  Process process = {};
  bool exited = false;
  int restarts = 0;
};

std::string address_list(const std::vector<Task>& tasks, const std::string& type) {
  std::string s;
  for (const Task& t : tasks) {
    if (t.type != type) continue;
    s += (s.empty() ? "\"127.0.0.1:" : ", \"127.0.0.1:") + std::to_string(t.port) + "\"";
  }
  return s;
}

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("dtrain");
}

void start(Task& t, const std::string& cluster) {
  const std::string tf_config = "{\"cluster\": " + cluster + ", \"task\": {\"type\": \"" + t.type +
                                "\", \"index\": " + std::to_string(t.index) + "}}";
  // The job's own TF_CONFIG wins over the launcher's and over any dtrain launch variables.
  const std::vector<std::string> env = environment_with(
      {"TF_CONFIG", "DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_RDZV"}, {"TF_CONFIG=" + tf_config});
  t.process = spawn_process(t.command, env, t.prefix);
  t.exited = false;
}

void stop_all(std::vector<Task>& tasks, double grace_s) {
  for (Task& t : tasks) {
    if (!t.exited && t.process.pid > 0) kill(-t.process.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
  for (Task& t : tasks) {
    while (!t.exited && t.process.pid > 0) {
      int status = 0;
      const pid_t r = waitpid(t.process.pid, &status, WNOHANG);
      if (r == t.process.pid) {
        t.exited = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-t.process.pid, SIGKILL);
        waitpid(t.process.pid, &status, 0);
        t.exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    close_stream(t.process.out, t.prefix);
    close_stream(t.process.err, t.prefix);
  }
}

}  // namespace

int run_launch_ps(const LaunchPsOptions& o) {
  DTRAIN_CHECK(o.ps >= 1, "launch: --ps must be >= 1 (parameter servers), got ", o.ps);
  DTRAIN_CHECK(o.workers >= 0, "launch: --workers must be >= 0, got ", o.workers);
  DTRAIN_CHECK(o.max_restarts >= 0, "launch: --max-restarts must be >= 0, got ", o.max_restarts);
  DTRAIN_CHECK(std::isfinite(o.grace_period_s) && o.grace_period_s >= 0 &&
                   o.grace_period_s <= 365.0 * 24 * 3600,
               "launch: --grace-period ", o.grace_period_s,
               " must be >= 0 and at most a year of seconds");
  DTRAIN_CHECK(!o.command.empty(), "launch: no program given after --");
  check_process_count(static_cast<long long>(o.ps) + o.workers + 1,
                      str_cat("--ps ", o.ps, " --workers ", o.workers));
  std::vector<Task> tasks;
  for (int i = 0; i < o.ps; ++i) {
    Task t{
        .type = "ps", .index = i, .port = free_port(), .prefix = "[ps " + std::to_string(i) + "] "};
    t.command = {self_exe(), "ps", "--host", "127.0.0.1", "--port", std::to_string(t.port)};
    tasks.push_back(std::move(t));
  }
  for (int i = 0; i < o.workers; ++i) {
    Task t{.type = "worker",
           .index = i,
           .port = free_port(),
           .prefix = "[worker " + std::to_string(i) + "] "};
    t.command = o.command;
    tasks.push_back(std::move(t));
  }
  Task chief{.type = "chief", .index = 0, .port = free_port(), .prefix = "[chief] "};
  chief.command = o.command;
  tasks.push_back(std::move(chief));
  const std::string cluster = "{\"chief\": [" + address_list(tasks, "chief") + "], \"worker\": [" +
                              address_list(tasks, "worker") + "], \"ps\": [" +
                              address_list(tasks, "ps") + "]}";
  SignalRelay signals;
  for (Task& t : tasks) start(t, cluster);
  say("parameter-server job: ", o.ps, " ps, ", o.workers, " workers and a chief; cluster ",
      cluster);

  for (;;) {
    // Poll the signal pipe and every open output pipe; read only those that are ready (the
    // pipes block).
    std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    std::vector<const std::string*> prefixes{nullptr};
    for (Task& t : tasks) {
      for (Stream* st : {&t.process.out, &t.process.err}) {
        if (st->fd < 0) continue;
        fds.push_back({st->fd, POLLIN, 0});
        streams.push_back(st);
        prefixes.push_back(&t.prefix);
      }
    }
    poll(fds.data(), fds.size(), 100);
    for (int sig : signals.take()) {
      for (Task& t : tasks) {
        if (!t.exited && t.process.pid > 0) kill(-t.process.pid, sig);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) pump(*streams[i], *prefixes[i]);
    }
    for (Task& t : tasks) {
      if (t.exited || t.process.pid <= 0) continue;
      int status = 0;
      if (waitpid(t.process.pid, &status, WNOHANG) != t.process.pid) continue;
      t.exited = true;
      close_stream(t.process.out, t.prefix);
      close_stream(t.process.err, t.prefix);
      const int code = exit_code_of(status);
      if (t.type == "chief") {
        say("the chief exited with code ", code, "; stopping the job");
        stop_all(tasks, o.grace_period_s);
        return code;
      }
      if (code == 0) continue;  // a worker or server the chief shut down
      if (t.restarts >= o.max_restarts) {
        say(t.prefix, "exited with code ", code, "; no restarts left (--max-restarts ",
            o.max_restarts, "); stopping the job");
        stop_all(tasks, o.grace_period_s);
        return code;
      }
      ++t.restarts;
      say(t.prefix, "exited with code ", code, "; restarting it on 127.0.0.1:", t.port,
          " (restart ", t.restarts, " of ", o.max_restarts, ")");
      start(t, cluster);
    }
  }
}

}  // namespace dtrain::fault
