// oneDNN 2.x (Debian's libdnnl, OpenMP runtime) convolutions on dtrain's own NHWC/HWIO buffers:
// the memory descriptors describe those layouts exactly, so nothing is reordered. Primitives,
// their memory objects and argument maps are cached per thread and per (direction, geometry,
// bias, thread count), the scratchpad is user-managed in a per-thread buffer that only grows,
// and each thread has its own stream; so once warm a step creates nothing. oneDNN's OpenMP team
// is sized to ops::num_threads() on every call (one thread when dtrain runs with one).
#include "convolution_onednn.h"

#include <omp.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <memory>
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

struct Entry {
  dnnl::primitive prim;
  dnnl::memory a, b, c, d;  // the arguments in `args` (d: bias, forward only)
  std::unordered_map<int, dnnl::memory> args;
  size_t scratchpad_bytes = 0;
  // The weights in the primitive's own (blocked) layout, when it chose one: HWIO is reordered
  // into it before (forward, backward data) or out of it after (backward weights) the primitive.
  // Weights are small (conv2: 18k floats), activations stay NHWC.
  std::vector<float> blocked;
  dnnl::memory user_weights, blocked_weights;
  dnnl::reorder weights_reorder;
  bool reorder_before = false, reorder_after = false;
};

struct ThreadState {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, std::unique_ptr<Entry>> cache;
  std::vector<unsigned char> scratchpad;
  dnnl::memory scratchpad_memory;
  size_t scratchpad_capacity = 0;
};

ThreadState& state() {
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

struct Params {
  dims strides, dilation, pad_l, pad_r;
};

Params params(const OnednnConv& g) {
  const int64_t eff_h = (g.kh - 1) * g.dh + 1, eff_w = (g.kw - 1) * g.dw + 1;
  const int64_t pb = std::max<int64_t>((g.oh - 1) * g.sh + eff_h - g.h - g.pt, 0);
  const int64_t pr = std::max<int64_t>((g.ow - 1) * g.sw + eff_w - g.w - g.pl, 0);
  return Params{dims{g.sh, g.sw}, dims{g.dh - 1, g.dw - 1}, dims{g.pt, g.pl}, dims{pb, pr}};
}

dnnl::convolution_forward::primitive_desc forward_pd(const OnednnConv& g, bool bias,
                                                     const dnnl::memory::desc& wei,
                                                     dnnl::prop_kind prop,
                                                     const dnnl::primitive_attr& attr,
                                                     const dnnl::engine& eng) {
  const Params p = params(g);
  const auto bias_md = bias ? dnnl::memory::desc(dims{g.o}, dt::f32, tag::x) : dnnl::memory::desc();
  return dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, src_desc(g), wei,
                                      bias_md, dst_desc(g), p.strides, p.dilation, p.pad_l,
                                      p.pad_r),
      attr, eng);
}

// The layouts must come out exactly as asked (no "any"), so a mismatch is a bug, not a reorder.
bool same(const dnnl::memory::desc& a, const dnnl::memory::desc& b) { return a == b; }

// The memory the primitive reads or writes the weights through: dtrain's HWIO buffer itself
// when the primitive chose that layout, else a buffer of the entry in its layout with a reorder
// from (`into`) or back to HWIO.
dnnl::memory weights_memory(Entry& e, const dnnl::memory::desc& chosen, const OnednnConv& g,
                            bool into, ThreadState& s) {
  const auto user = weights_desc(g);
  e.user_weights = dnnl::memory(user, s.engine, DNNL_MEMORY_NONE);
  if (same(chosen, user)) return e.user_weights;
  e.blocked.resize((chosen.get_size() + sizeof(float) - 1) / sizeof(float));
  e.blocked_weights = dnnl::memory(chosen, s.engine, e.blocked.data());
  if (into) {
    e.weights_reorder = dnnl::reorder(e.user_weights, e.blocked_weights);
    e.reorder_before = true;
  } else {
    e.weights_reorder = dnnl::reorder(e.blocked_weights, e.user_weights);
    e.reorder_after = true;
  }
  return e.blocked_weights;
}

