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

// One tensor's record in the index (BundleEntryProto).
struct BundleEntry {
  DType dtype = DType::kInvalid;
  Shape shape;
  int32_t shard_id = 0;
  int64_t offset = 0;  // in the data shard
  int64_t size = 0;    // bytes in the data shard
  uint32_t masked_crc32c = 0;
  bool partitioned = false;  // has TensorSliceProto slices (not supported for reading)
};

struct BundleWriterOptions {
  bool sync = true;            // fsync each file and the directory after each rename (crash safety)
  bool sync_directory = true;  // with sync: fsync the directory after the index's rename; false
                               // when the caller fsyncs it before relying on the bundle (e.g.
                               // once for several bundles, before a state file names them)
  // Existing files to overwrite as the data and index temporaries instead of creating new ones
  // (AtomicFileOptions::reuse); the writer owns them from then on.
  std::string reuse_data = {};
  std::string reuse_index = {};
};

// Writes one bundle: `<prefix>.data-00000-of-00001` while tensors are added, then the index.
// Both go to temporary files that are fsynced and renamed into place only by finish(), data
// first and index last, so a crash leaves either the complete bundle or no new index.
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
  // Commits the data file, then writes and commits the index. Blocks for the fsyncs. Throws
  // like add(); on failure no new index exists under the final name.
  void finish();

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
class BundleReader {
 public:
  // Throws NotFoundError when `<prefix>.index` does not exist, DataLossError naming the file
  // when the index is corrupt or a data shard is missing or shorter than its entries need,
  // AbortedError when a CheckpointManager is recycling the checkpoint's files right now.
  explicit BundleReader(std::string prefix);
  ~BundleReader();
  BundleReader(const BundleReader&) = delete;
  BundleReader& operator=(const BundleReader&) = delete;

  const std::string& prefix() const { return prefix_; }
  int num_shards() const { return num_shards_; }
  // Tensor names in index (bytewise) order, without the header's empty key.
  std::vector<std::string> keys() const;
  bool contains(std::string_view key) const;
  // The entry of `key`; throws NotFoundError naming the key and the index file.
  const BundleEntry& entry(std::string_view key) const;

  // The tensor under `key`, read from its shard with one pread and verified against its CRC32C.
  // Throws NotFoundError (no such key), InvalidArgumentError (a DT_STRING entry: use
  // read_strings), UnimplementedError (a partitioned tensor), DataLossError naming the data
  // file and the key (CRC mismatch, short read, size inconsistent with dtype and shape).
  // Blocks on the read.
  Tensor read(std::string_view key) const;
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
  bool big_endian_ = false;  // header says the data bytes are big-endian (swapped on read)
  std::map<std::string, BundleEntry, std::less<>> entries_;
  std::vector<int> fds_;  // one per data shard
  // (device, inode) of the index and then of each data shard, as opened.
  std::vector<std::pair<uint64_t, uint64_t>> file_ids_;
  bool protected_ = false;  // every file was held (a shared flock) before it was read
  void read_bytes(const BundleEntry& e, std::string_view key, void* dst) const;
};

}  // namespace dtrain::checkpoint
