// Object-based checkpoints with tf.train.Checkpoint's semantics and TensorFlow's on-disk format:
//
//   checkpoint::Checkpoint ckpt({{"model", model}, {"optimizer", *optimizer}, {"epoch", epoch}});
//   std::string path = ckpt.save("/tmp/run/ckpt");        // "/tmp/run/ckpt-1", state file updated
//   ckpt.restore(*checkpoint::latest_checkpoint("/tmp/run")).assert_consumed();
//
// A Checkpoint saves the object graph reachable from its root under TF2's keys
// ("model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE",
// ".../.OPTIMIZER_SLOT/optimizer/m/...", "save_counter/...") with the serialized
// TrackableObjectGraph under "_CHECKPOINTABLE_OBJECT_GRAPH", as a TensorBundle V2
// (tensor_bundle.h), so tf.train.load_checkpoint and tf.train.Checkpoint.restore read it.
// docs/checkpoints.md has the key scheme, the crash-safety guarantees and the async semantics.
// A Checkpoint holds references to the objects it tracks (they must outlive it) and is not
// thread-safe: one thread calls save/write/restore/sync; with enable_async a small pool of
// writer threads of its own writes and commits.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/random.h"
#include "dtrain/core/tensor.h"

namespace dtrain::nn {
class Layer;
}
namespace dtrain::optim {
class Optimizer;
}
namespace dtrain::data {
class Dataset;
class Iterator;
struct IteratorState;
}  // namespace dtrain::data

namespace dtrain::checkpoint {

class BundleReader;
struct BundleBytes;

namespace detail {
struct TrackableExtra;
struct GraphView;
class AsyncWriter;
class SpareFiles;
}  // namespace detail

// Something a checkpoint can save and restore: a reference to a model, layer, optimizer,
// variable, counter, RNG or data iterator, or a container of named trackables. Converts
// implicitly from the objects it adapts, so checkpoints read like TF's keyword arguments. Holds
// a reference: the object must outlive every Checkpoint that tracks it.
class Trackable {
 public:
  // A layer or model. Sequential models name their layers "layer_with_weights-<j>" (layers
  // with weights) and "layer-<i>" (all layers but InputLayer), as Keras does; subclassed models
  // use layer_attributes(). A layer's variables are named by the part of their name after
  // "<layer name>/" ("kernel", "bias").
  Trackable(nn::Layer& layer);
  // An optimizer: its iteration counter under "iter" (int64) and its slot variables under
  // "<variable path>/.OPTIMIZER_SLOT/<optimizer path>/<slot name>" for every variable of the
  // same checkpoint that has slots. Missing slots are created (optimizer.build) on restore when
  // the checkpoint holds values for them, as Keras does.
  Trackable(optim::Optimizer& optimizer);
  // A variable (any dtype), saved as VARIABLE_VALUE.
  Trackable(Variable& variable);
  // A step or epoch counter, saved as an int64 scalar VARIABLE_VALUE.
  Trackable(int64_t& counter);
  // An RNG's state, saved as RNG_STATE: int64 [2] = {seed, counter} (bit patterns).
  Trackable(RngState& state);
  Trackable(Philox& rng);
  // A data iterator position, saved as ITERATOR_STATE: int64 [2] = {iteration, position}.
  Trackable(data::IteratorState& state);
  // A live iterator over `dataset`: saves iterator.state(); restore replaces `iterator` with
  // dataset.iterator_from(restored state), which resumes with exactly the next element.
  static Trackable iterator(const data::Dataset& dataset, data::Iterator& iterator);
  // Any value: `get` returns the current value (called at save time, and at restore time to
  // learn the dtype and shape to expect); `set` receives a restored value of that dtype and
  // shape. Saved as VARIABLE_VALUE.
  static Trackable value(std::function<Tensor()> get, std::function<void(const Tensor&)> set);
  // A container (like a tf.Module with attributes): a node with named children.
  static Trackable object(std::vector<std::pair<std::string, Trackable>> children);