std::unique_ptr<Entry> create(Direction dir, const OnednnConv& g, bool bias, ThreadState& s) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto e = std::make_unique<Entry>();
  const auto src = src_desc(g), dst = dst_desc(g);
  const auto wei = dnnl::memory::desc(weights_desc(g).dims(), dt::f32, tag::any);
  const Params p = params(g);
  if (dir == kForward) {
    const auto pd = forward_pd(g, bias, wei, dnnl::prop_kind::forward_training, attr, s.engine);
    if (!same(pd.src_desc(), src) || !same(pd.dst_desc(), dst)) return nullptr;
    e->prim = dnnl::convolution_forward(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->a = dnnl::memory(src, s.engine, DNNL_MEMORY_NONE);
    e->b = weights_memory(*e, pd.weights_desc(), g, true, s);
    e->c = dnnl::memory(dst, s.engine, DNNL_MEMORY_NONE);
    e->args = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    if (bias) {
      e->d = dnnl::memory(pd.bias_desc(), s.engine, DNNL_MEMORY_NONE);
      e->args[DNNL_ARG_BIAS] = e->d;
    }
  } else if (dir == kBackwardData) {
    const auto hint = forward_pd(g, false, wei, dnnl::prop_kind::forward_training, attr, s.engine);
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src, wei, dst,
                                              p.strides, p.dilation, p.pad_l, p.pad_r),
        attr, s.engine, hint);
    if (!same(pd.diff_src_desc(), src) || !same(pd.diff_dst_desc(), dst)) return nullptr;
    e->prim = dnnl::convolution_backward_data(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->a = dnnl::memory(dst, s.engine, DNNL_MEMORY_NONE);
    e->b = weights_memory(*e, pd.weights_desc(), g, true, s);
    e->c = dnnl::memory(src, s.engine, DNNL_MEMORY_NONE);
    e->args = {{DNNL_ARG_DIFF_DST, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DIFF_SRC, e->c}};
  } else {
    const auto hint = forward_pd(g, false, wei, dnnl::prop_kind::forward_training, attr, s.engine);
    const dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src, wei, dst,
                                                 p.strides, p.dilation, p.pad_l, p.pad_r),
        attr, s.engine, hint);
    if (!same(pd.src_desc(), src) || !same(pd.diff_dst_desc(), dst)) return nullptr;
    e->prim = dnnl::convolution_backward_weights(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->a = dnnl::memory(src, s.engine, DNNL_MEMORY_NONE);
    e->b = dnnl::memory(dst, s.engine, DNNL_MEMORY_NONE);
    e->c = weights_memory(*e, pd.diff_weights_desc(), g, false, s);
    e->args = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_DIFF_DST, e->b}, {DNNL_ARG_DIFF_WEIGHTS, e->c}};
  }
  return e;
}

// Runs `dir` on the cached primitive for (g, bias); false where oneDNN does not take it.
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
  // The weights are b (forward, backward data) or c (backward weights); they go through
  // user_weights, which is the argument itself when no reorder is needed.
  e->a.set_data_handle(const_cast<void*>(a));
  if (dir == kBackwardWeights) {
    e->b.set_data_handle(const_cast<void*>(b));
    e->user_weights.set_data_handle(c);
  } else {
    e->user_weights.set_data_handle(const_cast<void*>(b));
    e->c.set_data_handle(c);
  }
  if (bias != nullptr) e->d.set_data_handle(const_cast<void*>(bias));
  if (e->scratchpad_bytes > 0) {
    e->args[DNNL_ARG_SCRATCHPAD] = s.scratchpad_memory;
  } else {
    e->args.erase(DNNL_ARG_SCRATCHPAD);
  }
  if (e->reorder_before) e->weights_reorder.execute(s.stream, e->user_weights, e->blocked_weights);
  e->prim.execute(s.stream, e->args);
  if (e->reorder_after) e->weights_reorder.execute(s.stream, e->blocked_weights, e->user_weights);
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
