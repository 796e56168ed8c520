// A worker process for the multi-worker tests: trains a small linear model y = x·W + b with SGD
// under MultiWorkerMirroredStrategy (cluster from the environment: TF_CONFIG, DTRAIN_*, ...),
// using distribute_dataset for the data split and reduce_gradients for the all-reduce, and
// writes its final variables to --out. Each worker initializes its variables from its own seed,
// so only the chief's broadcast makes them equal.
//   distribute_worker --out FILE [--global-batch 64] [--epochs 2] [--verify-sync N]
//                     [--rdzv URL] [--timeout-ms 20000] [--corrupt-step S] [--local-replicas R]
// Exit status 0, or 1 with "error: CODE: message" on stderr.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/random.h"
#include "dtrain/data/dataset.h"
#include "dtrain/distribute/input.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/distribute/sync_check.h"

using namespace dtrain;
using namespace dtrain::distribute;

namespace {

constexpr int64_t kExamples = 512, kIn = 8, kOut = 4;

// x [B, in], y [B, out] -> adds d(loss)/dW [in, out] and d(loss)/db [out] for
// loss = sum_rows 0.5 * |x·W + b - y|^2 / global_batch.
void accumulate_gradients(const Tensor& x, const Tensor& y, const Tensor& w, const Tensor& b,
                          int64_t global_batch, Tensor& gw, Tensor& gb) {
  const float* X = x.data<float>();
  const float* Y = y.data<float>();
  const float* W = w.data<float>();
  const float* B = b.data<float>();
  float* GW = gw.data<float>();
  float* GB = gb.data<float>();
  for (int64_t r = 0; r < x.dim(0); ++r) {
    for (int64_t o = 0; o < kOut; ++o) {
      float pred = B[o];
      for (int64_t i = 0; i < kIn; ++i) pred += X[r * kIn + i] * W[i * kOut + o];
      const float err = (pred - Y[r * kOut + o]) / static_cast<float>(global_batch);
      for (int64_t i = 0; i < kIn; ++i) GW[i * kOut + o] += X[r * kIn + i] * err;
      GB[o] += err;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out, rdzv;
  int64_t global_batch = 64, epochs = 2, verify_every = 0, corrupt_step = -1, timeout_ms = 20000;
  int local_replicas = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--out")
      out = v;
    else if (k == "--rdzv")
      rdzv = v;
    else if (k == "--global-batch")
      global_batch = std::atoll(v.c_str());
    else if (k == "--epochs")
      epochs = std::atoll(v.c_str());
    else if (k == "--verify-sync")
      verify_every = std::atoll(v.c_str());
    else if (k == "--corrupt-step")
      corrupt_step = std::atoll(v.c_str());
    else if (k == "--timeout-ms")
      timeout_ms = std::atoll(v.c_str());
    else if (k == "--local-replicas")
      local_replicas = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "usage: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    MultiWorkerMirroredStrategy strategy({.rendezvous = rdzv,
                                          .timeout = std::chrono::milliseconds(timeout_ms),
                                          .bucket_bytes = 64,  // several buckets per step
                                          .local_replicas = local_replicas});
    const int rank = strategy.worker_rank();
    // The same data on every worker (seed 7); the variables start from a per-worker seed.
    Philox data_rng(7);
    std::vector<float> xs(kExamples * kIn), ys(kExamples * kOut);
    for (auto& v : xs) v = data_rng.normal();
    for (int64_t r = 0; r < kExamples; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        float t = 0.5f * o;
        for (int64_t i = 0; i < kIn; ++i) t += xs[r * kIn + i] * 0.1f * (i - o);
        ys[r * kOut + o] = t + 0.01f * data_rng.normal();
      }
    }
    Philox init_rng(1000 + rank);
    Tensor w(Shape{kIn, kOut}), b(Shape{kOut});
    for (int64_t i = 0; i < w.num_elements(); ++i) w.data<float>()[i] = init_rng.normal();
    b.fill(0.1 * rank);
    std::vector<Tensor> vars{w, b};
    strategy.broadcast_from_chief(vars);

    auto global = data::Dataset::from_tensor_slices({Tensor::from_vector(xs, {kExamples, kIn}),
                                                     Tensor::from_vector(ys, {kExamples, kOut})})
                      .shuffle(kExamples, /*seed=*/3)
                      .batch(global_batch, /*drop_remainder=*/false);
    auto mine = distribute_dataset(global, strategy);
    const int n_local = strategy.num_local_replicas();
    std::vector<std::vector<Tensor>> grads(n_local);
    for (auto& g : grads) g = {Tensor::zeros({kIn, kOut}), Tensor::zeros({kOut})};
    std::vector<Tensor> summed{Tensor::zeros({kIn, kOut}), Tensor::zeros({kOut})};
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      auto it = mine.iterator(epoch);
      data::Element batch;
      while (it.next(batch)) {
        const int64_t rows = batch[0].dim(0);
        // The global batch of this step (the last one may be partial), for the loss scale.
        const int64_t this_global = static_cast<int64_t>(
            strategy.all_reduce_scalar(static_cast<double>(rows), ReduceOp::kSum));
        strategy.run([&](int r) {
          grads[r][0].fill(0);
          grads[r][1].fill(0);
          // Local replica r's rows of this worker's part.
          const auto [b0, e0] = replica_rows(rows, n_local, r);
          accumulate_gradients(batch[0].slice(b0, e0), batch[1].slice(b0, e0), w, b, this_global,
                               grads[r][0], grads[r][1]);
        });
        strategy.reduce_gradients(grads, summed, ReduceOp::kSum);
        const float lr = 0.1f;
        for (size_t v = 0; v < vars.size(); ++v) {
          float* p = vars[v].data<float>();
          const float* g = summed[v].data<float>();
          for (int64_t i = 0; i < vars[v].num_elements(); ++i) p[i] -= lr * g[i];
        }
        ++step;
        if (step == corrupt_step && rank == 1) b.data<float>()[2] += 1e-6f;
        if (verify_every > 0 && step % verify_every == 0) {
          const NamedTensor named[] = {{"dense/kernel", w}, {"dense/bias", b}};
          verify_sync(strategy, named, step);
        }
      }
    }
    if (!out.empty()) {
      std::ofstream f(out, std::ios::binary);
      f.write(static_cast<const char*>(w.raw_data()), w.nbytes());
      f.write(static_cast<const char*>(b.raw_data()), b.nbytes());
    }
    std::printf("rank %d of %d (%s) done after %lld steps\n", rank, strategy.num_workers(),
                strategy.cluster().source.c_str(), static_cast<long long>(step));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: UNKNOWN: %s\n", e.what());
    return 1;
  }
  return 0;
}