 private:
  friend struct detail::GraphView;
  enum class Kind : uint8_t {
    kLayer,
    kOptimizer,
    kVariable,
    kCounter,
    kRngState,
    kPhilox,
    kIteratorState,
    kIterator,
    kValue,
    kObject
  };
  Trackable(Kind kind, void* ptr) : kind_(kind), ptr_(ptr) {}
  const void* identity() const;

  Kind kind_;
  void* ptr_ = nullptr;
  std::shared_ptr<const detail::TrackableExtra> extra_;  // kIterator, kValue, kObject
};

struct CheckpointOptions {
  bool enable_async = false;  // save()/write() snapshot the values into memory and return;
                              // background threads write (tf.train.CheckpointOptions)
  bool sync_to_disk = true;   // fsync files and directories; false only where durability does
                              // not matter (tests on tmpfs, benchmarks of the format itself)
  int max_in_flight = 32;     // async: snapshots queued or being written at once, written
                              // concurrently (a writer thread each, started as needed: their
                              // fsyncs overlap) and committed in save order; save() blocks
                              // while the queue is full. 1: each save waits for the previous one
  int64_t max_in_flight_bytes = int64_t{256} << 20;  // async: and at most this many bytes of
                                                     // snapshots (one snapshot always fits)
};

// Where a sharded save gets the rows of a partitioned value (docs/checkpoints.md, "Sharded
// checkpoints"). Under a replicated strategy every worker holds the full tensors and the default
// (no RowSource) cuts the rows from them; under sharded optimizer state (ZeRO) a worker holds
// only its partition of the slots and hands out those rows itself. Called on the saving thread.
class RowSource {
 public:
  virtual ~RowSource() = default;
  // Rows [row_begin, row_end) of `variable` (slot empty) or of its optimizer slot `slot` ("m",
  // "v", "momentum"...): a tensor of the variable's dtype and shape [row_end - row_begin,
  // shape[1:]...]. Only rows that partition_rows gives this worker are asked for.
  virtual Tensor rows(const Variable& variable, const std::string& slot, int64_t row_begin,
                      int64_t row_end) = 0;
};

// A sharded save (Checkpoint::set_sharding): every one of num_shards workers writes its own data
// shard `<prefix>.data-<rank>-of-<num_shards>`, holding its rows (partition_rows of
// `partitioned`'s shapes, dtrain/core/partition.h) of each partitioned variable and of that
// variable's optimizer slots, as TensorBundle slices; the chief (rank 0) also writes every other
// value and the object graph, then, once every worker has committed its shard, the one index
// (num_shards = N) from the entries the workers sent it, and only then commits the checkpoint.
struct ShardedSaveOptions {
  int rank = 0;        // this worker
  int num_shards = 1;  // workers writing the checkpoint
  // The variables partitioned across the shards, in partition order (the model's trainable
  // variables, as sharded optimizer state orders them); their slots get the same rows. A
  // variable whose rows all fall in one shard is written whole by that worker.
  std::vector<const Variable*> partitioned;
  // Every worker's `mine`, indexed by rank: an all-gather over the job's collective channel
  // (every worker calls it the same number of times, three per save). Throws when a peer is lost.
  std::function<std::vector<std::string>(const std::string& mine)> all_gather;
  RowSource* rows = nullptr;  // null: rows of the full tensors
};

// What restore() matched. TF's CheckpointLoadStatus: the assertions throw
// FailedPreconditionError listing the keys involved. Destroying a status whose checkpoint had
// values that nothing consumed warns (through the warning handler) unless expect_partial() or an
// assertion was called. Copies share one state; thread-compatible.
class CheckpointLoadStatus {
 public:
  // Every value in the checkpoint was restored into an object, and every object of the
  // checkpoint's graph received a value. Returns *this.
  const CheckpointLoadStatus& assert_consumed() const;
  // Every object of the checkpoint's graph received a value (the checkpoint may hold more).
  const CheckpointLoadStatus& assert_existing_objects_matched() const;
  // Silences the warning about unconsumed values.
  const CheckpointLoadStatus& expect_partial() const;

  // The checkpoint prefix restored from.
  const std::string& save_path() const;
  // Checkpoint keys restored into nothing (the object graph key excluded), sorted.
  const std::vector<std::string>& unused_keys() const;
  // Keys of this checkpoint's objects that the checkpoint lacks.
  const std::vector<std::string>& missing_keys() const;
  // Number of values restored.
  size_t restored_count() const;

