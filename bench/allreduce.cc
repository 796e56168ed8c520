// All-reduce latency and bandwidth of dtrain's collectives, one process per rank:
//   bench_allreduce --rank R --world-size N --rdzv file:///tmp/dir --floats 101770 [--iters 200]
//                   [--algorithm auto|ring|ring_chunked|halving_doubling|reduce_scatter]
//                   [--transport gloo|shm]
// gloo: Gloo's TCP pairs on loopback; shm: the shared-memory transport (CollectiveOptions::
// shared_memory). Rank 0 prints "key value" lines (median/p10/p90 ms, GB/s = payload bytes /
// median time, and its CPU time per all-reduce, user + system, since the machine is shared).
// bench/allreduce.sh runs it side by side with torch.distributed.all_reduce.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/rendezvous.h"

using namespace dtrain;
using namespace dtrain::distribute;

int main(int argc, char** argv) {
  int rank = 0, world = 2, iters = 200;
  long floats = 101770;
  std::string rdzv, algo = "auto", transport = "gloo";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank")
      rank = std::atoi(v.c_str());
    else if (k == "--world-size")
      world = std::atoi(v.c_str());
    else if (k == "--iters")
      iters = std::atoi(v.c_str());
    else if (k == "--floats")
      floats = std::atol(v.c_str());
    else if (k == "--rdzv")
      rdzv = v;
    else if (k == "--algorithm")
      algo = v;
    else if (k == "--transport")
      transport = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  AllreduceAlgorithm a = AllreduceAlgorithm::kAuto;
  if (algo == "ring")
    a = AllreduceAlgorithm::kRing;
  else if (algo == "ring_chunked")
    a = AllreduceAlgorithm::kRingChunked;
  else if (algo == "halving_doubling")
    a = AllreduceAlgorithm::kHalvingDoubling;
  else if (algo == "reduce_scatter")
    a = AllreduceAlgorithm::kReduceScatter;
  else if (algo != "auto") {
    std::fprintf(stderr, "unknown algorithm %s\n", algo.c_str());
    return 2;
  }
  if (transport != "gloo" && transport != "shm") {
    std::fprintf(stderr, "unknown transport %s (gloo, shm)\n", transport.c_str());
    return 2;
  }
  auto cpu_ms = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
  };
  try {
    auto c = Collectives::connect(open_store(rdzv), {.rank = rank,
                                                     .world_size = world,
                                                     .timeout = std::chrono::seconds(60),
                                                     .bucket_bytes = size_t{64} << 20,
                                                     .algorithm = a,
                                                     .shared_memory = transport == "shm"});
    if (c->uses_shared_memory() != (transport == "shm")) {
      std::fprintf(stderr, "rank %d: transport %s is not available here\n", rank,
                   transport.c_str());
      return 1;
    }
    std::vector<Tensor> ts{Tensor::full({floats}, 1.0)};
    const int warmup = std::max(3, iters / 10);
    std::vector<double> ms;
    double cpu = 0;
    for (int i = 0; i < warmup + iters; ++i) {
      c->barrier();
      const double c0 = cpu_ms();
      const auto t0 = std::chrono::steady_clock::now();
      c->all_reduce(ts, ReduceOp::kSum);
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) cpu += cpu_ms() - c0;
      if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    if (rank == 0) {
      std::printf("impl dtrain_%s_%s\nfloats %ld\nworld_size %d\niters %d\n", transport.c_str(),
                  algo.c_str(), floats, world, iters);
      std::printf("median_ms %.4f\np10_ms %.4f\np90_ms %.4f\ngbps %.3f\n", med, ms[ms.size() / 10],
                  ms[ms.size() * 9 / 10], floats * 4.0 / (med * 1e6));
      std::printf("cpu_ms_per_op %.4f\n", cpu / iters);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
