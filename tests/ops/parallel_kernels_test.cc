// Every kernel that splits its work over parallel_for's team gives the same bits for 1, 2, 3 and
// 4 threads, on shapes large enough to split: GEMMs (fixed row blocks), activations
// and their gradients, softmax and the cross-entropy, bias add and bias gradients, broadcasting
// binary ops and their reductions, layer and batch normalization forward and backward, pooling,
// embeddings, and the optimizer updates.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dtrain/core/random.h"
#include "dtrain/ops/activations.h"
#include "dtrain/ops/embedding.h"
#include "dtrain/ops/gemm.h"
#include "dtrain/ops/normalization.h"
#include "dtrain/ops/optimizer_kernels.h"
#include "dtrain/ops/pooling.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::ops {
namespace {

std::vector<float> normal(int64_t n, uint64_t seed) {
  Philox rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.normal();
  return v;
}

// Runs `kernel` (which returns its outputs' floats) under 1..4 threads; every run must match the
// one-thread run bit for bit.
void expect_thread_count_invariant(const std::string& what,
                                   const std::function<std::vector<float>()>& kernel) {
  const int previous = num_threads();
  set_num_threads(1);
  const std::vector<float> reference = kernel();
  for (int threads : {2, 3, 4}) {
    set_num_threads(threads);
    const std::vector<float> got = kernel();
    ASSERT_EQ(got.size(), reference.size()) << what;
    EXPECT_EQ(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)), 0)
        << what << ": " << threads << " threads differ from one";
  }
  set_num_threads(previous);
}

std::vector<float> values(const Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.num_elements()};
}

TEST(ParallelKernels, GemmsInRowBlocksGiveTheSameBits) {
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{false, false, 4096, 128, 128}, Case{true, false, 1600, 128, 64},
                        Case{false, true, 64, 1600, 128}, Case{false, false, 64, 128, 1600},
                        Case{true, true, 300, 700, 50}, Case{false, false, 7744, 64, 288}}) {
    const std::vector<float> a = normal(c.m * c.k, 1), b = normal(c.k * c.n, 2),
                             c0 = normal(c.m * c.n, 3);
    expect_thread_count_invariant(
        "gemm " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k), [&] {
          std::vector<float> out = c0;
          gemm(c.ta, c.tb, c.m, c.n, c.k, 0.7f, a.data(), c.ta ? c.m : c.k, b.data(),
               c.tb ? c.k : c.n, 1.0f, out.data(), c.n);
          return out;
        });
  }
}

TEST(ParallelKernels, ActivationsSoftmaxAndTheLossGiveTheSameBits) {
  const int64_t rows = 4096, cols = 113;
  const std::vector<float> x = normal(rows * cols, 4), dy = normal(rows * cols, 5);
  for (Activation act : {Activation::kRelu, Activation::kGelu, Activation::kSwish,
                         Activation::kTanh, Activation::kSoftmax, Activation::kLogSoftmax}) {
    expect_thread_count_invariant(activation_name(act), [&] {
      std::vector<float> y = x, dz = dy;
      activation_inplace(act, y.data(), rows, cols);
      activation_backward_inplace(act, y.data(), x.data(), dz.data(), rows, cols,
                                  default_activation_alpha(act));
      y.insert(y.end(), dz.begin(), dz.end());
      return y;
    });
  }
  expect_thread_count_invariant("relu_backward_column_sum", [&] {
    std::vector<float> dz = dy, sum(cols);
    relu_backward_column_sum(x.data(), dz.data(), rows, cols, sum.data());
    dz.insert(dz.end(), sum.begin(), sum.end());
    return dz;
  });
  const Tensor logits = Tensor::from_vector(x, Shape{rows, cols});
  std::vector<int32_t> ids(rows);
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>((i * 37) % cols);
  const Tensor labels = Tensor::from_vector(ids, Shape{rows});
  expect_thread_count_invariant("sparse_softmax_cross_entropy", [&] {
    Tensor probs;
    std::vector<float> out = values(sparse_softmax_cross_entropy(logits, labels, &probs));
    const std::vector<float> p = values(probs);
    out.insert(out.end(), p.begin(), p.end());
    return out;
  });
}

TEST(ParallelKernels, BiasBroadcastsAndTheirReductionsGiveTheSameBits) {
  const Tensor x = Tensor::from_vector(normal(64 * 128 * 64, 6), Shape{64, 128, 64});
  const Tensor row = Tensor::from_vector(normal(64, 7), Shape{64});
  const Tensor plane = Tensor::from_vector(normal(128 * 64, 8), Shape{128, 64});
  expect_thread_count_invariant("broadcasts", [&] {
    Tensor y = x.clone();
    bias_add_inplace(y, row);
    std::vector<float> out = values(y);
    for (const Tensor& t : {binary(BinaryOp::kAdd, x, plane), binary(BinaryOp::kMul, x, row),
                            binary(BinaryOp::kSub, x, x), unary(UnaryOp::kExp, x),
                            reduce_to_shape(x, plane.shape()), reduce_to_shape(x, row.shape())}) {
      const std::vector<float> v = values(t);
      out.insert(out.end(), v.begin(), v.end());
    }
    std::vector<float> sum(64);
    column_sum(x.data<float>(), 128 * 64, 64, sum.data());
    out.insert(out.end(), sum.begin(), sum.end());
    return out;
  });
}

