// The GPT step's dense products (B·T = 4096 rows, d = 128, 4d = 512, vocabulary 113) through
// ops::gemm (OpenBLAS, fixed row blocks) and ops::dense_gemm (packed panels), one thread, CPU
// time per call (best of rounds), printed as "shape gflops_openblas gflops_dense max_rel_diff".
// Usage: bench_dense_gemm [reps] [cold]: with cold = 1, 2 MB are written before every call so
// the operands come from L3 as in the step (where each product's inputs were written by other
// kernels since); "step_ms" weights each shape by how often the 4-block step runs it.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dtrain/ops/gemm.h"

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Shape {
  const char* name;
  bool ta, tb;
  int64_t m, n, k;
  int per_step;  // in the 4-block step: Q, K, V and the output projection per block, ...
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const bool cold = argc > 2 && std::atoi(argv[2]) != 0;
  std::vector<float> junk(cold ? 1 << 19 : 0);
  dtrain::ops::set_num_threads(1);
  const Shape shapes[] = {
      {"fwd_qkv_4096x128x128", false, false, 4096, 128, 128, 16},
      {"fwd_up_4096x512x128", false, false, 4096, 512, 128, 4},
      {"fwd_down_4096x128x512", false, false, 4096, 128, 512, 4},
      {"fwd_head_4096x113x128", false, false, 4096, 113, 128, 1},
      {"dx_up_4096x128x512_NT", false, true, 4096, 128, 512, 4},
      {"dx_down_4096x512x128_NT", false, true, 4096, 512, 128, 4},
      {"dx_qkv_4096x128x128_NT", false, true, 4096, 128, 128, 16},
      {"dx_head_4096x128x113_NT", false, true, 4096, 128, 113, 1},
      {"dW_up_128x512x4096_TN", true, false, 128, 512, 4096, 4},
      {"dW_down_512x128x4096_TN", true, false, 512, 128, 4096, 4},
      {"dW_qkv_128x128x4096_TN", true, false, 128, 128, 4096, 16},
      {"dW_head_128x113x4096_TN", true, false, 128, 113, 4096, 1},
  };
  double total_blas = 0, total_dense = 0, step_blas = 0, step_dense = 0;
  for (const Shape& s : shapes) {
    std::vector<float> a(s.m * s.k), b(s.k * s.n), c1(s.m * s.n), c2(s.m * s.n);
    for (float& v : a) v = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
    for (float& v : b) v = static_cast<float>(std::rand()) / RAND_MAX - 0.5f;
    const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    auto blas = [&] {
      dtrain::ops::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                        c1.data(), s.n);
    };
    auto dense = [&] {
      dtrain::ops::dense_gemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, nullptr,
                              c2.data(), s.n);
    };
    blas();
    dense();
    double tb = 1e30, td = 1e30;
    // CPU time per call; with `cold`, the junk written first pushes the operands out of L2.
    auto timed = [&](auto&& product) {
      double total = 0;
      for (int r = 0; r < reps; ++r) {
        for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.0f;
        const double t0 = cpu_seconds();
        product();
        total += cpu_seconds() - t0;
      }
      return total / reps;
    };
    for (int round = 0; round < 3; ++round) {
      tb = std::min(tb, timed(blas));
      td = std::min(td, timed(dense));
    }
    double diff = 0, scale = 0;
    for (size_t i = 0; i < c1.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(c1[i] - c2[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(c1[i])));
    }
    const double flop = 2.0 * static_cast<double>(s.m * s.n * s.k);
    std::printf("%s %.1f %.1f %.2g\n", s.name, flop / tb * 1e-9, flop / td * 1e-9, diff / scale);
    total_blas += tb;
    total_dense += td;
    step_blas += tb * s.per_step;
    step_dense += td * s.per_step;
  }
  std::printf("total_ms %.3f %.3f\n", total_blas * 1e3, total_dense * 1e3);
  std::printf("step_ms %.3f %.3f\n", step_blas * 1e3, step_dense * 1e3);
  return 0;
}
