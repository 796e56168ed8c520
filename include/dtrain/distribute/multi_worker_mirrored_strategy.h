// MultiWorkerMirroredStrategy: one process per worker, on one or many machines
// (tf.distribute.MultiWorkerMirroredStrategy). Gradients are all-reduced with Gloo over TCP
// (bucketed); the chief broadcasts the initial variables so every worker starts identical;
// every collective has a timeout. Used from one controlling thread per process.
//
//   distribute::MultiWorkerMirroredStrategy strategy({.rendezvous = "file:///shared/rdzv"});
//
// The cluster comes from resolve_cluster() (TF_CONFIG, Slurm, Open MPI, dtrain launch) unless
// given. Rendezvous, in order: options.store; options.rendezvous; the environment's
// DTRAIN_RDZV; else the chief (rank 0) serves a coordination service at its cluster address
// (TF_CONFIG's chief or worker 0 "host:port", Slurm's first task) and every worker connects to it.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/distribute/cluster_resolver.h"
#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/key_value_store.h"
#include "dtrain/distribute/mirrored_strategy.h"

namespace dtrain::distribute {

class CoordinationServer;
class LogicalReplicaReduction;

struct MultiWorkerOptions {
  std::optional<ClusterSpec> cluster = std::nullopt;  // default: resolve_cluster()
  std::string rendezvous = "";  // file:///dir, redis://h:p, etcd://h:p[,h:p], host:port
  std::shared_ptr<KeyValueStore> store = nullptr;  // a store to rendezvous on; wins over the URL
  std::chrono::milliseconds timeout = std::chrono::seconds(30);  // rendezvous and each collective
  size_t bucket_bytes = size_t{4} << 20;                         // all-reduce bucket size
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  // fit()'s gradient all-reduce overlapped with the backward pass, in buckets of up to
  // overlap_bucket_bytes in reverse variable order (PyTorch DDP's bucket_cap_mb), on a
  // communication thread; bitwise the same result (gradient_overlap.h). With one local replica
  // (several: reduced after backward as without it).
  bool overlap_gradients = false;
  size_t overlap_bucket_bytes = size_t{1} << 20;
  // ZeRO: 0 replicates the optimizer state; 1 partitions its slots across the workers
  // (partition_rows), each worker updating its rows; 2 also reduce-scatters the gradients so
  // each worker keeps only its rows' sums. Bitwise the same variables (sharded_update.h). With
  // one local replica; not with fit's checkpoints (save_checkpoints) yet.
  int shard_optimizer_state = 0;
  int local_replicas = 1;  // replica threads per worker (TF on CPU: 1)
  // Exact elastic training: when > 0, the global batch is split into this many fixed logical
  // replicas (num_replicas_in_sync()), mapped onto the workers in contiguous blocks (worker w
  // runs its block as replica threads; the first L % W workers take one more), and the
  // gradients of the L logical replicas are all-gathered and summed in logical order 0..L-1, so
  // the variables are bitwise the same for any number of workers W <= L (and equal to
  // MirroredStrategy(L) in one process). Dropout streams and loss scaling follow the logical
  // replica. Costs an all-gather of L gradient lists instead of an all-reduce of one
  // (docs/distributed.md). Excludes local_replicas != 1, overlap_gradients and
  // shard_optimizer_state. 0: off.
  int logical_replicas = 0;
  int blas_threads = -1;    // as MirroredOptions::blas_threads; -1: leave alone
  std::string host = "";    // address collectives bind; default: the cluster's host for this task
  std::string run_id = "";  // default: the cluster's, else "default"
  std::optional<int64_t> generation = std::nullopt;  // default: the cluster's, else a ticket
  bool report_tensorboard = false;  // the tutorial's option: fit() writes TensorBoard files
  std::string logdir = "logs";      // where (chief only), with recovery reports
};

// The rendezvous key under which the chief of a job with logical replicas publishes their
// count: its state (snapshots, backups) does not depend on the world size, so dtrain launch may
// restore a snapshot taken at another world size into a resized job (fault/snapshots.h).
std::string world_size_independent_key(const std::string& run_id);

class MultiWorkerMirroredStrategy final : public MirroredStrategy {
 public:
  // Resolves the cluster, rendezvouses with every worker and connects the Gloo mesh. Blocks up
  // to options.timeout. Throws InvalidArgumentError for a malformed cluster description (naming
  // the variable), for a ps or evaluator task, or for workers started with different world
  // sizes; DeadlineExceededError naming the ranks that never arrived; UnavailableError when the
  // rendezvous store or a peer cannot be reached; FailedPreconditionError when no rendezvous is
  // configured and the cluster has no chief address to serve one on, or when workers run
  // different builds or flush-denormals settings (core/build_info.h: naming both ranks and both
  // fingerprints; every worker refuses). With logical_replicas: InvalidArgumentError for a
  // negative count, more workers than logical replicas, or local_replicas, overlap_gradients or
  // shard_optimizer_state set with it.
  explicit MultiWorkerMirroredStrategy(const MultiWorkerOptions& options = {});
  ~MultiWorkerMirroredStrategy() override;

