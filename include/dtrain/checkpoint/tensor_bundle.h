// TensorFlow's checkpoint V2 "tensor bundle" (tensorflow/core/util/tensor_bundle): the files
// `<prefix>.index` (a LevelDB table mapping each tensor name to a BundleEntryProto, plus a
// BundleHeaderProto under the empty key) and `<prefix>.data-NNNNN-of-MMMMM` (the tensors' bytes,
// back to back, each covered by a masked CRC32C). docs/checkpoints.md and
// shared/reference/formats.md §1 describe the bytes. BundleWriter writes what TF's BundleWriter
// writes, byte for byte for the same Add() sequence; BundleReader reads any bundle TF writes
// (uncompressed or snappy-compressed index blocks, several data shards, string tensors).
// A BundleWriter is thread-compatible; a BundleReader is thread-safe after construction.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/shape.h"
#include "dtrain/core/tensor.h"

namespace dtrain::checkpoint {

// The index key of the object graph of a TF2 object-based checkpoint.
inline constexpr std::string_view kObjectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH";

// "<prefix>.index" and "<prefix>.data-%05d-of-%05d", as TF names them.
std::string index_filename(const std::string& prefix);
std::string data_filename(const std::string& prefix, int shard, int num_shards);

// A hyper-rectangle of a tensor (TF's TensorSlice / TensorSliceProto): per dimension a start and
// a length, length -1 meaning the whole dimension ("full", an empty Extent on disk).
struct TensorSlice {
  struct Extent {
    int64_t start = 0;
    int64_t length = -1;  // -1: the whole dimension
  };
  std::vector<Extent> extents;  // one per dimension of the full tensor

  // Rows [row_begin, row_end) of a tensor of rank `rank` >= 1: dimension 0 explicit, the others
  // full (what a sharded save writes).
  static TensorSlice rows(int rank, int64_t row_begin, int64_t row_end);
  bool full_at(int d) const { return extents[static_cast<size_t>(d)].length < 0; }
  int64_t start(int d) const { return full_at(d) ? 0 : extents[static_cast<size_t>(d)].start; }
  int64_t length(int d, const Shape& full_shape) const {
    return full_at(d) ? full_shape[d] : extents[static_cast<size_t>(d)].length;
  }
  // The slice's own shape inside `full_shape`.
  Shape shape_in(const Shape& full_shape) const;
  // TF's debug string: "-" per full dimension, "start,length" otherwise, joined by ':'.
  std::string to_string() const;
};

// The index key of one slice of tensor `name`: TF's checkpoint::EncodeTensorNameSlice
// (OrderedCode: 0, the name, the rank, then start and length of every dimension, -1 for a
// full one). Such keys begin with a NUL byte, so they never collide with tensor names.
std::string encode_tensor_name_slice(std::string_view name, const TensorSlice& slice);

// One tensor's record in the index (BundleEntryProto). A partitioned tensor's entry holds only
// dtype, shape and its slices; each slice is a separate entry under encode_tensor_name_slice.
struct BundleEntry {
  DType dtype = DType::kInvalid;
  Shape shape;
  int32_t shard_id = 0;
  int64_t offset = 0;  // in the data shard
  int64_t size = 0;    // bytes in the data shard
  uint32_t masked_crc32c = 0;
  bool partitioned = false;         // has TensorSliceProto slices (slices below)
  std::vector<TensorSlice> slices;  // the slices stored, in the order of the index entry
};

// Every entry of a bundle's index, tensor name (or encoded slice key) -> entry.
using BundleEntries = std::map<std::string, BundleEntry, std::less<>>;

// Entries serialized for transport between the workers of a sharded save (varint-framed key and
// BundleEntryProto pairs), and back. parse_bundle_entries throws DataLossError naming `what`.
std::string serialize_bundle_entries(const BundleEntries& entries);
BundleEntries parse_bundle_entries(std::string_view bytes, const std::string& what);

// Adds `shard`'s entries (a sharded save's per-worker entries, or another bundle's) to `merged`,
// as TF's MergeBundles does: a tensor in several shards must be partitioned in each, with one
// dtype and shape, and its slices are concatenated; any other repeated key is an
// InvalidArgumentError naming it and `where`.
void merge_bundle_entries(BundleEntries& merged, const BundleEntries& shard,
                          const std::string& where);

// Writes `<prefix>.index` for `entries` with num_shards = `num_shards` atomically (temporary
// file, fsync, rename, directory fsync when `sync`), checking that the entries reference shards
// < num_shards and that every partitioned tensor's slices are present (InvalidArgumentError).
void write_bundle_index(const std::string& prefix, int num_shards, const BundleEntries& entries,
                        bool sync);
// The bytes write_bundle_index() writes for `entries` (no checks; `where` names the caller in
// the errors of malformed entries), for a writer that keeps the index elsewhere first.
std::string bundle_index_bytes(int num_shards, const BundleEntries& entries,
                               const std::string& where);

struct BundleWriterOptions {
  bool sync = true;            // fsync each file and the directory after each rename (crash safety)
  bool sync_directory = true;  // with sync: fsync the directory after the index's rename; false
                               // when the caller fsyncs it before relying on the bundle (e.g.
                               // once for several bundles, before a state file names them)
  // Existing files to overwrite as the data and index temporaries instead of creating new ones
  // (AtomicFileOptions::reuse); the writer owns them from then on.
  std::string reuse_data = {};
  std::string reuse_index = {};
  // One shard of a sharded bundle: the data goes to `<prefix>.data-<shard>-of-<num_shards>` and
  // every entry gets shard_id = shard; finish_shard() commits the data and returns the entries
  // instead of writing an index (the chief merges them: write_bundle_index).
  int shard = 0;
  int num_shards = 1;
};

// Writes one bundle: `<prefix>.data-00000-of-00001` while tensors are added, then the index.
// Both go to temporary files that are fsynced and renamed into place only by finish(), data
// first and index last, so a crash leaves either the complete bundle or no new index.
// What TF's WriteStringTensor writes before the bytes of a string tensor's `values`: their
// varint64 lengths and the masked CRC-32C of the lengths; and the CRC-32C (unmasked) of the
// entry so far, which the values' bytes extend into the entry's checksum.
std::pair<std::string, uint32_t> string_tensor_header(const std::vector<std::string>& values);

class BundleWriter {
 public:
  // Creates the prefix's directory if needed and opens the temporary data file. Throws the
  // errors of AtomicFile (dtrain/core/file.h), naming the path.
  explicit BundleWriter(std::string prefix, BundleWriterOptions options = {});
  // Removes the temporary files unless finish() succeeded.
  ~BundleWriter();
  BundleWriter(const BundleWriter&) = delete;
  BundleWriter& operator=(const BundleWriter&) = delete;

