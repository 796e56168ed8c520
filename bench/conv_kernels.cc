// The convolution-kernel decision (docs/decisions.md): the built-in CNN's two conv layers, batch
// 64, one thread, timed side by side in one process: dtrain's im2col + OpenBLAS kernels
// (ops/convolution.h) against oneDNN 2.x (libdnnl-dev) primitives on the same NHWC/HWIO
// layouts, and on oneDNN's own blocked layouts (format_tag::any, reorders not counted: its
// best case), dtrain's default backend (ops::ConvBackend::kOnednn) as dtrain_fast, and its
// default algorithm choice (Winograd F(4x4, 3x3) for conv2, ops::ConvAlgo::kAuto) as dtrain_auto.
// Forward, backward-data and backward-weights: thread CPU time per call, best of `rounds` rounds
// of `reps` calls. Run with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1:
//   bench_conv_kernels [reps] [rounds]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/ops/convolution.h"
#include "dtrain/ops/gemm.h"

using namespace dtrain;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

namespace {

// This thread's CPU time, so that a loaded, shared machine (other processes taking the core
// between calls) changes the result less than wall time would. Both libraries run on the
// calling thread with one thread.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double best_ms(const std::function<void()>& f, int reps, int rounds) {
  f();
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = thread_cpu_ms();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, (thread_cpu_ms() - t0) / reps);
  }
  return best;
}

Tensor random_tensor(const Shape& s, uint64_t seed) {
  Philox rng(seed);
  Tensor t(s);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = rng.uniform(-1.0f, 1.0f);
  return t;
}

struct Layer {
  const char* name;
  int64_t n, h, w, c, k, o;
};

void run(const Layer& l, bool any_layout, int reps, int rounds) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const int64_t oh = l.h - l.k + 1, ow = l.w - l.k + 1;
  const dnnl::memory::dims src_d{l.n, l.c, l.h, l.w}, wei_d{l.o, l.c, l.k, l.k}, bia_d{l.o},
      dst_d{l.n, l.o, oh, ow}, strides{1, 1}, pad{0, 0};
  auto md = [&](const dnnl::memory::dims& d, tag t) {
    return dnnl::memory::desc(d, dt::f32, any_layout ? tag::any : t);
  };
  const bool any_weights = std::getenv("CONV_ANY_WEIGHTS") != nullptr;
  const auto src_md = md(src_d, tag::nhwc),
             wei_md =
                 any_weights ? dnnl::memory::desc(wei_d, dt::f32, tag::any) : md(wei_d, tag::hwio),
             dst_md = md(dst_d, tag::nhwc);
  const auto bia_md = dnnl::memory::desc(bia_d, dt::f32, tag::x);
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, src_md, wei_md, bia_md,
                                      dst_md, strides, pad, pad),
      eng);
  dnnl::convolution_backward_data::primitive_desc bwd_d_pd(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md, wei_md,
                                            dst_md, strides, pad, pad),
      eng, fwd_pd);
  dnnl::convolution_backward_weights::primitive_desc bwd_w_pd(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md, wei_md,
                                               bia_md, dst_md, strides, pad, pad),
      eng, fwd_pd);
  dnnl::memory src(fwd_pd.src_desc(), eng), wei(fwd_pd.weights_desc(), eng),
      bia(fwd_pd.bias_desc(), eng), dst(fwd_pd.dst_desc(), eng),
      dsrc(bwd_d_pd.diff_src_desc(), eng), ddst(bwd_w_pd.diff_dst_desc(), eng),
      dwei(bwd_w_pd.diff_weights_desc(), eng), dbia(bwd_w_pd.diff_bias_desc(), eng);
  for (dnnl::memory* m : {&src, &wei, &bia, &ddst}) {
    float* p = static_cast<float*>(m->get_data_handle());
    const size_t count = m->get_desc().get_size() / sizeof(float);
    for (size_t i = 0; i < count; ++i) p[i] = 0.001f * static_cast<float>(i % 997);
  }
  dnnl::convolution_forward fwd(fwd_pd);
  dnnl::convolution_backward_data bwd_d(bwd_d_pd);
  dnnl::convolution_backward_weights bwd_w(bwd_w_pd);
  const double f_ms = best_ms(
      [&] {
        fwd.execute(strm, {{DNNL_ARG_SRC, src},
                           {DNNL_ARG_WEIGHTS, wei},
                           {DNNL_ARG_BIAS, bia},
                           {DNNL_ARG_DST, dst}});
        strm.wait();
      },
      reps, rounds);
  const double d_ms = best_ms(
      [&] {
        bwd_d.execute(
            strm, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}});
        strm.wait();
      },
      reps, rounds);
  const double w_ms = best_ms(
      [&] {
        bwd_w.execute(strm, {{DNNL_ARG_SRC, src},
                             {DNNL_ARG_DIFF_DST, ddst},
                             {DNNL_ARG_DIFF_WEIGHTS, dwei},
                             {DNNL_ARG_DIFF_BIAS, dbia}});
        strm.wait();
      },
      reps, rounds);
  std::printf("%s onednn_%s implementations %s / %s / %s\n", l.name,
              any_layout ? "blocked" : "nhwc", fwd_pd.impl_info_str(), bwd_d_pd.impl_info_str(),
              bwd_w_pd.impl_info_str());
  std::printf("%s onednn_%s forward_ms %.3f backward_data_ms %.3f backward_weights_ms %.3f\n",
              l.name, any_layout ? "blocked" : "nhwc", f_ms, d_ms, w_ms);
}

