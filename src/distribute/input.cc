// Splitting global batches across replicas and workers (TF's per-replica batches).
#include "dtrain/distribute/input.h"

#include "dtrain/core/error.h"

namespace dtrain::distribute {

std::pair<int64_t, int64_t> replica_rows(int64_t batch_rows, int num_replicas, int replica) {
  DTRAIN_CHECK(num_replicas >= 1 && replica >= 0 && replica < num_replicas,
               "replica_rows: replica ", replica, " out of range for ", num_replicas, " replicas");
  DTRAIN_CHECK(batch_rows >= 0, "replica_rows: negative batch size ", batch_rows);
  const int64_t base = batch_rows / num_replicas, extra = batch_rows % num_replicas;
  const int64_t begin = replica * base + std::min<int64_t>(replica, extra);
  return {begin, begin + base + (replica < extra ? 1 : 0)};
}

std::pair<int64_t, int64_t> worker_rows(int64_t batch_rows, const Strategy& strategy) {
  const int n = strategy.num_replicas_in_sync();
  const int first = strategy.replica_id(0);
  const int last = strategy.replica_id(strategy.num_local_replicas() - 1);
  return {replica_rows(batch_rows, n, first).first, replica_rows(batch_rows, n, last).second};
}

Tensor replica_slice(const Tensor& worker_batch, const Strategy& strategy, int local_replica) {
  DTRAIN_CHECK(worker_batch.defined() && worker_batch.rank() >= 1,
               "replica_slice: the batch must have a batch dimension, got ",
               worker_batch.defined() ? worker_batch.to_string(0) : "an undefined tensor");
  DTRAIN_CHECK(local_replica >= 0 && local_replica < strategy.num_local_replicas(),
               "replica_slice: local replica ", local_replica, " out of range for ",
               strategy.num_local_replicas());
  const auto [b, e] =
      replica_rows(worker_batch.dim(0), strategy.num_local_replicas(), local_replica);
  return worker_batch.slice(b, e);
}

data::Element replica_slice(const data::Element& worker_batch, const Strategy& strategy,
                            int local_replica) {
  data::Element out;
  out.reserve(worker_batch.size());
  for (const Tensor& t : worker_batch) out.push_back(replica_slice(t, strategy, local_replica));
  return out;
}

data::Dataset distribute_dataset(const data::Dataset& global_batches, const Strategy& strategy) {
  if (strategy.num_workers() == 1) return global_batches;
  const int n = strategy.num_replicas_in_sync();
  const int first = strategy.replica_id(0);
  const int last = strategy.replica_id(strategy.num_local_replicas() - 1);
  return global_batches.map([n, first, last](data::Element e) {
    for (Tensor& t : e) {
      DTRAIN_CHECK(t.rank() >= 1, "distribute_dataset: element component ", t.to_string(0),
                   " has no batch dimension; batch the dataset by the global batch size first");
      const int64_t b = replica_rows(t.dim(0), n, first).first;
      const int64_t end = replica_rows(t.dim(0), n, last).second;
      t = t.slice(b, end);
    }
    return e;
  });
}

}  // namespace dtrain::distribute
