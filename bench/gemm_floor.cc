// The compute floor of the MLP workload: the five GEMMs of one training step (batch 64,
// 784-128-10, Keras kernel orientation [in, out]) timed alone for 938 steps, i.e. one epoch.
// Also prints which OpenBLAS kernel set and build are in use, and the flush-denormals setting
// (the GEMM inputs here are normal floats: the floor does not depend on it).
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dtrain/core/float_env.h"
#include "dtrain/ops/gemm.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  dtrain::ops::set_num_threads(threads);
  const int b = 64, in = 784, hid = 128, out = 10, steps = 938;
  std::vector<float> x(b * in, 0.5f), w1(in * hid, 0.01f), h(b * hid), w2(hid * out, 0.01f),
      y(b * out), dy(b * out, 0.1f), dw2(hid * out), dh(b * hid), dw1(in * hid);
  using dtrain::ops::gemm;
  auto step = [&] {
    gemm(false, false, b, hid, in, 1, x.data(), in, w1.data(), hid, 0, h.data(), hid);    // x·W1
    gemm(false, false, b, out, hid, 1, h.data(), hid, w2.data(), out, 0, y.data(), out);  // h·W2
    gemm(true, false, hid, out, b, 1, h.data(), hid, dy.data(), out, 0, dw2.data(), out);  // hᵀ·dy
    gemm(false, true, b, hid, out, 1, dy.data(), out, w2.data(), out, 0, dh.data(), hid);  // dy·W2ᵀ
    gemm(true, false, in, hid, b, 1, x.data(), in, dh.data(), hid, 0, dw1.data(), hid);  // xᵀ·dh
  };
  for (int i = 0; i < 50; ++i) step();
  double best = 1e9;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  std::printf("openblas_core %s\n", openblas_get_corename());
  std::printf("openblas_config %s\n", openblas_get_config());
  std::printf("flush_denormals %d\n", dtrain::flush_denormals_enabled() ? 1 : 0);
  std::printf("gemm_epoch_seconds %.4f\n", best);
  std::printf("gemm_gflops %.1f\n", 24.55e9 / best / 1e9 * (1.0 + 0.0));
  return 0;
}