 private:
  friend class Checkpoint;
  struct State;
  std::shared_ptr<State> state_;
};

class Checkpoint {
 public:
  // A root with named children: Checkpoint({{"model", model}, {"optimizer", *optimizer}}).
  explicit Checkpoint(std::vector<std::pair<std::string, Trackable>> children,
                      CheckpointOptions options = {});
  // `root` itself as the root object (keys start at its children, as with Keras's
  // model.save_weights(prefix) in TF format).
  explicit Checkpoint(Trackable root, CheckpointOptions options = {});
  // Waits for the pending async writes; an error they raised is reported through the warning
  // handler (a destructor cannot throw).
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // Increments save_counter and writes `<file_prefix>-<save_counter>` (data, then index), then
  // commits it by rewriting `<dir>/checkpoint` to name it as the newest (up to 9 earlier entries
  // whose files still exist stay listed, so restore_latest can fall back to them). Returns the
  // written prefix. Sync: blocks until everything is fsynced. Async: returns after snapshotting
  // the values; a writer thread writes it and commits it after every earlier save; blocks only
  // while max_in_flight snapshots are pending (and for the earlier writes when it overwrites a
  // prefix that is pending or committed). Rethrows, once, an earlier async write's error that
  // has been detected by then. Throws ResourceExhaustedError on a full disk and other Errors
  // naming the file; the previous checkpoints stay intact.
  std::string save(const std::string& file_prefix);
  // Writes `file_prefix` as given, without save_counter increment or state-file update
  // (tf.train.Checkpoint.write). Returns `file_prefix`. Blocks and throws like save().
  std::string write(const std::string& file_prefix);

  // Restores every value the checkpoint at `save_path` (a prefix, e.g. from
  // latest_checkpoint()) holds for this checkpoint's objects, including save_counter. A
  // checkpoint without an object graph (TF1 style) is matched by variable names instead of
  // object paths. All matched tensors are read and CRC-verified before any object is changed,
  // so a failed restore leaves every object as it was. A variable whose buffer no view or other
  // Tensor handle shares then takes the buffer its value was read into (no copy; its tensor()
  // is a new buffer); one that is shared is copied into. Waits for pending async writes first.
  // Throws NotFoundError (no `<save_path>.index`), DataLossError naming the file and the tensor
  // (corrupt, torn or truncated checkpoint), InvalidArgumentError (a value whose dtype or
  // shape differs from the object's, naming both), FailedPreconditionError (the checkpoint has
  // values for layers of a model that are not built yet: build the model first; restoring is
  // not deferred).
  CheckpointLoadStatus restore(const std::string& save_path);
  // restore() from a checkpoint's files held in memory (a snapshot received from a peer):
  // `save_path` names it in errors and in the status. Throws as restore() does, DataLossError
  // naming the checkpoint for corrupt or short bytes.
  CheckpointLoadStatus restore(const std::string& save_path, const BundleBytes& bytes);
  // Restores the newest committed checkpoint named by `<directory>/checkpoint`; when it is
  // missing or corrupt (DataLossError), warns and falls back to the next newer committed one.
  // Returns nullopt when the directory has no committed checkpoint. Throws DataLossError when
  // every committed checkpoint is corrupt, and restore()'s other errors.
  std::optional<CheckpointLoadStatus> restore_latest(const std::string& directory);

  // Waits until every pending async write is on disk and committed (or discarded after an
  // earlier failure); rethrows the first error (once).
  void sync();

  // Number of save() calls, including those of the checkpoint this one was restored from.
  int64_t save_counter() const;
  const CheckpointOptions& options() const { return options_; }
  // The bundle keys a save would write now, sorted (without the object graph key).
  std::vector<std::string> keys();
  // What a save would write now, for writers that lay a bundle out themselves (the in-memory
  // snapshots, src/train/snapshot_slots.h): the serialized object graph (the
  // kObjectGraphKey string) and every value under its key, uncopied (a variable's own storage:
  // read it before the value changes). With `count_save`, counts a save first as save() does
  // (save_counter + 1, tracked from then on). Nothing is written. A writer that asks every few
  // steps pays for the object graph's walk and serialization once: they are kept and reused
  // while no variable was created or destroyed in this process since (Variable::
  // lifetime_events) and the save counter's tracking is unchanged; only the values are read
  // afresh through the kept walk. The tracked objects must not change their children otherwise
  // (a fit() callback's objects do not).
  struct Contents {
    std::string graph;
    std::vector<std::pair<std::string, Tensor>> tensors;
  };
  Contents contents(bool count_save);