  std::string name() const override { return "MultiWorkerMirroredStrategy"; }
  int worker_rank() const override { return cluster_.rank; }
  int num_workers() const override { return cluster_.num_workers; }
  // TF's rule: the chief task, else worker 0 (always rank 0 here).
  bool is_chief() const override { return cluster_.rank == 0; }

  int num_replicas_in_sync() const override;
  int replica_id(int local) const override;
  int logical_replicas() const override { return logical_replicas_; }
  using Strategy::reduce_gradients;
  // With logical replicas: the exact reduction (logical_replicas.h); `extra` is all-reduced
  // as usual. Otherwise Strategy's.
  void reduce_gradients(std::span<const std::vector<Tensor>> per_replica, std::span<Tensor> out,
                        ReduceOp op, const ReduceGradientsOptions& options) override;
  void all_reduce_across_workers(std::span<Tensor> tensors, ReduceOp op) override;
  void broadcast_from_chief(std::span<Tensor> tensors) override;
  double all_reduce_scalar(double value, ReduceOp op) override;
  void barrier() override;
  void all_gather_across_workers(const Tensor& local, Tensor& out) override;
  std::unique_ptr<OverlappedGradientReduction> make_overlapped_reduction(
      std::span<Tensor> out, std::span<Tensor> extra) override;
  std::unique_ptr<ShardedOptimizerUpdate> make_sharded_update(std::span<Variable* const> vars,
                                                              std::span<Tensor> extra,
                                                              optim::Optimizer& optimizer) override;

  // Re-creates the collectives in this process under rendezvous generation `generation` (a
  // fresh Gloo context under the new store prefix, dtrain/<run>/g<generation>/), with the same
  // rank and world size: how a worker that survived a peer's failure joins the next generation
  // (`dtrain launch --on-failure survivors`). The failed context is closed first; objects that
  // hold the old collectives (overlapped reductions, ZeRO updates) must be gone. Blocks up to
  // options.timeout; throws what the constructor's rendezvous throws.
  void rejoin(int64_t generation);

  const ClusterSpec& cluster() const { return cluster_; }
  Collectives& collectives() { return *collectives_; }
  // The store the rendezvous runs on (for a launcher's worker, its coordination service's
  // client, connected for the strategy's life).
  KeyValueStore& store() { return *store_; }

 private:
  MultiWorkerMirroredStrategy(const MultiWorkerOptions& options, ClusterSpec cluster);

  ClusterSpec cluster_;
  std::unique_ptr<CoordinationServer> server_;  // rank 0, when it serves the rendezvous
  std::shared_ptr<KeyValueStore> store_;
  std::unique_ptr<Collectives> collectives_;
  CollectiveOptions connect_options_;  // how collectives_ was connected (rejoin re-uses them)
  bool overlap_gradients_ = false;
  size_t overlap_bucket_bytes_ = 0;
  int shard_optimizer_state_ = 0;
  int logical_replicas_ = 0;  // 0: off
  int first_logical_ = 0;     // this worker's first logical replica
  std::unique_ptr<LogicalReplicaReduction> logical_;
};

}  // namespace dtrain::distribute
