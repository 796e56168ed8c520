// Sharded saves (ShardedSaveOptions): every worker writes its rows of the partitioned variables
// and their slots as its own data shard; the chief merges the workers' index entries, which it
// receives over the job's all-gather (it never reads another worker's data file), writes the one
// index, and commits. Three all-gathers per save:
//   1. start: the chief has dropped the prefix from the state file (Checkpoint::save), so no
//      worker overwrites a data file that a committed checkpoint still names;
//   2. entries: each worker's entries once its shard is durable, or its error;
//   3. done: the chief's result (index written and committed, or its error).
// A worker that dies anywhere breaks an all-gather, so the chief never writes the index and the
// checkpoint never counts; the previous checkpoints are other prefixes and stay untouched.
#include <cstring>
#include <exception>
#include <map>

#include "checkpoint_state.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/core/partition.h"
#include "graph_view.h"

namespace dtrain::checkpoint {

namespace {

constexpr char kOk = '+';
constexpr char kFailed = '!';

// Rows [b, e) of a full tensor, copied.
Tensor cut_rows(const Tensor& full, int64_t b, int64_t e) {
  Shape shape = full.shape();
  const size_t row_bytes = shape[0] == 0 ? 0 : full.nbytes() / static_cast<size_t>(shape[0]);
  shape[0] = e - b;
  Tensor out(full.dtype(), shape);
  std::memcpy(out.raw_data(),
              static_cast<const char*>(full.raw_data()) + static_cast<size_t>(b) * row_bytes,
              out.nbytes());
  return out;
}

}  // namespace

void Checkpoint::set_sharding(std::optional<ShardedSaveOptions> options) {
  if (options) {
    DTRAIN_CHECK(
        options->num_shards >= 1 && options->rank >= 0 && options->rank < options->num_shards,
        "Checkpoint::set_sharding: rank ", options->rank, " of ", options->num_shards, " shards");
    DTRAIN_CHECK(options->all_gather != nullptr || options->num_shards == 1,
                 "Checkpoint::set_sharding: a sharded save needs all_gather");
    for (const Variable* v : options->partitioned) {
      DTRAIN_CHECK(v != nullptr, "Checkpoint::set_sharding: a null partitioned variable");
    }
  }
  sharding_ = std::move(options);
}

void Checkpoint::write_sharded(const std::string& prefix, const CommitFn& commit) {
  const ShardedSaveOptions& so = *sharding_;
  const int rank = so.rank, n = so.num_shards;
  const bool sync = options_.sync_to_disk;
  auto gather = [&](const std::string& mine) {
    if (n == 1) return std::vector<std::string>{mine};
    std::vector<std::string> all = so.all_gather(mine);
    DTRAIN_CHECK(static_cast<int>(all.size()) == n, "sharded save of ", prefix,
                 ": all_gather returned ", all.size(), " values for ", n, " workers");
    return all;
  };
  auto check = [&](const std::vector<std::string>& all, const char* stage,
                   const std::exception_ptr& mine) {
    for (int r = 0; r < n; ++r) {
      const std::string& s = all[static_cast<size_t>(r)];
      if (!s.empty() && s[0] == kOk) continue;
      if (r == rank && mine) std::rethrow_exception(mine);
      throw UnavailableError(str_cat("sharded save of ", prefix, ": worker ", r, " failed to ",
                                     stage, ": ",
                                     s.empty() ? std::string("(no answer)") : s.substr(1)));
    }
  };

  const auto view = detail::GraphView::build(root_ ? &*root_ : nullptr, root_children());
  std::vector<Shape> shapes;
  std::map<const Variable*, int> index;
  for (const Variable* v : so.partitioned) {
    DTRAIN_CHECK(index.emplace(v, static_cast<int>(shapes.size())).second,
                 "sharded save: variable '", v->name(), "' is partitioned twice");
    shapes.push_back(v->tensor().shape());
  }
  const RowPartition partition = partition_rows(shapes, n);
  // Per partitioned variable: which shards hold rows of it, and this worker's rows.
  struct Rows {
    int shards_with_rows = 0;
    int only_shard = -1;
    int64_t begin = 0, end = 0;  // this worker's
  };
  std::vector<Rows> rows(shapes.size());
  for (int k = 0; k < n; ++k) {
    for (const RowSlice& s : partition.shards[static_cast<size_t>(k)]) {
      if (s.row_end <= s.row_begin) continue;
      Rows& r = rows[static_cast<size_t>(s.variable)];
      ++r.shards_with_rows;
      r.only_shard = k;
      if (k == rank) {
        r.begin = s.row_begin;
        r.end = s.row_end;
      }
    }
  }

  check(gather(std::string(1, kOk)), "start the save", nullptr);  // 1. start

  std::string mine;  // 2. this worker's entries
  std::exception_ptr error;
  try {
    BundleWriter w(
        prefix,
        BundleWriterOptions{.sync = sync, .sync_directory = false, .shard = rank, .num_shards = n});
    if (rank == 0) w.add_strings(kObjectGraphKey, {view.graph.serialize()}, Shape{});
    for (const detail::SavedValue& v : view.values) {
      const Variable* owner = v.slot_of ? v.slot_of : v.variable;
      auto it = owner ? index.find(owner) : index.end();
      // A slot of another shape than its variable (a factored second moment, say) is not cut
      // by the variable's rows: the chief writes it whole.
      if (it != index.end() && v.slot_of && !so.rows &&
          v.get().shape() != shapes[static_cast<size_t>(it->second)]) {
        it = index.end();
      }
      if (it == index.end()) {
        if (rank == 0) w.add(v.key, v.get());  // not partitioned: the chief writes it whole
        continue;
      }
      const Rows& r = rows[static_cast<size_t>(it->second)];
      const Shape& shape = shapes[static_cast<size_t>(it->second)];
      auto rows_of = [&](int64_t b, int64_t e) {
        if (so.rows) {
          Tensor t = so.rows->rows(*owner, v.slot, b, e);
          Shape want = shape;
          want[0] = e - b;
          DTRAIN_CHECK(t.defined() && t.shape() == want && t.dtype() == owner->dtype(),
                       "sharded save: the RowSource gave ", t.defined() ? t.to_string(0) : "none",
                       " for rows [", b, ", ", e, ") of '", v.key, "', expected shape ",
                       want.to_string());
          return t;
        }
        return cut_rows(v.get(), b, e);
      };
      if (r.shards_with_rows <= 1) {
        // All of it in one shard (a scalar, a small variable): a plain entry of that worker.
        const int holder = r.only_shard < 0 ? 0 : r.only_shard;
        if (holder != rank) continue;
        w.add(v.key, shape.rank() == 0 || so.rows == nullptr ? v.get() : rows_of(0, shape[0]));
        continue;
      }
      if (r.end <= r.begin) continue;
      w.add_slice(v.key, shape, TensorSlice::rows(shape.rank(), r.begin, r.end),
                  rows_of(r.begin, r.end));
    }
    const BundleEntries entries = w.finish_shard();
    if (sync) sync_directory(prefix_directory(prefix));
    mine = kOk + serialize_bundle_entries(entries);
  } catch (const std::exception& e) {
    error = std::current_exception();
    mine = kFailed + std::string(e.what());
  }
  const std::vector<std::string> all = gather(mine);
  check(all, "write its shard", error);

  std::string result(1, kOk);  // 3. the chief's index and commit
  if (rank == 0) {
    try {
      BundleEntries merged;
      for (int r = 0; r < n; ++r) {
        const std::string what = str_cat("the entries of shard ", r, " of ", prefix);
        merge_bundle_entries(
            merged,
            parse_bundle_entries(std::string_view(all[static_cast<size_t>(r)]).substr(1), what),
            what);
      }
      write_bundle_index(prefix, n, merged, sync);
      if (commit) commit({prefix});
    } catch (const std::exception& e) {
      error = std::current_exception();
      result = kFailed + std::string(e.what());
    }
  }
  const std::vector<std::string> done = gather(result);
  if (!done[0].empty() && done[0][0] == kOk) return;
  if (rank == 0 && error) std::rethrow_exception(error);
  throw UnavailableError(str_cat("sharded save of ", prefix,
                                 ": the chief failed to write the index: ",
                                 done[0].empty() ? std::string("(no answer)") : done[0].substr(1)));
}

}  // namespace dtrain::checkpoint
