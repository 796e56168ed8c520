// Collectives across worker processes over Gloo's TCP transport, or over shared memory when
// every worker is on one host: all-reduce (bucketed), broadcast, all-gather and barrier, each
// bounded by a timeout. A Collectives object is one
// Gloo context built from a rendezvous; after any failure it is unusable ("broken") and a new
// one must be built from a fresh rendezvous generation. Thread-compatible: call from one
// thread at a time; every worker must issue the same collectives in the same order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/key_value_store.h"
#include "dtrain/distribute/rendezvous.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

// Which Gloo all-reduce runs a bucket. kAuto picks by size and world size (docs/distributed.md
// has the measurements): Gloo's old-style AllreduceRing for small buffers with two workers
// (lowest latency; with two workers a + b == b + a, so both get the same bits), otherwise the
// reduce-scatter + all-gather ring of gloo::allreduce, where each element is summed on one
// worker and then copied, so every worker gets the same bits at any world size.
enum class AllreduceAlgorithm { kAuto, kRing, kRingChunked, kHalvingDoubling, kReduceScatter };

struct CollectiveOptions {
  int rank = 0;                    // this worker
  int world_size = 1;              // workers in the job
  std::string host = "127.0.0.1";  // address this worker's TCP device binds and advertises
  std::string task = "";           // shown in error messages, e.g. "worker:1"
  std::chrono::milliseconds timeout = std::chrono::seconds(30);  // rendezvous and each collective
  size_t bucket_bytes = size_t{4} << 20;  // tensors are packed into buckets of up to this size
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  std::string run_id = "default";                    // see RendezvousOptions
  std::optional<int64_t> generation = std::nullopt;  // see RendezvousOptions
  // When every worker of the generation is on this host (same boot, pid and network namespaces,
  // and /dev/shm), all_reduce, all_reduce_in_order, all_gather(_v), broadcast and barrier run
  // over one shared-memory segment instead of TCP, with the same bits (docs/distributed.md). A
  // worker that says no (or has DTRAIN_SHM_COLLECTIVES=0 in its environment) keeps the whole
  // generation on Gloo.
  bool shared_memory = true;
};

// Elements [begin, end) of one tensor that an all-reduce sums in ring order ending on rank
// `owner`: x_owner + (x_owner+1 + (... + (x_owner-2 + x_owner-1))), ranks modulo the world size.
// Gloo's ring all-reduce sums chunk c of a buffer in that order with owner c, so where an element
// sits in its bucket decides the bits of its sum for three workers or more (docs/decisions.md).
struct SumRange {
  int64_t begin = 0;
  int64_t end = 0;
  int owner = 0;
};

// A run of `count` elements of an ordered all-reduce: read from `src` (zeros when null), summed
// across workers in ring order ending on `owner` (as SumRange), written to `dst` (may be src) on
// every worker, or with keep >= 0 only on worker `keep` (a reduce-scatter to it: `dst` is not
// touched, and may be null, elsewhere).
struct OrderedPiece {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t count = 0;
  int owner = 0;
  int keep = -1;
};

class Collectives {
 public:
  // Rendezvous on `store` (see rendezvous()), then connects a full mesh of TCP pairs and waits
  // until every worker has connected (so none can close its pairs mid-handshake). Blocks up
  // to options.timeout. With world_size 1 nothing is connected and every collective is a copy
  // or a no-op. Throws what rendezvous() throws; UnavailableError or DeadlineExceededError
  // when the connection fails. Sets SIGPIPE to ignored if it has its default action, so that
  // a write to a dead peer fails the collective instead of killing the process.
  static std::unique_ptr<Collectives> connect(const std::shared_ptr<KeyValueStore>& store,
                                              const CollectiveOptions& options);
  // Waits (at most 10 s, skipped after a failure) until every worker is done with the
  // collectives so far, so closing this worker's connections cannot break a peer's last one.
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const;
  int size() const;
  int64_t generation() const;
  const std::vector<PeerInfo>& peers() const;
  // True after a collective failed; every later call throws FailedPreconditionError.
  bool broken() const;
  // True when the collectives run over shared memory (see CollectiveOptions::shared_memory).
  bool uses_shared_memory() const;

  // Reduces `tensors` element-wise across workers in place. Tensors (float32, float64, int32 or
  // int64) are packed in order into buckets of up to bucket_bytes of one dtype; the bucket
  // buffers are kept between calls, so a steady-state call allocates nothing. kMean divides
  // the sum by the world size (floating-point dtypes only). Blocks until every worker has
  // contributed. Throws UnavailableError when a peer is lost (naming the rank and its host
  // where Gloo says which), DeadlineExceededError after the timeout, InvalidArgumentError for
  // an unsupported dtype.
  void all_reduce(std::span<Tensor> tensors, ReduceOp op);
  // The order all_reduce(tensors, kSum) sums each element in: for every tensor, its element
  // ranges (covering it, in order) and their owners. Depends only on the tensors' sizes and
  // dtypes, the bucket size, the algorithm and the world size, so it is the same on every
  // worker. Throws FailedPreconditionError for three workers or more with an old-style
  // algorithm (kRing, kRingChunked, kHalvingDoubling), whose order is not Gloo's new ring's.
  std::vector<std::vector<SumRange>> summation_order(std::span<const Tensor> tensors) const;
  // Sums `pieces` (all of `dtype`, float32 or float64) across workers: each element in the ring
  // order of its piece's owner, so that an element given the owner summation_order() names gets
  // bitwise what all_reduce gives it, however the pieces are grouped. A reduce-scatter to the
  // owners along the ring, then an all-gather; every worker must pass the same counts and owners
  // in the same order. Uses the persistent buffer `buffer` (one per concurrent use; they are
  // reused between calls). Throws as all_reduce. May run on another thread than the other
  // collectives, but never at the same time as one of them.
  void all_reduce_in_order(std::span<const OrderedPiece> pieces, DType dtype, size_t buffer);
  // One number, reduced across workers.
  double all_reduce_scalar(double value, ReduceOp op);
  // Overwrites `tensors` on every worker with `root`'s values, in place (bucketed).
  void broadcast(std::span<Tensor> tensors, int root);
  // out[r] = rank r's `local`. `out` has shape [size(), local.shape...] and local's dtype.
  void all_gather(const Tensor& local, Tensor& out);
  // out = the concatenation, in rank order, of every rank's `local` (bytes_per_rank[r] bytes from
  // rank r; this rank's must equal its `local`'s size). Throws as all_reduce.
  void all_gather_v(const void* local, void* out, std::span<const size_t> bytes_per_rank);
  // The same with the output scattered over `out` (byte ranges taken end to end, as long as the
  // concatenation together): over shared memory straight from every rank's region, otherwise
  // through a buffer kept for the next call. `local` null: in place, this rank's part is already
  // where `out` puts it (and is what it contributes); only the other ranks' parts are written.
  void all_gather_v(const void* local, std::span<const std::span<std::byte>> out,
                    std::span<const size_t> bytes_per_rank);
  // Returns once every worker has called barrier().
  void barrier();

 private:
  struct Impl;
  explicit Collectives(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::distribute
