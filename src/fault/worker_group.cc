// The worker group (see worker_group.h): spawn, output, signals, reaping.
#include "fault/worker_group.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::fault {

void WorkerGroup::start(const std::vector<std::string>& command, const std::vector<int>& slots,
                        int rank_offset, const Environment& environment, const Take& take) {
  workers_.assign(slots.size(), Worker{});
  const auto now = Clock::now();
  for (size_t i = 0; i < slots.size(); ++i) {
    Worker& w = workers_[i];
    w.slot = slots[i];
    w.local_rank = static_cast<int>(i);
    w.rank = rank_offset + w.local_rank;
    w.prefix = str_cat("[rank ", w.rank, "] ");
    w.step_changed = now;
    try {
      std::optional<Process> taken = take ? take(w) : std::nullopt;
      const Process p =
          taken ? *taken : spawn_process(command, environment(w), str_cat("rank ", w.rank));
      w.pid = p.pid;
      w.out = p.out;
      w.err = p.err;
      w.running = true;
    } catch (...) {
      for (auto& started : workers_) {
        if (started.running) {
          ::kill(-started.pid, SIGKILL);
          ::waitpid(started.pid, nullptr, 0);
          ::close(started.out.fd);
          ::close(started.err.fd);
          started.running = false;
        }
      }
      throw;
    }
  }
}

void WorkerGroup::respawn(Worker& w, const std::vector<std::string>& command, int64_t generation,
                          const Environment& environment) {
  DTRAIN_CHECK(!w.running, "launch: rank ", w.rank, " still runs; cannot start it again");
  adopt(w, spawn_process(command, environment(w), str_cat("rank ", w.rank)), generation);
}

void WorkerGroup::adopt(Worker& w, const Process& p, int64_t generation) {
  DTRAIN_CHECK(!w.running, "launch: rank ", w.rank, " still runs; cannot start it again");
  for (Stream* s : {&w.out, &w.err}) close_stream(*s, w.prefix);
  w.generation = generation;
  w.status = 0;
  w.code = 0;
  w.step.reset();
  w.step_changed = Clock::now();
  w.pid = p.pid;
  w.out = p.out;
  w.err = p.err;
  w.running = true;
}

void WorkerGroup::stop(milliseconds grace) {
  signal(SIGTERM);
  const auto kill_at = Clock::now() + grace;
  while (any_running()) {
    pump_output(-1, milliseconds(20));
    reap();
    if (Clock::now() >= kill_at) {
      kill_stragglers();
      for (auto& w : workers_) {
        if (!w.running) continue;
        ::waitpid(w.pid, &w.status, 0);
        w.running = false;
        w.code = exit_code_of(w.status);
      }
    }
  }
  for (auto& w : workers_) {
    for (Stream* s : {&w.out, &w.err}) close_stream(*s, w.prefix);
  }
}

bool WorkerGroup::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

bool WorkerGroup::output_open() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const Worker& w) { return w.out.fd >= 0 || w.err.fd >= 0; });
}

void WorkerGroup::pump_output(int wake_fd, milliseconds timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Stream*, const Worker*>> streams;
  fds.push_back({.fd = wake_fd, .events = POLLIN, .revents = 0});
  for (auto& w : workers_) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd >= 0) {
        fds.push_back({.fd = s->fd, .events = POLLIN, .revents = 0});
        streams.emplace_back(s, &w);
      }
    }
  }
  ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  for (size_t i = 1; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    pump(*streams[i - 1].first, streams[i - 1].second->prefix);
  }
}

std::vector<Worker*> WorkerGroup::reap() {
  std::vector<Worker*> reaped;
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.running = false;
    w.status = status;
    w.code = exit_code_of(status);
    reaped.push_back(&w);
  }
  return reaped;
}

bool WorkerGroup::await_exit(Worker& w, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (w.running) {
    int status = 0;
    if (::waitpid(w.pid, &status, WNOHANG) == w.pid) {
      w.running = false;
      w.status = status;
      w.code = exit_code_of(status);
      return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

void WorkerGroup::signal(int sig) {
  for (auto& w : workers_) {
    if (w.running) ::kill(-w.pid, sig);
  }
}

void WorkerGroup::kill_stragglers() {
  for (auto& w : workers_) {
    if (w.running) {
      say("rank ", w.rank, " (pid ", w.pid, ") still running after the grace period; killing it");
      ::kill(-w.pid, SIGKILL);
    }
  }
}

void WorkerGroup::close_output() {
  for (auto& w : workers_) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd >= 0) {  // a process of the worker's group outlived it and holds the pipe
        close_stream(*s, w.prefix);
        ::kill(-w.pid, SIGKILL);
      }
    }
  }
}

int WorkerGroup::first_nonzero_code() const {
  for (const auto& w : workers_) {
    if (w.code != 0) return w.code;
  }
  return 0;
}

}  // namespace dtrain::fault