// dtrain's kernels on `backend` (ops::set_conv_backend: the same calls autograd makes), with the
// direct algorithm or Winograd where it applies (ops::set_conv_algo; conv2 only).
void run_dtrain(const Layer& l, ops::ConvBackend backend, int reps, int rounds,
                ops::ConvAlgo algo = ops::ConvAlgo::kDirect) {
  ops::set_conv_backend(backend);
  ops::set_conv_algo(algo);
  const Tensor x = random_tensor(Shape{l.n, l.h, l.w, l.c}, 1);
  const Tensor w = random_tensor(Shape{l.k, l.k, l.c, l.o}, 2);
  const Tensor b = random_tensor(Shape{l.o}, 3);
  const ops::Conv2DAttrs a{};
  const Tensor dy = random_tensor(ops::conv2d(x, w, b, a).shape(), 4);
  const double f_ms = best_ms([&] { (void)ops::conv2d(x, w, b, a); }, reps, rounds);
  const double d_ms =
      best_ms([&] { (void)ops::conv2d_backward_input(dy, w, x.shape(), a); }, reps, rounds);
  const double w_ms =
      best_ms([&] { (void)ops::conv2d_backward_filter(x, dy, w.shape(), a); }, reps, rounds);
  const char* name = algo == ops::ConvAlgo::kAuto           ? "auto"
                     : backend == ops::ConvBackend::kIm2col ? "im2col"
                                                            : "fast";
  std::printf("%s dtrain_%s forward_ms %.3f backward_data_ms %.3f backward_weights_ms %.3f\n",
              l.name, name, f_ms, d_ms, w_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  ops::set_num_threads(1);
  const Layer layers[] = {{"conv1", 64, 28, 28, 1, 3, 32}, {"conv2", 64, 13, 13, 32, 3, 64}};
  // Interleaved, so that machine noise hits both alike.
  for (const Layer& l : layers) {
    run_dtrain(l, ops::ConvBackend::kIm2col, reps, rounds);
    run_dtrain(l, ops::ConvBackend::kOnednn, reps, rounds);
    run_dtrain(l, ops::ConvBackend::kOnednn, reps, rounds, ops::ConvAlgo::kAuto);
    run(l, false, reps, rounds);
    run(l, true, reps, rounds);
    run_dtrain(l, ops::ConvBackend::kOnednn, reps, rounds, ops::ConvAlgo::kAuto);
    run_dtrain(l, ops::ConvBackend::kOnednn, reps, rounds);
    run_dtrain(l, ops::ConvBackend::kIm2col, reps, rounds);
  }
  return 0;
}
