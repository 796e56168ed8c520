// Building a TensorBundle index (private to the checkpoint layer): the LevelDB table TF writes,
// shared by BundleWriter, merge_bundles and sharded saves so all produce TF's exact bytes, and
// the BundleEntryProto encoding (bundle_entry.cc).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "dtrain/checkpoint/tensor_bundle.h"

namespace dtrain::checkpoint::detail {

// kTensorBundleVersion: the producer version the writer records and the newest the reader takes.
inline constexpr int kBundleVersion = 1;

// The bytes of `<prefix>.index`: the BundleHeaderProto for `num_shards` under the empty key, then
// every entry in key order, as a LevelDB table without compression or filter (block size 256 KiB,
// restart interval 16, as TF's table builder). `where` names the writer in errors.
std::string build_index(int num_shards, const BundleEntries& entries, const std::string& where);

// BundleEntryProto bytes of `e` (fields at their default omitted, as proto3 and TF do), and
// back; decode_entry throws DataLossError naming `what`.
std::string encode_entry(const BundleEntry& e);
BundleEntry decode_entry(std::string_view bytes, const std::string& what);

}  // namespace dtrain::checkpoint::detail
