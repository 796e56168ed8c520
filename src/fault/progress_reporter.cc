// ProgressReporter: a sender thread that publishes the newest training step, and the
// coordination client's heartbeat thread. report() only stores an atomic. Thread-safe.
#include "dtrain/fault/progress_reporter.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/train/step_observer.h"

namespace dtrain::fault {
namespace {

using std::chrono::milliseconds;

// Seconds from variable `name` as milliseconds, or `fallback` when unset. Throws
// InvalidArgumentError naming the variable when it is not a non-negative number.
milliseconds seconds_from_env(const char* name, milliseconds fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !std::isfinite(s) || s < 0 || s > 1e6) {
    throw InvalidArgumentError(
        str_cat(name, "='", text, "' is not a number of seconds (>= 0, e.g. 0.5)"));
  }
  return milliseconds(static_cast<int64_t>(std::llround(s * 1000)));
}

std::mutex g_install_mu;
std::unique_ptr<ProgressReporter> g_installed;  // guarded by g_install_mu
bool g_install_tried = false;                   // guarded by g_install_mu

}  // namespace

std::string progress_key(int64_t generation, int rank) {
  return str_cat("progress/", generation, "/", rank);
}
std::string resumed_key(int64_t generation, int rank) {
  return str_cat("resumed/", generation, "/", rank);
}
std::string resumed_from_key(int64_t generation, int rank) {
  return str_cat("resumed_from/", generation, "/", rank);
}
std::string worker_heartbeat_task(int64_t generation, int rank) {
  return str_cat("worker/", generation, "/", rank);
}

ProgressReporter::ProgressReporter(const ProgressReporterOptions& options)
    : options_(options), key_(progress_key(options.generation, options.rank)) {
  DTRAIN_CHECK(!options.address.empty(), "ProgressReporter: no coordination service address");
  DTRAIN_CHECK(options.report_interval.count() > 0,
               "ProgressReporter: report_interval must be > 0, got ",
               options.report_interval.count(), " ms");
  distribute::CoordinationClientOptions co{
      .connect_timeout = options.connect_timeout,
      .rpc_timeout = std::chrono::seconds(2),
  };
  if (options.heartbeat_interval.count() > 0) {
    co.heartbeat_task = worker_heartbeat_task(options.generation, options.rank);
    co.heartbeat_interval = options.heartbeat_interval;
    co.heartbeat_timeout = std::max(options.heartbeat_timeout, options.heartbeat_interval);
    if (options.terminate_on_lost_service) {
      co.on_heartbeat_failure = [](const Error& e) {
        const std::string line = str_cat("dtrain: lost the launcher's coordination service (",
                                         e.what(), "); terminating this worker\n");
        [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
        ::kill(::getpid(), SIGTERM);
      };
    }
  }
  client_ = std::make_unique<distribute::CoordinationClient>(options.address, co);
  sender_ = std::thread([this] { send_loop(); });
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  sender_.join();
}

void ProgressReporter::send_loop() {
  // Wakes every kPoll, sends when the step changed and the last send is report_interval old,
  // so the first step goes out at once and later ones at most every report_interval.
  constexpr milliseconds kPoll(50);
  bool warned = false;
  auto last_send = std::chrono::steady_clock::now() - options_.report_interval;
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait_for(lock, std::min(kPoll, options_.report_interval),
                   [&] { return stop_ || !resumed_.empty(); });
    const bool last = stop_;
    std::vector<Resumed> resumed = std::exchange(resumed_, {});
    lock.unlock();
    for (const Resumed& r : resumed) {
      try {
        // resumed_from first: the launcher reads it once it sees resumed.
        if (!r.checkpoint.empty()) {
          client_->set(resumed_from_key(r.generation, options_.rank), r.checkpoint);
        }
        client_->set(resumed_key(r.generation, options_.rank), std::to_string(r.step));
      } catch (const Error& e) {
        if (!warned) {
          std::fprintf(stderr, "dtrain: cannot report progress to the launcher: %s\n", e.what());
          warned = true;
        }
      }
    }
    const int64_t step = step_.load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (step != sent_.load(std::memory_order_relaxed) &&
        (last || now - last_send >= options_.report_interval)) {
      last_send = now;
      try {
        client_->set(key_, std::to_string(step));
        sent_.store(step, std::memory_order_relaxed);
      } catch (const Error& e) {
        if (!warned) {
          std::fprintf(stderr, "dtrain: cannot report progress to the launcher: %s\n", e.what());
          warned = true;
        }
      }
    }
    if (last) return;
    lock.lock();
  }
}

void ProgressReporter::report_resumed(int64_t step, const std::string& checkpoint) {
  if (!checkpoint.empty()) {
    client_->set(resumed_from_key(options_.generation, options_.rank), checkpoint);
  }
  client_->set(resumed_key(options_.generation, options_.rank), std::to_string(step));
}

void ProgressReporter::queue_resumed(int64_t generation, int64_t step, std::string checkpoint) {
  {
    std::lock_guard lock(mu_);
    resumed_.push_back({generation, step, std::move(checkpoint)});
  }
  wake_.notify_all();
}

std::unique_ptr<ProgressReporter> ProgressReporter::from_environment() {
  if (!distribute::LauncherEnv::present()) return nullptr;
  const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
  if (!env.master) return nullptr;  // multi-node job on a file:// or redis:// store
  ProgressReporterOptions o{
      .address = env.master->to_string(),
      .generation = env.generation,
      .rank = env.rank,
      .report_interval = seconds_from_env(kEnvProgressInterval, milliseconds(100)),
      .heartbeat_interval = seconds_from_env(kEnvHeartbeatInterval, std::chrono::seconds(1)),
      .heartbeat_timeout = seconds_from_env(kEnvHeartbeatTimeout, std::chrono::seconds(10)),
  };
  if (o.report_interval.count() == 0) o.report_interval = milliseconds(100);
  if (o.heartbeat_timeout.count() == 0) o.heartbeat_timeout = std::chrono::hours(24 * 365);
  // Let the launcher's gdb read our stacks when we hang (Yama ptrace_scope 1 would refuse it).
  if (const char* launcher = std::getenv(kEnvLauncherPid)) {
    const long pid = std::strtol(launcher, nullptr, 10);
    if (pid > 0) ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(pid), 0, 0, 0);
  }
  return std::make_unique<ProgressReporter>(o);
}

ProgressReporter* install_progress_reporter() {
  std::lock_guard lock(g_install_mu);
  if (!g_install_tried) {
    g_installed = ProgressReporter::from_environment();  // may throw: then tried again later
    g_install_tried = true;
    if (g_installed) {
      ProgressReporter* r = g_installed.get();
      train::set_step_observer([r](int64_t step) { r->report(step); });
      train::set_resume_observer([r](int64_t generation, int64_t step, const std::string& ckpt) {
        r->queue_resumed(generation, step, ckpt);
      });
    }
  }
  return g_installed.get();
}

void uninstall_progress_reporter() {
  std::lock_guard lock(g_install_mu);
  if (g_installed) {
    train::set_step_observer({});
    train::set_resume_observer({});
  }
  g_installed.reset();
  g_install_tried = false;
}

}  // namespace dtrain::fault
