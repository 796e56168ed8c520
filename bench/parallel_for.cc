// The intra-op dispatch decision (docs/decisions.md): the cost of splitting one small kernel in
// two, on parallel_for (libgomp's team, the runtime oneDNN uses) against ThreadPool (the
// replicas' pool: mutex, condition variables, std::function), and of the same kernel inline.
// The kernel is a ReLU over N floats; each variant runs it `reps` times and prints ns per call
// (wall) and the process CPU time per call, as "key value" lines.
// Usage: bench_parallel_for [floats] [reps]
#include "dtrain/core/parallel_for.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dtrain/core/thread_pool.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void relu(float* x, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) x[i] = x[i] < 0.0f ? 0.0f : x[i];
}

template <class F>
void measure(const char* name, int reps, F&& call) {
  for (int i = 0; i < reps / 10 + 1; ++i) call();  // warm-up: teams started, caches warm
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) call();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  std::printf("%s_ns_per_call %.0f\n%s_cpu_ns_per_call %.0f\n", name, wall * 1e9 / reps, name,
              cpu * 1e9 / reps);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 65536;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20000;
  std::vector<float> x(static_cast<size_t>(n), -1.0f);
  float* p = x.data();
  std::printf("floats %lld\nreps %d\n", static_cast<long long>(n), reps);
  set_intra_op_threads(1);
  measure("inline", reps, [&] { relu(p, 0, n); });
  set_intra_op_threads(2);
  measure("openmp_team_2", reps,
          [&] { parallel_for(n, 16, [&](int64_t b, int64_t e) { relu(p, b, e); }); });
  ThreadPool pool(1);  // one worker + the caller: two threads
  measure("thread_pool_2", reps, [&] {
    pool.parallel_for(2, [&](int64_t part) { relu(p, part * (n / 2), part ? n : n / 2); });
  });
  return 0;
}
