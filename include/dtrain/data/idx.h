// Reader for the IDX format of MNIST and Fashion-MNIST (LeCun et al.), plain or gzip-compressed.
// The format (described in docs/data.md): two zero bytes, a type code, the rank, then one
// big-endian uint32 per dimension, then the elements, big-endian, row-major. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

// IDX element type codes (the third byte of the magic number) and the dtypes they map to.
enum class IdxType : uint8_t {
  kUInt8 = 0x08,    // uint8
  kInt8 = 0x09,     // int8
  kInt16 = 0x0B,    // int16
  kInt32 = 0x0C,    // int32
  kFloat32 = 0x0D,  // float32
  kFloat64 = 0x0E,  // float64
};

// Reads an IDX file into a tensor of its dtype and shape, decompressing gzip transparently
// (detected from the content, not the name). Blocks while reading the whole file.
// Throws NotFoundError (naming the path) if the file does not exist; DataLossError
// "<path>: not an IDX file (magic 0x...)" for a wrong magic number or type code, and
// DataLossError naming the path and the expected and actual byte counts when the file is
// truncated or its gzip stream is corrupt.
Tensor read_idx(const std::string& path);

}  // namespace dtrain::data
