// oneDNN 2.x (Debian's libdnnl, OpenMP runtime) convolutions on dtrain's own NHWC/HWIO buffers.
// The weights go through the layout oneDNN picks (reordered per call, they are small); the
// activations stay NHWC in place, or, where both channel counts are multiples of 8, go through
// oneDNN's blocked layout with a reorder on each side (blocked_activations). Primitives, their
// memory objects, reorders and staging buffers are cached per thread and per (direction,
// geometry, bias, thread count), the scratchpad is user-managed in a per-thread buffer that only
// grows, and each thread has its own stream; so once warm a step creates nothing. oneDNN's
// OpenMP team is sized to ops::num_threads() on every call (one thread when dtrain runs with one).
#include "convolution_onednn.h"

#include <omp.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtrain/ops/convolution.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::ops {

namespace {

std::atomic<int>& backend_flag() {
  static std::atomic<int> flag = [] {
    const char* env = std::getenv("DTRAIN_CONV");
    return (env != nullptr && std::strcmp(env, "im2col") == 0)
               ? static_cast<int>(ConvBackend::kIm2col)
               : static_cast<int>(ConvBackend::kOnednn);
  }();
  return flag;
}

std::atomic<int64_t> fast_calls{0};

}  // namespace

void set_conv_backend(ConvBackend b) { backend_flag().store(static_cast<int>(b)); }
ConvBackend conv_backend() { return static_cast<ConvBackend>(backend_flag().load()); }
int64_t fast_conv_calls() { return fast_calls.load(std::memory_order_relaxed); }

namespace detail {

bool onednn_enabled() { return conv_backend() == ConvBackend::kOnednn; }

namespace {

using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

enum Direction : int64_t { kForward = 0, kBackwardData = 1, kBackwardWeights = 2 };

using Key = std::array<int64_t, 20>;

// One argument of a primitive. `user` describes dtrain's buffer (its handle is set per call);
// when the primitive chose another layout, `inner` is a buffer of the entry in that layout and
// `reorder` copies user -> inner before the primitive (inputs) or inner -> user after it
// (outputs).
struct Arg {
  int id = 0;  // DNNL_ARG_*
  bool input = true;
  dnnl::memory user, inner;
  std::vector<float> buffer;
  dnnl::reorder reorder;
  bool staged = false;
};

struct Entry {
  dnnl::primitive prim;
  std::vector<Arg> args;  // in the order of execute()'s pointers: a, b, c, bias
  std::unordered_map<int, dnnl::memory> arg_map;
  size_t scratchpad_bytes = 0;
};

struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::vector<unsigned char> scratchpad;
  dnnl::memory scratchpad_memory;
  size_t scratchpad_capacity = 0;
};

// oneDNN's AVX-512 convolution kernels split their reductions (the backward-weights sums over the
// batch and the image) by the number of threads, so their bits change with the thread count; its
// AVX2 kernels' do not for any shape dtrain's tests train (ThreadCountBitwise caught this on an
// AVX-512 machine, where the same binary had passed on one without). dtrain promises the same bits
// for any thread count, so oneDNN is capped at AVX2 unless DNNL_MAX_CPU_ISA names another ISA.
// The cap must come before oneDNN's first primitive; if it cannot (oneDNN was used already), the
// library keeps its choice.
bool cap_onednn_isa() {
  if (std::getenv("DNNL_MAX_CPU_ISA") != nullptr) return false;
  try {
    dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx2);
  } catch (const dnnl::error&) {
    return false;
  }
  return true;
}

ThreadState& state() {
  [[maybe_unused]] static const bool capped = cap_onednn_isa();
  thread_local ThreadState s;
  return s;
}

dnnl::memory::desc src_desc(const OnednnConv& g) {
  return dnnl::memory::desc(dims{g.n, g.c, g.h, g.w}, dt::f32, tag::nhwc);
}
dnnl::memory::desc dst_desc(const OnednnConv& g) {
  return dnnl::memory::desc(dims{g.n, g.o, g.oh, g.ow}, dt::f32, tag::nhwc);
}
// HWIO [kh, kw, c/G, o] with output channel gr·og + j: as strides over oneDNN's logical
// (G, O/G, I/G, KH, KW) or (O, I, KH, KW).
dnnl::memory::desc weights_desc(const OnednnConv& g) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  if (g.groups == 1) {
    return dnnl::memory::desc(dims{g.o, cg, g.kh, g.kw}, dt::f32,
                              dims{1, g.o, g.kw * cg * g.o, cg * g.o});
  }
  return dnnl::memory::desc(dims{g.groups, og, cg, g.kh, g.kw}, dt::f32,
                            dims{og, 1, g.o, g.kw * cg * g.o, cg * g.o});
}

