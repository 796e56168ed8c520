// tf.data-style input pipelines: a Dataset is an immutable description of a stream of elements
// (tuples of Tensors), built from sources and transformations; an Iterator runs one pass over it.
// Passes are deterministic for given seeds and resumable from an IteratorState (iteration,
// position). A Dataset is an immutable value and thread-safe (copies share the description);
// an Iterator is thread-compatible (one consumer thread; prefetch runs its own producer thread).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

// One element of a dataset: its components, e.g. {x, y}.
using Element = std::vector<Tensor>;

// tf.data's cardinality constants.
inline constexpr int64_t kInfiniteCardinality = -1;
inline constexpr int64_t kUnknownCardinality = -2;
// tf.data.AUTOTUNE for prefetch(): dtrain picks a fixed small buffer (kAutotunePrefetch).
inline constexpr int64_t kAutotune = -1;
inline constexpr int64_t kAutotunePrefetch = 2;

// Where an iterator stands: pass number `iteration` (an epoch) and the number of elements it
// has returned in that pass. Two integers, so a checkpoint can store it; with the Dataset's
// seeds it determines everything the iterator yields next.
struct IteratorState {
  int64_t iteration = 0;
  int64_t position = 0;  // elements returned so far in this pass
  bool operator==(const IteratorState&) const = default;
};

namespace detail {
class DatasetNode;
class IteratorNode;
struct DatasetAccess;  // src/data: wraps a node into a Dataset (text sources, ...)
}  // namespace detail

// One pass over a Dataset. Movable, not copyable. Destroying an iterator mid-pass is fine: a
// prefetch producer thread is stopped and joined.
class Iterator {
 public:
  Iterator(Iterator&&) noexcept;
  Iterator& operator=(Iterator&&) noexcept;
  ~Iterator();

  // Writes the next element into `out` (reusing its capacity and replacing its tensors) and
  // returns true, or returns false at the end of the pass (then `out` is unspecified). Rethrows
  // any exception raised upstream (a map function, a prefetch producer); after an exception
  // the iterator keeps rethrowing it. May block while a prefetch buffer is empty.
  bool next(Element& out);
  // The state after the elements returned so far; Dataset::iterator_from(state()) continues
  // with exactly the elements this iterator would yield next.
  IteratorState state() const { return {iteration_, position_}; }

 private:
  friend class Dataset;
  Iterator(std::unique_ptr<detail::IteratorNode> impl, int64_t iteration);

  std::unique_ptr<detail::IteratorNode> impl_;
  int64_t iteration_ = 0;
  int64_t position_ = 0;
  std::exception_ptr error_;  // sticky: rethrown by every later next()
};

class Dataset {
 public:
  // An undefined dataset (defined() is false); every operation on it throws
  // FailedPreconditionError. Lets option structs hold a Dataset that may be absent.
  Dataset() = default;
  bool defined() const { return node_ != nullptr; }

  // Map functions take an element and return the transformed element; they run on the
  // thread that pulls the element (the consumer, or a prefetch producer). For resumable
  // iteration they must be deterministic functions of their input: iterator_from() skips
  // elements without calling them.
  using MapFn = std::function<Element(Element)>;

  // Elements are rows of the components along dimension 0, as zero-copy views `t[i]`. Throws
  // InvalidArgumentError when there are no components, a component is a scalar or undefined,
  // or the first dimensions differ (naming both shapes).
  static Dataset from_tensor_slices(std::vector<Tensor> components);

  // Applies `fn` to every element.
  Dataset map(MapFn fn) const;
  // TF's buffered shuffle: fills a buffer of `buffer_size` elements and returns a uniformly
  // chosen one, replacing it with the next input element. `seed` defaults to next_seed(),
  // drawn once here so every pass is reproducible. With `reshuffle_each_iteration`, pass i uses
  // seed mix_seed(seed, i); otherwise every pass uses `seed` (the same order).
  Dataset shuffle(int64_t buffer_size, std::optional<uint64_t> seed = {},
                  bool reshuffle_each_iteration = true) const;
  // Stacks `batch_size` consecutive elements along a new first dimension, one freshly
  // allocated tensor per component. The last batch may be smaller unless `drop_remainder`.
  // next() throws InvalidArgumentError when elements of one batch disagree in shape or dtype.
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // The input `count` times in a row; -1 repeats forever. Repetition r of pass i iterates the
  // input as pass i * count + r (i * 2^32 + r when infinite), so shuffles differ per repetition.
  Dataset repeat(int64_t count = -1) const;
  // At most the first `count` elements (-1: all).
  Dataset take(int64_t count) const;
  // All but the first `count` elements (-1: none are left).
  Dataset skip(int64_t count) const;
  // Elements index, index + num_shards, index + 2 * num_shards, ... (TF's shard).
  Dataset shard(int64_t num_shards, int64_t index) const;
  // Produces up to `buffer_size` elements ahead on a background thread (kAutotune: a small
  // fixed buffer). Yields exactly the elements the input would; exceptions in the producer are
  // rethrown by next().
  Dataset prefetch(int64_t buffer_size = kAutotune) const;

  // Number of elements in one pass, or kInfiniteCardinality / kUnknownCardinality.
  int64_t cardinality() const;

  // Starts pass number `iteration` (>= 0).
  Iterator iterator(int64_t iteration = 0) const;
  // Recreates pass `state.iteration` and fast-forwards it by `state.position` elements (without
  // calling map functions or copying skipped batches where the pipeline allows). Throws
  // InvalidArgumentError if the pass has fewer than `state.position` elements. Blocks for the
  // time the skipped prefix takes to produce.
  Iterator iterator_from(const IteratorState& state) const;

 private:
  friend struct detail::DatasetAccess;
  explicit Dataset(std::shared_ptr<const detail::DatasetNode> node) : node_(std::move(node)) {}

  std::shared_ptr<const detail::DatasetNode> node_;
};

}  // namespace dtrain::data