  // Appends `tensor`'s bytes to the data file and records its entry. Keys must be unique and
  // non-empty (InvalidArgumentError); they may come in any order (the index is sorted, the
  // data file keeps the order of the calls, as in TF). Blocks on write(2) for large tensors.
  // Throws ResourceExhaustedError when the disk is full, another Error for other I/O failures.
  void add(std::string_view key, const Tensor& tensor);
  // A DT_STRING tensor of `shape` (its element count must equal values.size()).
  void add_strings(std::string_view key, const std::vector<std::string>& values,
                   const Shape& shape);
  // One slice of the partitioned tensor `key` of `full_shape` (TF's BundleWriter::AddSlice):
  // records `slice` in the tensor's entry (dtype and full shape; several add_slice calls of one
  // key append slices) and adds `slice_tensor`'s bytes under encode_tensor_name_slice(key,
  // slice). Throws InvalidArgumentError when the slice does not lie inside `full_shape`, its
  // shape is not slice_tensor's, or the dtype or full shape differ from an earlier slice's.
  void add_slice(std::string_view key, const Shape& full_shape, const TensorSlice& slice,
                 const Tensor& slice_tensor);
  // Commits the data file, then writes and commits the index. Blocks for the fsyncs. Throws
  // like add(); on failure no new index exists under the final name.
  void finish();
  // For a shard (options.num_shards > 1 or shard > 0): commits the data file (fsynced, renamed
  // into place) and returns this shard's entries, shard_id = options.shard. Writes no index.
  BundleEntries finish_shard();

  const std::string& prefix() const { return prefix_; }
  // Bytes written to the data file so far.
  int64_t data_bytes() const;

