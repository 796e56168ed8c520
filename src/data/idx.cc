// IDX reading through zlib's gz* API, which reads gzip and plain files alike. The payload is
// read with one gzread straight into the tensor's buffer, then byte-swapped in place.
#include "dtrain/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `n` bytes; returns the number read (< n only at the end of the data). Throws
// DataLossError for a read or decompression error other than a truncated gzip stream.
size_t read_fully(gzFile f, void* dst, size_t n, const std::string& path) {
  constexpr size_t kChunk = size_t{1} << 30;  // gzread takes an unsigned int
  size_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(std::min(n - done, kChunk));
    const int got = gzread(f, static_cast<char*>(dst) + done, want);
    if (got < 0) {
      int code = Z_OK;
      const char* msg = gzerror(f, &code);
      throw DataLossError(str_cat("read_idx: ", path, ": read error: ", msg ? msg : "unknown"));
    }
    done += static_cast<size_t>(got);
    if (static_cast<unsigned>(got) < want) break;
  }
  return done;
}

DType dtype_of_idx(uint8_t code) {
  switch (static_cast<IdxType>(code)) {
    case IdxType::kUInt8:
      return DType::kUInt8;
    case IdxType::kInt8:
      return DType::kInt8;
    case IdxType::kInt16:
      return DType::kInt16;
    case IdxType::kInt32:
      return DType::kInt32;
    case IdxType::kFloat32:
      return DType::kFloat32;
    case IdxType::kFloat64:
      return DType::kFloat64;
  }
  return DType::kInvalid;
}

template <class U>
void byteswap_all(void* data, size_t count) {
  U* p = static_cast<U*>(data);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (sizeof(U) == 2) p[i] = __builtin_bswap16(p[i]);
    if constexpr (sizeof(U) == 4) p[i] = __builtin_bswap32(p[i]);
    if constexpr (sizeof(U) == 8) p[i] = __builtin_bswap64(p[i]);
  }
}

// IDX data is big-endian; converts in place to the host order.
void big_endian_to_host(void* data, size_t count, size_t elem_size) {
  if constexpr (std::endian::native == std::endian::big) return;
  switch (elem_size) {
    case 2:
      byteswap_all<uint16_t>(data, count);
      break;
    case 4:
      byteswap_all<uint32_t>(data, count);
      break;
    case 8:
      byteswap_all<uint64_t>(data, count);
      break;
    default:
      break;
  }
}

// Deflate expands at most 1032:1; with gzip's headers, a compressed file of `size` bytes holds
// at most this much data.
constexpr uint64_t kMaxGzipRatio = 1032;

// The header's dimensions are untrusted: before allocating, checks that the file can hold the
// payload they claim (exactly for a plain file, by deflate's maximum ratio for gzip). Devices and
// pipes have no size to compare with and are read as they come.
void check_payload_size(gzFile f, const std::string& path, size_t header_size, size_t nbytes,
                        DType dtype, const Shape& shape) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const std::string claim =
      str_cat("read_idx: ", path, ": truncated IDX file or corrupt header: expected ", nbytes,
              " bytes of data for ", dtype_name(dtype), " ", shape.to_string(),
              " (the header's dimensions)");
  if (gzdirect(f) == 1) {
    const uint64_t payload = size > header_size ? size - header_size : 0;
    if (nbytes > payload) {
      throw DataLossError(
          str_cat(claim, ", got ", payload, " after the ", header_size, "-byte header"));
    }
    return;
  }
  uint64_t bound = 0;
  if (__builtin_mul_overflow(size, kMaxGzipRatio, &bound)) return;
  if (nbytes > bound) {
    throw DataLossError(
        str_cat(claim, ", but a gzip file of ", size, " bytes decompresses to at most ", bound));
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  errno = 0;
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) {
    if (errno == ENOENT || errno == ENOTDIR) {
      throw NotFoundError(str_cat("read_idx: ", path, ": no such file"));
    }
    throw NotFoundError(str_cat("read_idx: ", path,
                                ": cannot open: ", errno ? std::strerror(errno) : "unknown error"));
  }
  gzbuffer(f.get(), 1 << 18);

  uint8_t magic[4] = {};
  const size_t got_magic = read_fully(f.get(), magic, 4, path);
  const uint32_t magic_value = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) |
                               (uint32_t{magic[2]} << 8) | magic[3];
  const DType dtype = dtype_of_idx(magic[2]);
  if (got_magic < 4 || magic[0] != 0 || magic[1] != 0 || dtype == DType::kInvalid) {
    // Shows the bytes that are there: a file shorter than 4 bytes shows fewer digits.
    char hex[16] = "missing";
    if (got_magic > 0) {
      const uint64_t shown = uint64_t{magic_value} >> (8 * (4 - got_magic));
      std::snprintf(hex, sizeof(hex), "0x%0*llX", static_cast<int>(2 * got_magic),
                    static_cast<unsigned long long>(shown));
    }
    throw DataLossError(str_cat("read_idx: ", path, ": not an IDX file (magic ", hex, ")"));
  }
  const int rank = magic[3];
  if (rank == 0) {
    // The first dimension counts the examples: a scalar is no data set.
    throw DataLossError(str_cat("read_idx: ", path,
                                ": rank 0 in the header (magic byte 4): an IDX data set needs at "
                                "least one dimension, the number of examples"));
  }
  if (rank > Shape::kMaxRank) {
    throw DataLossError(
        str_cat("read_idx: ", path, ": rank ", rank, " exceeds the maximum of ", Shape::kMaxRank));
  }

  uint8_t dims_be[4 * Shape::kMaxRank] = {};
  const size_t header_bytes = 4 * static_cast<size_t>(rank);
  const size_t got_dims = read_fully(f.get(), dims_be, header_bytes, path);
  if (got_dims < header_bytes) {
    throw DataLossError(str_cat("read_idx: ", path, ": truncated IDX header: expected ",
                                4 + header_bytes, " bytes, got ", 4 + got_dims));
  }
  Shape shape;
  size_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* b = dims_be + 4 * i;
    const uint32_t d =
        (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    shape.push_back(d);
    if (__builtin_mul_overflow(count, size_t{d}, &count)) {
      throw DataLossError(str_cat("read_idx: ", path, ": implausible shape ", shape.to_string()));
    }
  }
  const size_t elem_size = dtype_size(dtype);
  size_t nbytes = 0;
  if (__builtin_mul_overflow(count, elem_size, &nbytes) ||
      nbytes > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    throw DataLossError(str_cat("read_idx: ", path, ": implausible shape ", shape.to_string()));
  }

  check_payload_size(f.get(), path, 4 + header_bytes, nbytes, dtype, shape);

  Tensor t(dtype, shape);
  const size_t got = read_fully(f.get(), t.raw_data(), nbytes, path);
  if (got < nbytes) {
    throw DataLossError(str_cat("read_idx: ", path, ": truncated IDX file: expected ", nbytes,
                                " bytes of data for ", dtype_name(dtype), " ", shape.to_string(),
                                ", got ", got));
  }
  big_endian_to_host(t.raw_data(), count, elem_size);
  return t;
}

}  // namespace dtrain::data
