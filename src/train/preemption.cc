// SIGTERM → an atomic flag that fit() polls at step boundaries.
#include "dtrain/train/preemption.h"

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::train {
namespace {
std::atomic<bool> g_requested{false};
std::atomic<bool> g_installed{false};

extern "C" void on_sigterm(int) { g_requested.store(true, std::memory_order_relaxed); }
}  // namespace

void install_preemption_handler() {
  if (g_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
}

bool preemption_requested() { return g_requested.load(std::memory_order_relaxed); }
void request_preemption() { g_requested.store(true, std::memory_order_relaxed); }
void clear_preemption_request() { g_requested.store(false, std::memory_order_relaxed); }

int preemption_exit_code() {
  const char* v = std::getenv("DTRAIN_PREEMPTION_EXIT_CODE");
  if (v == nullptr || *v == '\0') return 143;
  char* end = nullptr;
  const long code = std::strtol(v, &end, 10);
  DTRAIN_CHECK(end != v && *end == '\0' && code >= 1 && code <= 255,
               "DTRAIN_PREEMPTION_EXIT_CODE='", v, "': expected an exit code in [1, 255]");
  return static_cast<int>(code);
}

}  // namespace dtrain::train