// Whether direction `dir` runs on oneDNN's own activation layout (blocked, nChw8c on AVX2) with
// a reorder from and to NHWC around the primitive, rather than on NHWC in place. Measured on
// the CNN's conv2 (13x13x32 -> 64; bench/conv_kernels.cc, docs/performance.md): oneDNN 2.6's
// jit:avx2 forward and backward-weights kernels on blocked activations beat the NHWC ones by
// more than the reorders cost, its backward-data kernel does not. Only where both channel
// counts fill whole 8-float blocks (conv1, one input channel, stays NHWC).
// DTRAIN_CONV_LAYOUT (read once) names the blocked directions for A/B runs: letters f, d, w
// (forward, backward data, backward weights), or "nhwc" for none.
bool blocked_activations(Direction dir, const OnednnConv& g) {
  static const std::string which = [] {
    const char* env = std::getenv("DTRAIN_CONV_LAYOUT");
    if (env == nullptr) return std::string("fw");
    return std::strcmp(env, "nhwc") == 0 ? std::string() : std::string(env);
  }();
  const char letter = dir == kForward ? 'f' : dir == kBackwardData ? 'd' : 'w';
  return which.find(letter) != std::string::npos && g.groups == 1 && g.c % 8 == 0 && g.o % 8 == 0;
}

struct Params {
  dims strides, dilation, pad_l, pad_r;
};

Params params(const OnednnConv& g) {
  const int64_t eff_h = (g.kh - 1) * g.dh + 1, eff_w = (g.kw - 1) * g.dw + 1;
  const int64_t pb = std::max<int64_t>((g.oh - 1) * g.sh + eff_h - g.h - g.pt, 0);
  const int64_t pr = std::max<int64_t>((g.ow - 1) * g.sw + eff_w - g.w - g.pl, 0);
  return Params{dims{g.sh, g.sw}, dims{g.dh - 1, g.dw - 1}, dims{g.pt, g.pl}, dims{pb, pr}};
}

dnnl::convolution_forward::primitive_desc forward_pd(
    const OnednnConv& g, bool bias, const dnnl::memory::desc& src, const dnnl::memory::desc& wei,
    const dnnl::memory::desc& dst, const dnnl::primitive_attr& attr, const dnnl::engine& eng) {
  const Params p = params(g);
  const auto bias_md = bias ? dnnl::memory::desc(dims{g.o}, dt::f32, tag::x) : dnnl::memory::desc();
  return dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, src, wei, bias_md, dst,
                                      p.strides, p.dilation, p.pad_l, p.pad_r),
      attr, eng);
}

// The argument `id` over dtrain's buffer of layout `user`, as the primitive reads or writes it
// in layout `chosen`: the buffer itself when the layouts agree, else staged through a reorder.
Arg make_arg(int id, bool input, const dnnl::memory::desc& user, const dnnl::memory::desc& chosen,
             ThreadState& s) {
  Arg a;
  a.id = id;
  a.input = input;
  a.user = dnnl::memory(user, s.engine, DNNL_MEMORY_NONE);
  if (chosen == user) return a;
  a.staged = true;
  a.buffer.resize((chosen.get_size() + sizeof(float) - 1) / sizeof(float));
  a.inner = dnnl::memory(chosen, s.engine, a.buffer.data());
  a.reorder = input ? dnnl::reorder(a.user, a.inner) : dnnl::reorder(a.inner, a.user);
  return a;
}

