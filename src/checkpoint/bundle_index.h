// Building a TensorBundle index (private to the checkpoint layer): the LevelDB table TF writes,
// shared by BundleWriter and merge_bundles so both produce TF's exact bytes.
#pragma once

#include <map>
#include <string>

#include "dtrain/checkpoint/tensor_bundle.h"

namespace dtrain::checkpoint::detail {

// The bytes of `<prefix>.index`: the BundleHeaderProto for `num_shards` under the empty key, then
// every entry in key order, as a LevelDB table without compression or filter (block size 256 KiB,
// restart interval 16, as TF's table builder). `where` names the writer in errors.
std::string build_index(int num_shards,
                        const std::map<std::string, BundleEntry, std::less<>>& entries,
                        const std::string& where);

}  // namespace dtrain::checkpoint::detail
