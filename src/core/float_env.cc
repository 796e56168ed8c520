// The process's flush-denormals setting, the per-thread control register, and OpenBLAS's pool.
#include "dtrain/core/float_env.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "dtrain/core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace dtrain {
namespace {

constexpr const char* kEnvVar = "DTRAIN_FLUSH_DENORMALS";

// DTRAIN_FLUSH_DENORMALS, parsed once.
struct EnvSetting {
  bool valid = true;
  bool on = true;
  std::string error;  // when !valid
};

const EnvSetting& env_setting() {
  static const EnvSetting setting = [] {
    EnvSetting s;
    const char* raw = std::getenv(kEnvVar);
    if (raw == nullptr) return s;
    std::string v = raw;
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v.empty() || v == "1" || v == "on" || v == "true" || v == "yes") return s;
    if (v == "0" || v == "off" || v == "false" || v == "no") {
      s.on = false;
      return s;
    }
    s.valid = false;
    s.error = str_cat(kEnvVar, "=\"", raw,
                      "\" is not a valid setting: use 1 (flush denormals to zero, the default) or "
                      "0 (exact IEEE subnormals)");
    return s;
  }();
  return setting;
}

// set_flush_denormals()'s value: -1 (none: the environment's), 0 or 1.
std::atomic<int> g_override{-1};

// -1: unknown (DTRAIN_FLUSH_DENORMALS is malformed), 0 or 1.
int process_setting() noexcept {
  const int o = g_override.load(std::memory_order_acquire);
  if (o >= 0) return o;
  const EnvSetting& env = env_setting();
  return env.valid ? static_cast<int>(env.on) : -1;
}

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFlushBits = 0x8000u /* FTZ */ | 0x0040u /* DAZ */;
#elif defined(__aarch64__)
constexpr uint64_t kFlushBits = uint64_t{1} << 24;  // FPCR.FZ: inputs and results, fp32/fp64
uint64_t read_fpcr() {
  uint64_t v;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
  return v;
}
void write_fpcr(uint64_t v) { __asm__ __volatile__("msr fpcr, %0" : : "r"(v)); }
#endif

// OpenBLAS (pthreads build) starts its worker pool in its own load-time constructor, before any
// dtrain code runs, so the workers carry the hardware's default register. Its exported
// blas_thread_shutdown_ (what it runs before fork) and blas_thread_init re-create the pool from
// the calling thread, and new threads inherit their creator's register. Looked up at run time:
// core does not link BLAS, and a process with another BLAS (or OpenBLAS's OpenMP build) has no
// such pool to fix.
std::mutex g_blas_mu;
int g_blas_pool_setting = 0;  // the setting OpenBLAS's current pool was created with; g_blas_mu

void recreate_blas_pool(bool on) {
  std::lock_guard<std::mutex> lock(g_blas_mu);
  if (g_blas_pool_setting == static_cast<int>(on)) return;
  using Fn = int (*)();
  auto shutdown = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "blas_thread_init"));
  auto* available = static_cast<int*>(dlsym(RTLD_DEFAULT, "blas_server_avail"));
  if (shutdown == nullptr || init == nullptr || available == nullptr) return;
  g_blas_pool_setting = static_cast<int>(on);
  // A pool that is not running yet starts lazily from the thread of the first threaded BLAS
  // call, which follows the setting itself.
  if (*available == 0) return;
  shutdown();
  init();
}

}  // namespace

bool flush_denormals_enabled() {
  const int s = process_setting();
  if (s < 0) throw InvalidArgumentError(env_setting().error);
  return s == 1;
}

void set_flush_denormals(bool on) {
  g_override.store(static_cast<int>(on), std::memory_order_release);
  set_thread_flush_denormals(on);
  recreate_blas_pool(on);
}

ScopedFlushDenormals::ScopedFlushDenormals(bool on) : previous_(flush_denormals_enabled()) {
  set_flush_denormals(on);
}

ScopedFlushDenormals::~ScopedFlushDenormals() { set_flush_denormals(previous_); }

bool thread_flushes_denormals() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#elif defined(__aarch64__)
  return (read_fpcr() & kFlushBits) != 0;
#else
  return false;
#endif
}

void set_thread_flush_denormals(bool on) {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = _mm_getcsr();
  const unsigned want = on ? (csr | kFlushBits) : (csr & ~kFlushBits);
  if (want != csr) _mm_setcsr(want);
#elif defined(__aarch64__)
  const uint64_t fpcr = read_fpcr();
  const uint64_t want = on ? (fpcr | kFlushBits) : (fpcr & ~kFlushBits);
  if (want != fpcr) write_fpcr(want);
#else
  (void)on;
#endif
}

void follow_flush_denormals() noexcept {
  const int s = process_setting();
  if (s >= 0) set_thread_flush_denormals(s == 1);
}

}  // namespace dtrain

// Runs when the program (or the library holding this object) loads, on the main thread, before
// main(): the main thread and OpenBLAS's pool start with the process setting. Every target that
// links dtrain_core keeps this object (the link option in src/core/CMakeLists.txt), whether or
// not the program calls anything in it. A malformed DTRAIN_FLUSH_DENORMALS changes nothing here;
// the first flush_denormals_enabled() call (a strategy, a thread pool, the first GEMM) throws.
extern "C" __attribute__((constructor)) void dtrain_float_env_init() {
  const int s = dtrain::process_setting();
  if (s != 1) return;
  dtrain::set_thread_flush_denormals(true);
  dtrain::recreate_blas_pool(true);
}