TEST(ParallelKernels, LayerAndBatchNormalizationGiveTheSameBits) {
  const int64_t rows = 4096, d = 128;
  const std::vector<float> x = normal(rows * d, 9), dy = normal(rows * d, 10),
                           gamma = normal(d, 11), beta = normal(d, 12);
  expect_thread_count_invariant("layer norm", [&] {
    std::vector<float> y(rows * d), stats(2 * rows), dx(rows * d), dg(d), db(d);
    layer_norm_forward(x.data(), rows, d, gamma.data(), beta.data(), 1e-5f, y.data(), stats.data());
    layer_norm_backward(dy.data(), x.data(), rows, d, stats.data(), gamma.data(), dx.data(),
                        dg.data(), db.data());
    for (const auto* v : {&stats, &dx, &dg, &db}) y.insert(y.end(), v->begin(), v->end());
    return y;
  });
  for (const ChannelLayout l : {ChannelLayout{.outer = rows, .channels = d, .inner = 1},
                                ChannelLayout{.outer = 64, .channels = d, .inner = 64}}) {
    expect_thread_count_invariant("batch norm, inner " + std::to_string(l.inner), [&] {
      std::vector<float> mean(d), var(d), inv(d), y(rows * d), dx(rows * d), dg(d), db(d);
      batch_norm_moments(x.data(), l, mean.data(), var.data());
      batch_norm_apply(x.data(), l, mean.data(), var.data(), gamma.data(), beta.data(), 1e-3f,
                       y.data(), inv.data());
      batch_norm_backward(dy.data(), x.data(), l, mean.data(), inv.data(), gamma.data(), dx.data(),
                          dg.data(), db.data());
      for (const auto* v : {&mean, &var, &inv, &dx, &dg, &db}) {
        y.insert(y.end(), v->begin(), v->end());
      }
      return y;
    });
  }
}

TEST(ParallelKernels, PoolingAndEmbeddingsGiveTheSameBits) {
  const Tensor x = Tensor::from_vector(normal(64 * 26 * 26 * 32, 13), Shape{64, 26, 26, 32});
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (int64_t p : {2, 3}) {
      const Pool2DAttrs a{.pool = {p, p}, .strides = {p, p}};
      expect_thread_count_invariant("pool " + std::to_string(p), [&] {
        const Tensor y = pool2d(kind, x, a);
        std::vector<float> out = values(y);
        const std::vector<float> dx = values(pool2d_backward(kind, x, y, a));
        const Tensor g = global_pool(kind, x);
        const std::vector<float> gx = values(global_pool_backward(kind, x, g));
        for (const auto* v : {&dx, &gx}) out.insert(out.end(), v->begin(), v->end());
        return out;
      });
    }
  }
  const Tensor table = Tensor::from_vector(normal(113 * 128, 14), Shape{113, 128});
  std::vector<int32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % 113);
  const Tensor id = Tensor::from_vector(ids, Shape{32, 128});
  const Tensor g = Tensor::from_vector(normal(4096 * 128, 15), Shape{32, 128, 128});
  expect_thread_count_invariant("embedding", [&] {
    std::vector<float> out = values(embedding_lookup(table, id, "embedding"));
    const std::vector<float> dt = values(embedding_gradient(g, id, 113));
    out.insert(out.end(), dt.begin(), dt.end());
    return out;
  });
}

TEST(ParallelKernels, OptimizerUpdatesGiveTheSameBits) {
  const int64_t n = 200003;
  const std::vector<float> var0 = normal(n, 16), g = normal(n, 17), m0 = normal(n, 18);
  std::vector<float> v0 = normal(n, 19);
  for (float& v : v0) v = v * v;
  expect_thread_count_invariant("adam, sgd, rmsprop", [&] {
    std::vector<float> var = var0, m = m0, v = v0, vhat = v0, mom = m0, avg = m0;
    adam_update(var.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.1f, 0.001f, 1e-7f, 1e-5f);
    adam_amsgrad_update(var.data(), m.data(), v.data(), vhat.data(), g.data(), n, 1e-3f, 0.1f,
                        0.001f, 1e-7f, 0.0f);
    sgd_momentum_update(var.data(), m.data(), g.data(), n, 0.01f, 0.9f);
    sgd_nesterov_update(var.data(), m.data(), g.data(), n, 0.01f, 0.9f);
    sgd_update(var.data(), g.data(), n, 0.01f);
    weight_decay_update(var.data(), n, 1e-4f);
    rmsprop_update(var.data(), v.data(), mom.data(), avg.data(), g.data(), n, 1e-3f, 0.9f, 0.1f,
                   0.9f, 1e-7f);
    for (const auto* x : {&m, &v, &vhat, &mom, &avg}) var.insert(var.end(), x->begin(), x->end());
    return var;
  });
}

}  // namespace
}  // namespace dtrain::ops
