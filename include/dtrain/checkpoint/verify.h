// Checking checkpoints on disk without restoring them, as `dtrain ckpt ls|verify` and scripts do:
// which prefix a user's path names, whether every tensor of a bundle reads back with its
// CRC32C, the checkpoints of a directory with their status, and whether a destination already
// holds a checkpoint (docs/checkpoint-cli.md). Read-only; functions are thread-safe on
// different files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

// The checkpoint prefix a user's path names: the prefix itself, its `.index` or a data file, or
// a directory (its newest committed checkpoint, as tf.train.list_variables does). Throws
// NotFoundError for a directory without a committed checkpoint, DataLossError for a malformed
// state file. Does not check that the prefix exists.
std::string resolve_prefix(const std::string& path);

// Whether `prefix` holds a checkpoint that writing it would replace: its `.index` exists, or the
// `checkpoint` state file of its directory names it (a committed checkpoint whose files are
// damaged is still one). A malformed state file counts as naming nothing.
bool checkpoint_exists(const std::string& prefix);

struct BundleVerification {
  size_t tensors = 0;               // tensors read and CRC-verified (a partitioned one: once,
                                    // every slice read and verified)
  uint64_t bytes = 0;               // their bytes (a partitioned one's: its slices')
  std::vector<std::string> errors;  // one DataLossError message per corrupt tensor, key order
};

// Opens the bundle at `prefix` and reads every tensor (all shards; partitioned tensors
// assembled from their slices), checking each CRC32C; the object graph is parsed too. A corrupt
// tensor is recorded and reading goes on, so every one is named. Throws NotFoundError (no index)
// and DataLossError for a corrupt index or a missing or short data file, UnimplementedError for a
// dtype dtrain lacks.
BundleVerification verify_bundle(const std::string& prefix);

// Reads every weight of a Keras .h5 file and returns how many there are (HDF5 files carry no
// per-tensor checksums: this finds truncation and structural damage). Throws as read_keras_h5.
size_t verify_keras_h5(const std::string& path);

struct ListCheckpointsOptions {
  bool quick = false;  // open each index (block checksums, data file sizes) but read no tensor
};

// One checkpoint of a directory.
struct CheckpointInfo {
  std::string prefix;           // <dir>/<name>
  std::optional<int64_t> step;  // the number after the name's last '-', if any
  double time = 0;              // the state file's timestamp, else the .index's mtime; 0: none
  uint64_t bytes = 0;           // the index and every data shard
  bool committed = false;       // named by the state file
  bool newest = false;          // the state file's model_checkpoint_path
  std::string status;           // "valid", "corrupt", "missing", "unreadable" or "unchecked"
  std::string detail;           // why it is corrupt, missing or unreadable
};

struct CheckpointListing {
  std::vector<CheckpointInfo> checkpoints;  // by step (those without one last), then prefix
  std::string state_problem;                // a malformed state file's DataLossError, or ""
};

// Every checkpoint of `directory`: those its state file names and every other `*.index`
// (temporaries excluded), each verified (verify_bundle) unless options.quick. Corrupt
// checkpoints are reported, not thrown. Throws NotFoundError when `directory` does not exist,
// InvalidArgumentError when it is not a directory.
CheckpointListing list_checkpoints(const std::string& directory,
                                   const ListCheckpointsOptions& options = {});

}  // namespace dtrain::checkpoint
