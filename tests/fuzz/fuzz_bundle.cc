// TensorFlow checkpoints (TensorBundle V2) read from memory: an input is a 4-byte little-endian
// index length, the `.index` bytes, then one data shard (the fixtures of
// ../shared/fixtures/tf_checkpoints as seeds). Every tensor is read, and rows of each; any
// dtrain::Error is an expected answer, anything else a bug.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t index_bytes = 0;
  std::memcpy(&index_bytes, data, 4);
  const std::string_view all(reinterpret_cast<const char*>(data) + 4, size - 4);
  if (index_bytes > all.size()) return 0;
  try {
    const dtrain::checkpoint::BundleReader reader(
        "fuzz", {.index = all.substr(0, index_bytes), .shards = {all.substr(index_bytes)}});
    for (const std::string& key : reader.keys()) {
      try {
        const dtrain::Tensor t = reader.read(key);
        if (t.rank() > 0 && t.dim(0) > 0) (void)reader.read_rows(key, 0, 1);
      } catch (const dtrain::Error&) {
      }
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
