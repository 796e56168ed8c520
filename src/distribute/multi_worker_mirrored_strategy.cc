// MultiWorkerMirroredStrategy: cluster resolution, choice of rendezvous, Gloo collectives.
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"

#include <unistd.h>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/rendezvous.h"

namespace dtrain::distribute {
namespace {

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "127.0.0.1";
  return buf;
}

}  // namespace

MultiWorkerMirroredStrategy::MultiWorkerMirroredStrategy(const MultiWorkerOptions& options)
    : MirroredStrategy(options.local_replicas, {.blas_threads = options.blas_threads,
                                                .report_tensorboard = options.report_tensorboard,
                                                .logdir = options.logdir}),
      cluster_(options.cluster ? *options.cluster : resolve_cluster()) {
  DTRAIN_CHECK(options.local_replicas >= 1, "MultiWorkerMirroredStrategy: local_replicas is ",
               options.local_replicas, ", must be >= 1");
  if (!cluster_.is_worker()) {
    throw InvalidArgumentError(str_cat(
        "MultiWorkerMirroredStrategy: this task is \"", cluster_.task_type, "\" ",
        cluster_.task_index, " (from ", cluster_.source,
        "); only \"chief\" and \"worker\" tasks take part (run an evaluator or ps separately)"));
  }
  std::string host = !options.host.empty() ? options.host : cluster_.host;
  if (host.empty()) host = cluster_.num_workers == 1 ? "127.0.0.1" : this_hostname();
  const std::string run_id = !options.run_id.empty()    ? options.run_id
                             : !cluster_.run_id.empty() ? cluster_.run_id
                                                        : "default";
  const std::optional<int64_t> generation =
      options.generation ? options.generation : cluster_.generation;

  if (options.store) {
    store_ = options.store;
  } else if (cluster_.num_workers == 1) {
    store_ = std::make_shared<InMemoryKeyValueStore>();
  } else {
    std::string url = !options.rendezvous.empty() ? options.rendezvous : cluster_.rendezvous;
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
  collectives_ =
      Collectives::connect(store_, {.rank = cluster_.rank,
                                    .world_size = cluster_.num_workers,
                                    .host = host,
                                    .task = str_cat(cluster_.task_type, ":", cluster_.task_index),
                                    .timeout = options.timeout,
                                    .bucket_bytes = options.bucket_bytes,
                                    .algorithm = options.algorithm,
                                    .run_id = run_id,
                                    .generation = generation});
}

MultiWorkerMirroredStrategy::~MultiWorkerMirroredStrategy() = default;

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

void MultiWorkerMirroredStrategy::barrier() { collectives_->barrier(); }

void MultiWorkerMirroredStrategy::all_gather_across_workers(const Tensor& local, Tensor& out) {
  collectives_->all_gather(local, out);
}

}  // namespace dtrain::distribute