std::unique_ptr<Entry> create(Direction dir, const OnednnConv& g, bool bias, ThreadState& s) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto e = std::make_unique<Entry>();
  const auto src = src_desc(g), dst = dst_desc(g), wei_user = weights_desc(g);
  const auto any = [](const dnnl::memory::desc& d) {
    return dnnl::memory::desc(d.dims(), dt::f32, tag::any);
  };
  // The weights always in the layout oneDNN picks: with plain HWIO weights oneDNN 2.6 on AVX2
  // falls back to its im2col + GEMM (docs/decisions.md).
  const auto wei = any(wei_user);
  const bool blocked = blocked_activations(dir, g);
  const auto src_q = blocked ? any(src) : src, dst_q = blocked ? any(dst) : dst;
  const Params p = params(g);
  const auto hint = forward_pd(g, bias && dir == kForward, src_q, wei, dst_q, attr, s.engine);
  // Without blocked activations the layouts must come out exactly as asked, so that nothing but
  // the weights is reordered; where oneDNN insists otherwise, im2col takes the shape.
  const auto check = [&](const dnnl::memory::desc& x_md, const dnnl::memory::desc& y_md) {
    return blocked || (x_md == src && y_md == dst);
  };
  if (dir == kForward) {
    if (!check(hint.src_desc(), hint.dst_desc())) return nullptr;
    e->prim = dnnl::convolution_forward(hint);
    e->scratchpad_bytes = hint.scratchpad_desc().get_size();
    e->args.push_back(make_arg(DNNL_ARG_SRC, true, src, hint.src_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_WEIGHTS, true, wei_user, hint.weights_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_DST, false, dst, hint.dst_desc(), s));
    if (bias)
      e->args.push_back(make_arg(DNNL_ARG_BIAS, true, hint.bias_desc(), hint.bias_desc(), s));
  } else if (dir == kBackwardData) {
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_q, wei,
                                              dst_q, p.strides, p.dilation, p.pad_l, p.pad_r),
        attr, s.engine, hint);
    if (!check(pd.diff_src_desc(), pd.diff_dst_desc())) return nullptr;
    e->prim = dnnl::convolution_backward_data(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->args.push_back(make_arg(DNNL_ARG_DIFF_DST, true, dst, pd.diff_dst_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_WEIGHTS, true, wei_user, pd.weights_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_DIFF_SRC, false, src, pd.diff_src_desc(), s));
  } else {
    const dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_q, wei,
                                                 dst_q, p.strides, p.dilation, p.pad_l, p.pad_r),
        attr, s.engine, hint);
    if (!check(pd.src_desc(), pd.diff_dst_desc())) return nullptr;
    e->prim = dnnl::convolution_backward_weights(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->args.push_back(make_arg(DNNL_ARG_SRC, true, src, pd.src_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_DIFF_DST, true, dst, pd.diff_dst_desc(), s));
    e->args.push_back(make_arg(DNNL_ARG_DIFF_WEIGHTS, false, wei_user, pd.diff_weights_desc(), s));
  }
  for (const Arg& a : e->args) e->arg_map[a.id] = a.staged ? a.inner : a.user;
  return e;
}

// Runs `dir` on the cached primitive for (g, bias); false where oneDNN does not take it.
// a, b, c: forward x, w, y; backward data dy, w, dx; backward weights x, dy, dw.
bool execute(Direction dir, const OnednnConv& g, const void* a, const void* b, void* c,
             const void* bias) {
  if (g.n <= 0 || g.c <= 0 || g.o <= 0) return false;
  ThreadState& s = state();
  const int threads = num_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  const Key key{dir,     bias != nullptr ? 1 : 0,
                g.n,     g.h,
                g.w,     g.c,
                g.oh,    g.ow,
                g.o,     g.kh,
                g.kw,    g.groups,
                g.sh,    g.sw,
                g.dh,    g.dw,
                g.pt,    g.pl,
                threads, 0};
  auto it = s.cache.find(key);
  if (it == s.cache.end()) {
    std::unique_ptr<Entry> e;
    try {
      e = create(dir, g, bias != nullptr, s);
    } catch (const dnnl::error&) {
      e = nullptr;  // unimplemented for this shape: remembered, so im2col takes it from now on
    }
    it = s.cache.emplace(key, std::move(e)).first;
  }
  Entry* e = it->second.get();
  if (e == nullptr) return false;
  if (e->scratchpad_bytes > s.scratchpad_capacity) {
    s.scratchpad.resize(e->scratchpad_bytes);
    s.scratchpad_capacity = e->scratchpad_bytes;
    s.scratchpad_memory = dnnl::memory(
        dnnl::memory::desc(dims{static_cast<int64_t>(s.scratchpad_capacity)}, dt::u8, tag::x),
        s.engine, s.scratchpad.data());
  }
  const std::array<void*, 4> handles{const_cast<void*>(a), const_cast<void*>(b), c,
                                     const_cast<void*>(bias)};
  for (size_t i = 0; i < e->args.size(); ++i) e->args[i].user.set_data_handle(handles[i]);
  if (e->scratchpad_bytes > 0) {
    e->arg_map[DNNL_ARG_SCRATCHPAD] = s.scratchpad_memory;
  } else {
    e->arg_map.erase(DNNL_ARG_SCRATCHPAD);
  }
  for (Arg& x : e->args) {
    if (x.staged && x.input) x.reorder.execute(s.stream, x.user, x.inner);
  }
  e->prim.execute(s.stream, e->arg_map);
  for (Arg& x : e->args) {
    if (x.staged && !x.input) x.reorder.execute(s.stream, x.inner, x.user);
  }
  s.stream.wait();
  fast_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool onednn_conv2d(const OnednnConv& g, const float* x, const float* w, const float* bias,
                   float* y) {
  return execute(kForward, g, x, w, y, bias);
}

bool onednn_conv2d_backward_input(const OnednnConv& g, const float* dy, const float* w, float* dx) {
  return execute(kBackwardData, g, dy, w, dx, nullptr);
}

bool onednn_conv2d_backward_filter(const OnednnConv& g, const float* x, const float* dy,
                                   float* dw) {
  return execute(kBackwardWeights, g, x, dy, dw, nullptr);
}

}  // namespace detail
}  // namespace dtrain::ops