 private:
  struct Impl;
  std::string prefix_;
  std::unique_ptr<Impl> impl_;
};

// Reads a bundle. The constructor reads and checks the whole index (block checksums, entry
// syntax, that every entry lies inside its data shard) and opens the data shards.
// A bundle's files held in memory (received from a peer, say): `<prefix>.index` and data shard
// i as bytes. They must outlive every reader of them.
struct BundleBytes {
  std::string_view index;
  std::vector<std::string_view> shards;
};

class BundleReader {
 public:
  // Throws NotFoundError when `<prefix>.index` does not exist, DataLossError naming the file
  // when the index is corrupt or a data shard is missing or shorter than its entries need,
  // AbortedError when a CheckpointManager is recycling the checkpoint's files right now.
  explicit BundleReader(std::string prefix);
  // Reads a bundle from memory, checked as from files (the index's block checksums, every
  // entry inside its shard, each tensor's CRC-32C when read); `prefix` names it in errors as if
  // it were the files'. Throws DataLossError for a corrupt index or a missing or short shard.
  BundleReader(std::string prefix, BundleBytes bytes);
  ~BundleReader();
  BundleReader(const BundleReader&) = delete;
  BundleReader& operator=(const BundleReader&) = delete;

  const std::string& prefix() const { return prefix_; }
  int num_shards() const { return num_shards_; }
  // Tensor names in index (bytewise) order, without the header's empty key and without the
  // entries of individual slices (a partitioned tensor is listed once, by name).
  std::vector<std::string> keys() const;
  bool contains(std::string_view key) const;
  // The entry of `key`; throws NotFoundError naming the key and the index file.
  const BundleEntry& entry(std::string_view key) const;

  // The tensor under `key`, read from its shard with one pread and verified against its CRC32C.
  // A partitioned tensor is assembled from its slices (any shards), each verified. Throws
  // NotFoundError (no such key), InvalidArgumentError (a DT_STRING entry: use read_strings),
  // DataLossError naming the data file and the key (CRC mismatch, short read, size
  // inconsistent with dtype and shape, slices that are missing, overlap or leave a gap).
  // Blocks on the read.
  Tensor read(std::string_view key) const;
  // Rows [row_begin, row_end) of the tensor under `key` (rank >= 1), partitioned or not: only
  // the slices that hold those rows are read (each whole, for its CRC). Throws like read(), and
  // InvalidArgumentError for a range outside the tensor or a scalar.
  Tensor read_rows(std::string_view key, int64_t row_begin, int64_t row_end) const;
  // The entry of one slice of partitioned tensor `key` (where it is stored, its CRC); throws
  // DataLossError when the index lacks it.
  const BundleEntry& slice_entry(std::string_view key, const TensorSlice& slice) const;
  // Every entry of the index (slices included) under its key, as stored.
  const BundleEntries& entries() const { return entries_; }
  // The elements of a DT_STRING tensor, row-major; both of its checksums are verified. Throws
  // like read().
  std::vector<std::string> read_strings(std::string_view key) const;
  // Whether what this reader read may mix in another checkpoint's bytes: a CheckpointManager
  // recycled the bundle's files since they were opened. Readers hold their files with a shared
  // flock, which a recycling writer respects (it deletes such a file instead of overwriting it),
  // so this is false whenever the locks could be taken; on filesystems without flock it says
  // whether the files still sit under their names.
  bool files_replaced() const;

 private:
  std::string prefix_;
  int num_shards_ = 1;
  bool big_endian_ = false;           // header says the data bytes are big-endian (swapped on read)
  BundleEntries entries_;             // tensors and, under their encoded keys, slices
  std::vector<std::string> names_;    // keys() (slice entries excluded)
  std::vector<int> fds_;              // one per data shard (files)
  std::optional<BundleBytes> bytes_;  // the bundle in memory (no files)
  // (device, inode) of the index and then of each data shard, as opened.
  std::vector<std::pair<uint64_t, uint64_t>> file_ids_;
  bool protected_ = false;  // every file was held (a shared flock) before it was read
  // The constructors' part: parses and checks the index's bytes.
  void parse_index(std::string_view index, const std::string& index_path);
  // Closes the data shards' files.
  void close_shards();
  // Checks that every entry lies inside its shard of `sizes` bytes.
  void check_extents(const std::vector<int64_t>& sizes) const;
  void read_bytes(const BundleEntry& e, std::string_view key, void* dst) const;
  Tensor read_plain(const BundleEntry& e, std::string_view key) const;
  // read_plain into `dst`, which holds e.size bytes: read, CRC-checked, byte-swapped if needed.
  void read_plain_into(const BundleEntry& e, std::string_view key, void* dst) const;
  // Copies the part of `key` inside `box` (a TensorSlice of the full tensor) into `out`.
  void read_region(std::string_view key, const BundleEntry& full, const TensorSlice& box,
                   Tensor& out) const;
};

}  // namespace dtrain::checkpoint