  // Makes save(), write() and a CheckpointManager's saves sharded (ShardedSaveOptions), or plain
  // again with nullopt. Every worker of the job calls save()/write() with the same prefix at the
  // same point; only the chief's save updates the state file (non-chief workers neither commit
  // nor uncommit). Sharded saves are synchronous even with enable_async (the all-gathers run on
  // the calling thread, in the order of the job's other collectives). A worker that fails or
  // dies mid-save leaves no `<prefix>.index`: the checkpoint never counts. Throws
  // InvalidArgumentError for bad options (num_shards < 1, rank outside it, no all_gather).
  void set_sharding(std::optional<ShardedSaveOptions> options);
  const std::optional<ShardedSaveOptions>& sharding() const { return sharding_; }

 private:
  friend class CheckpointManager;
  // Commits written prefixes (oldest first): runs on the committing thread (the caller's when
  // sync) after they and every earlier save are durable; one call may cover several
  // consecutive saves of the same commit group.
  using CommitFn = std::function<void(const std::vector<std::string>& prefixes)>;
  // Snapshots (copies when async) and writes `prefix`, then commits it with `commit` (none for
  // write()) after fsyncing the directories of the prefixes it commits. Async: blocks while the
  // byte budget is full; earlier writes of the same prefix are waited for first. With `spares`,
  // the data and index files overwrite spare files where there are some.
  void write_internal(const std::string& prefix, std::string commit_group, CommitFn commit,
                      detail::SpareFiles* spares = nullptr);
  // Async: blocks until a pipeline slot is free; rethrows a detected write error (once).
  void reserve_slot();
  // Async: rethrows a detected write error (once) without waiting.
  void check_write_error();
  // Async: whether a pending write has this prefix.
  bool writing(const std::string& prefix) const;
  void wait_for_write();
  // restore()'s part after the reader is open.
  CheckpointLoadStatus restore_from(BundleReader& reader, const std::string& save_path);
  void write_bundle(const std::string& prefix, const std::string& graph,
                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                    detail::SpareFiles* spares, bool sync_directory) const;
  std::vector<std::pair<std::string, Trackable>> root_children();
  // The sharded write of `prefix` (sharded_save.cc); `commit` runs on the chief only, after the
  // merged index is durable.
  void write_sharded(const std::string& prefix, const CommitFn& commit);

  std::vector<std::pair<std::string, Trackable>> children_;
  std::optional<Trackable> root_;
  CheckpointOptions options_;
  Variable save_counter_;
  bool save_counter_tracked_ = false;
  std::unique_ptr<detail::AsyncWriter> writer_;  // enable_async only
  // contents(): the walk it reuses, its serialized graph and keys, and when it was made.
  struct ContentsCache;
  std::unique_ptr<ContentsCache> contents_cache_;
  std::optional<ShardedSaveOptions> sharding_;
};

// The newest committed checkpoint prefix in `directory` (from its `checkpoint` state file), or
// nullopt when there is no state file or its newest entry has no `.index`
// (tf.train.latest_checkpoint). Throws DataLossError when the state file is malformed.
std::optional<std::string> latest_checkpoint(const std::string& directory);

// Where warnings go (fallback to an older checkpoint, unconsumed values, async write errors
// found in a destructor, discarded async saves). The default prints "WARNING: <message>" to
// stderr. Thread-safe. The handler runs on the thread that found the problem (an async writer
// thread for discarded saves) with no lock of the checkpoint held; it must not wait for the
// checkpoint (sync(), restore()) from there.
void set_warning_handler(std::function<void(const std::string&)> handler);

}  // namespace dtrain::checkpoint
