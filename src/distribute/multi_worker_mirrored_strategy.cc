// MultiWorkerMirroredStrategy: cluster resolution, choice of rendezvous, Gloo collectives, the
// check that every worker runs the same build.
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "core/tcp.h"
#include "dtrain/core/build_info.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/gradient_overlap.h"
#include "dtrain/distribute/rendezvous.h"
#include "dtrain/distribute/sharded_update.h"
#include "logical_replicas.h"

namespace dtrain::distribute {
namespace {

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "127.0.0.1";
  return buf;
}

// The host part of a rendezvous URL ("host:port", "[v6]:port", "redis://host:port", the first
// endpoint of "etcd://host:port,host2:port"); "" for a file store or no URL.
std::string rendezvous_host(const std::string& url) {
  std::string rest = url;
  if (const size_t scheme = url.find("://"); scheme != std::string::npos) {
    if (url.compare(0, scheme, "file") == 0) return "";
    rest = url.substr(scheme + 3);
  }
  rest = rest.substr(0, std::min(rest.find('/'), rest.find(',')));
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  const size_t colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The address this worker's Gloo pairs listen on when nothing names one (DTRAIN_HOST, TF_CONFIG,
// Slurm, MPI): loopback when the rendezvous is on this machine; the address that routes to a
// remote rendezvous host (what the other machines reach, even where this machine's name
// resolves to 127.0.1.1 or to another network namespace's address); else the machine's name.
std::string default_host(const std::string& rendezvous) {
  const std::string rdzv_host = rendezvous_host(rendezvous);
  if (is_loopback(rdzv_host)) return "127.0.0.1";
  if (!rdzv_host.empty()) {
    if (std::string local = tcp::local_address_towards(rdzv_host); !local.empty()) return local;
  }
  return this_hostname();
}

// Every worker publishes its build_fingerprint() under this rendezvous generation and compares
// the others' with its own: workers whose builds (ISA, flags, compiler, version) or
// flush-denormals settings differ round the same step differently, and their mirrored variables
// would drift apart. Every worker sees the same set, so all of them refuse together.
void check_same_build(KeyValueStore& store, const std::string& run_id, const Collectives& c,
                      std::chrono::milliseconds timeout) {
  if (c.size() == 1) return;
  const std::string prefix = str_cat("dtrain/", run_id, "/g", c.generation(), "/build/");
  const std::string mine = build_fingerprint();
  store.set(prefix + std::to_string(c.rank()), mine);
  const std::vector<PeerInfo>& peers = c.peers();
  const auto who = [&](int rank) {
    const std::string task = rank < static_cast<int>(peers.size()) ? peers[rank].task : "";
    return task.empty() ? str_cat("rank ", rank) : str_cat("rank ", rank, " (", task, ")");
  };
  for (int r = 0; r < c.size(); ++r) {
    if (r == c.rank()) continue;
    const std::string theirs = store.get(prefix + std::to_string(r), timeout);
    if (theirs == mine) continue;
    const int low = std::min(r, c.rank()), high = std::max(r, c.rank());
    const std::string& low_fp = low == c.rank() ? mine : theirs;
    const std::string& high_fp = high == c.rank() ? mine : theirs;
    throw FailedPreconditionError(str_cat(
        "MultiWorkerMirroredStrategy: workers of one job run different builds or settings, so "
        "their variables would not stay in sync: ",
        who(low), " runs \"", low_fp, "\" but ", who(high), " runs \"", high_fp,
        "\" (build every worker with the same DTRAIN_ARCH and compiler, and give every worker "
        "the same DTRAIN_FLUSH_DENORMALS)"));
  }
}

// Replica threads on this worker: its block of logical replicas, or options.local_replicas.
int local_replica_count(const MultiWorkerOptions& options, const ClusterSpec& cluster) {
  if (options.logical_replicas == 0) return options.local_replicas;
  if (options.logical_replicas < 0) {
    throw InvalidArgumentError(str_cat("MultiWorkerMirroredStrategy: logical_replicas is ",
                                       options.logical_replicas, ", must be >= 1 (or 0: off)"));
  }
  const char* other = options.local_replicas != 1          ? "local_replicas"
                      : options.overlap_gradients          ? "overlap_gradients"
                      : options.shard_optimizer_state != 0 ? "shard_optimizer_state"
                                                           : nullptr;
  if (other != nullptr) {
    throw InvalidArgumentError(str_cat("MultiWorkerMirroredStrategy: logical_replicas (",
                                       options.logical_replicas, ") excludes ", other,
                                       " (each worker runs its block of logical replicas)"));
  }
  if (cluster.num_workers > options.logical_replicas) {
    throw InvalidArgumentError(
        str_cat("MultiWorkerMirroredStrategy: ", cluster.num_workers, " workers (from ",
                cluster.source, ") for logical_replicas ", options.logical_replicas,
                "; every worker needs at least one logical replica (run at most ",
                options.logical_replicas, " workers or raise logical_replicas)"));
  }
  const auto [b, e] = logical_block(options.logical_replicas, cluster.num_workers, cluster.rank);
  return e - b;
}

}  // namespace

std::string world_size_independent_key(const std::string& run_id) {
  return str_cat("dtrain/", run_id, "/state/logical_replicas");
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const MultiWorkerOptions& options)
    : MultiWorkerMirroredStrategy(options, options.cluster ? *options.cluster : resolve_cluster()) {
}

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const MultiWorkerOptions& options,
                                                         ClusterSpec cluster)
    : MirroredStrategy(local_replica_count(options, cluster),
                       {.blas_threads = options.blas_threads,
                        .report_tensorboard = options.report_tensorboard,
                        .logdir = options.logdir}),
      cluster_(std::move(cluster)) {
  DTRAIN_CHECK(options.local_replicas >= 1, "MultiWorkerMirroredStrategy: local_replicas is ",
               options.local_replicas, ", must be >= 1");
  if (options.logical_replicas > 0) {
    logical_replicas_ = options.logical_replicas;
    first_logical_ = logical_block(logical_replicas_, cluster_.num_workers, cluster_.rank).first;
    logical_ = std::make_unique<LogicalReplicaReduction>(logical_replicas_);
  }
  if (!cluster_.is_worker()) {
    throw InvalidArgumentError(str_cat(
        "MultiWorkerMirroredStrategy: this task is \"", cluster_.task_type, "\" ",
        cluster_.task_index, " (from ", cluster_.source,
        "); only \"chief\" and \"worker\" tasks take part (run an evaluator or ps separately)"));
  }
  const std::string run_id = !options.run_id.empty()    ? options.run_id
                             : !cluster_.run_id.empty() ? cluster_.run_id
                                                        : "default";
  const std::optional<int64_t> generation =
      options.generation ? options.generation : cluster_.generation;

  std::string url;  // the rendezvous, when this strategy opens it
  if (options.store) {
    store_ = options.store;
  } else if (cluster_.num_workers == 1) {
    store_ = std::make_shared<InMemoryKeyValueStore>();
  } else {
    url = !options.rendezvous.empty() ? options.rendezvous : cluster_.rendezvous;
    if (url.empty()) {
      const std::string chief =
          cluster_.worker_addresses.empty() ? "" : cluster_.worker_addresses[0];
      if (chief.empty() || chief.find(':') == std::string::npos) {
        throw FailedPreconditionError(
            str_cat("MultiWorkerMirroredStrategy: no rendezvous configured and the cluster (from ",
                    cluster_.source,
                    ") names no chief host:port to serve one; set DTRAIN_RDZV or "
                    "MultiWorkerOptions::rendezvous (file:///shared/dir, redis://host:port or the "
                    "host:port of a coordination service)"));
      }
      if (cluster_.rank == 0) {
        // Serve on every interface at the chief's port, as a TF server does.
        const std::string port = chief.substr(chief.rfind(':') + 1);
        server_ = std::make_unique<CoordinationServer>(
            CoordinationServerOptions{.address = "0.0.0.0:" + port});
      }
      url = chief;
    }
    if (url.find("://") == std::string::npos) {  // a coordination service's host:port
      store_ = std::make_shared<CoordinationClient>(
          url, CoordinationClientOptions{.connect_timeout = options.timeout});
    } else {
      store_ = open_store(url);
    }
  }
  std::string host = !options.host.empty() ? options.host : cluster_.host;
  if (host.empty()) host = cluster_.num_workers == 1 ? "127.0.0.1" : default_host(url);
  connect_options_ = {.rank = cluster_.rank,
                      .world_size = cluster_.num_workers,
                      .host = host,
                      .task = str_cat(cluster_.task_type, ":", cluster_.task_index),
                      .timeout = options.timeout,
                      .bucket_bytes = options.bucket_bytes,
                      .algorithm = options.algorithm,
                      .run_id = run_id,
                      .generation = generation};
  collectives_ = Collectives::connect(store_, connect_options_);
  check_same_build(*store_, run_id, *collectives_, options.timeout);
  if (logical_replicas_ > 0 && cluster_.rank == 0) {
    store_->set(world_size_independent_key(run_id), std::to_string(logical_replicas_));
  }
  DTRAIN_CHECK(!options.overlap_gradients || options.overlap_bucket_bytes > 0,
               "MultiWorkerMirroredStrategy: overlap_bucket_bytes must be positive");
  overlap_gradients_ = options.overlap_gradients;
  overlap_bucket_bytes_ = options.overlap_bucket_bytes;
  DTRAIN_CHECK(options.shard_optimizer_state >= 0 && options.shard_optimizer_state <= 2,
               "MultiWorkerMirroredStrategy: shard_optimizer_state is ",
               options.shard_optimizer_state, ", must be 0, 1 or 2");
  if (options.shard_optimizer_state > 0 && options.local_replicas != 1) {
    throw InvalidArgumentError(str_cat(
        "MultiWorkerMirroredStrategy: shard_optimizer_state ", options.shard_optimizer_state,
        " needs local_replicas = 1 (got ", options.local_replicas, ")"));
  }
  shard_optimizer_state_ = options.shard_optimizer_state;
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

void MultiWorkerMirroredStrategy::rejoin(int64_t generation) {
  DTRAIN_CHECK(generation >= 0, "MultiWorkerMirroredStrategy::rejoin: generation ", generation,
               " must be >= 0");
  // The failed context's pairs are closed (a broken context skips its closing barrier).
  collectives_.reset();
  connect_options_.generation = generation;
  cluster_.generation = generation;
  collectives_ = Collectives::connect(store_, connect_options_);
  check_same_build(*store_, connect_options_.run_id, *collectives_, connect_options_.timeout);
}

int MultiWorkerMirroredStrategy::num_replicas_in_sync() const {
  return logical_replicas_ > 0 ? logical_replicas_ : Strategy::num_replicas_in_sync();
}

int MultiWorkerMirroredStrategy::replica_id(int local) const {
  return logical_replicas_ > 0 ? first_logical_ + local : Strategy::replica_id(local);
}

void MultiWorkerMirroredStrategy::reduce_gradients(std::span<const std::vector<Tensor>> per_replica,
                                                   std::span<Tensor> out, ReduceOp op,
                                                   const ReduceGradientsOptions& options) {
  if (logical_replicas_ == 0) {
    Strategy::reduce_gradients(per_replica, out, op, options);
    return;
  }
  for (size_t v = 0; v < out.size(); ++v) {
    DTRAIN_CHECK(out[v].defined() &&
                     (out[v].dtype() == DType::kFloat32 || out[v].dtype() == DType::kFloat64),
                 name(), "::reduce_gradients: output ", v, " must be a defined float tensor");
  }
  const bool several = num_workers() > 1;
  logical_->gather(several ? collectives_.get() : nullptr, per_replica, out);
  if (several && !options.extra.empty()) collectives_->all_reduce(options.extra, ReduceOp::kSum);
  const double scale = op == ReduceOp::kMean ? 1.0 / logical_replicas_ : 1.0;
  const int n = num_local_replicas();
  const LogicalReplicaReduction* reduction = logical_.get();
  const auto* then = options.then;
  auto part = [reduction, out, n, scale, then](int r) {
    reduction->sum(out, r, n, scale);
    if (then != nullptr) (*then)(r, n);
  };
  if (n == 1) {
    part(0);
  } else {
    run(part);
  }
}

void MultiWorkerMirroredStrategy::all_reduce_across_workers(std::span<Tensor> tensors,
                                                            ReduceOp op) {
  collectives_->all_reduce(tensors, op);
}

void MultiWorkerMirroredStrategy::broadcast_from_chief(std::span<Tensor> tensors) {
  collectives_->broadcast(tensors, 0);
}

double MultiWorkerMirroredStrategy::all_reduce_scalar(double value, ReduceOp op) {
  return collectives_->all_reduce_scalar(value, op);
}

std::unique_ptr<OverlappedGradientReduction> MultiWorkerMirroredStrategy::make_overlapped_reduction(
    std::span<Tensor> out, std::span<Tensor> extra) {
  if (!overlap_gradients_ || num_workers() == 1 || num_local_replicas() != 1 ||
      logical_replicas_ > 0) {
    return nullptr;
  }
  return std::make_unique<OverlappedGradientReduction>(*collectives_, out, extra,
                                                       overlap_bucket_bytes_);
}

std::unique_ptr<ShardedOptimizerUpdate> MultiWorkerMirroredStrategy::make_sharded_update(
    std::span<Variable* const> vars, std::span<Tensor> extra, optim::Optimizer& optimizer) {
  if (shard_optimizer_state_ == 0) return nullptr;
  return std::make_unique<ShardedOptimizerUpdate>(*collectives_, vars, extra,
                                                  shard_optimizer_state_, optimizer);
}

void MultiWorkerMirroredStrategy::barrier() { collectives_->barrier(); }

void MultiWorkerMirroredStrategy::all_gather_across_workers(const Tensor& local, Tensor& out) {
  collectives_->all_gather(local, out);
}

}  // namespace dtrain::distribute
