// Splitting global batches across replicas and workers (TF's per-replica batches).
#include "dtrain/distribute/input.h"

#include <cstring>

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

std::pair<int64_t, int64_t> worker_rows(int64_t batch_rows, int num_replicas, int first_replica,
                                        int last_replica) {
  DTRAIN_CHECK(first_replica <= last_replica, "worker_rows: replicas ", first_replica, "..",
               last_replica, " are not a range");
  return {replica_rows(batch_rows, num_replicas, first_replica).first,
          replica_rows(batch_rows, num_replicas, last_replica).second};
}

std::pair<int64_t, int64_t> worker_rows(int64_t batch_rows, const Strategy& strategy) {
  return worker_rows(batch_rows, strategy.num_replicas_in_sync(), strategy.replica_id(0),
                     strategy.replica_id(strategy.num_local_replicas() - 1));
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

namespace {

// Rows `indices` of each component, gathered into tensors of `capacity` rows (the worker's part
// of a full batch, so that every batch of a pass comes from one allocator free list) and sliced
// to the rows given. Shuffled rows come from all over memory: the rows a few places ahead are
// prefetched while one is copied (as data::Dataset::batch does).
void gather_rows(const std::vector<Tensor>& sources, const int64_t* indices, int64_t rows,
                 int64_t capacity, data::Element& out) {
  constexpr int64_t kAhead = 4;
  constexpr size_t kLine = 64;
  for (size_t c = 0; c < sources.size(); ++c) {
    const Tensor& source = sources[c];
    Tensor batch(source.dtype(), source.shape().without_first().with_first(capacity));
    const size_t row_bytes = source.nbytes() / static_cast<size_t>(source.dim(0));
    const auto* src = static_cast<const char*>(source.raw_data());
    auto* dst = static_cast<char*>(batch.raw_data());
    auto prefetch = [&](int64_t r) {
      const char* p = src + indices[r] * row_bytes;
      for (size_t off = 0; off < row_bytes; off += kLine) __builtin_prefetch(p + off, 0, 0);
    };
    for (int64_t r = 0; r < std::min(kAhead, rows); ++r) prefetch(r);
    for (int64_t r = 0; r < rows; ++r) {
      if (r + kAhead < rows) prefetch(r + kAhead);
      std::memcpy(dst + r * row_bytes, src + indices[r] * row_bytes, row_bytes);
    }
    out.push_back(rows == capacity ? std::move(batch) : batch.slice(0, rows));
  }
}

}  // namespace

data::Dataset worker_batches(std::vector<Tensor> components, const WorkerBatchesOptions& options,
                             int num_replicas, int first_replica, int last_replica) {
  DTRAIN_CHECK(options.batch_size >= 1, "worker_batches: batch_size must be positive, got ",
               options.batch_size);
  DTRAIN_CHECK(first_replica >= 0 && first_replica <= last_replica && last_replica < num_replicas,
               "worker_batches: replicas ", first_replica, "..", last_replica, " out of range for ",
               num_replicas, " replicas");
  // from_tensor_slices checks the components (defined, not scalars, equal first dimensions).
  (void)data::Dataset::from_tensor_slices(components);
  const int64_t n = components[0].dim(0);
  Tensor indices(DType::kInt64, Shape{n});
  for (int64_t i = 0; i < n; ++i) indices.data<int64_t>()[i] = i;
  // The shuffle's draws and moves do not depend on what it shuffles, so the permutation of the
  // indices is the permutation of the rows (and batching indices stacks the same rows).
  data::Dataset ds = data::Dataset::from_tensor_slices({indices});
  if (options.shuffle) ds = ds.shuffle(n, options.seed, /*reshuffle_each_iteration=*/true);
  const int64_t capacity = [&] {
    const auto [b, e] = worker_rows(options.batch_size, num_replicas, first_replica, last_replica);
    return e - b;
  }();
  return ds.batch(options.batch_size)
      .map([sources = std::move(components), num_replicas, first_replica, last_replica,
            capacity](data::Element e) {
        const Tensor& global = e[0];
        const int64_t rows = global.dim(0);
        const auto [b, end] = worker_rows(rows, num_replicas, first_replica, last_replica);
        data::Element out;
        out.reserve(sources.size() + 1);
        gather_rows(sources, global.data<int64_t>() + b, end - b, capacity, out);
        Tensor count(DType::kInt64, Shape{});
        count.data<int64_t>()[0] = rows;
        out.push_back(std::move(count));
        return out;
      });
}

data::Dataset worker_batches(std::vector<Tensor> components, const WorkerBatchesOptions& options,
                             const Strategy& strategy) {
  return worker_batches(std::move(components), options, strategy.num_replicas_in_sync(),
                        strategy.replica_id(0),
                        strategy.replica_id(strategy.num_local_replicas() - 1));
}

}  // namespace dtrain::distribute
