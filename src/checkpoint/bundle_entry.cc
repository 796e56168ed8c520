// BundleEntryProto and TensorSliceProto bytes, TF's slice keys (EncodeTensorNameSlice over
// OrderedCode), and the entry lists a sharded save passes between workers and merges
// (shared/reference/formats.md §1.3; docs/checkpoints.md, "Sharded checkpoints").
#include <algorithm>
#include <bit>

#include "bundle_index.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/proto_wire.h"

namespace dtrain::checkpoint {

namespace {

// OrderedCode (TF's strings::OrderedCode), the three writers EncodeTensorNameSlice uses.
// WriteNumIncreasing: a length byte, then the value big-endian without leading zero bytes.
void ordered_num_increasing(std::string& out, uint64_t v) {
  char buf[8];
  int len = 0;
  for (; v > 0; v >>= 8) buf[7 - len++] = static_cast<char>(v & 0xff);
  out.push_back(static_cast<char>(len));
  out.append(buf + 8 - len, static_cast<size_t>(len));
}

// WriteString: 0x00 -> 00 ff, 0xff -> ff 00, terminated by 00 01.
void ordered_string(std::string& out, std::string_view s) {
  for (const char c : s) {
    if (c == '\x00') {
      out.append("\x00\xff", 2);
    } else if (c == '\xff') {
      out.append("\xff\x00", 2);
    } else {
      out.push_back(c);
    }
  }
  out.append("\x00\x01", 2);
}

// WriteSignedNumIncreasing: n bytes hold values in [-2^(7n-1), 2^(7n-1)); the first bits of the
// big-endian two's complement value are replaced by a unary length header (kLengthToHeaderBits).
void ordered_signed_num_increasing(std::string& out, int64_t v) {
  static constexpr unsigned char kHeader[11][2] = {{0, 0},    {0x80, 0},    {0xc0, 0},   {0xe0, 0},
                                                   {0xf0, 0}, {0xf8, 0},    {0xfc, 0},   {0xfe, 0},
                                                   {0xff, 0}, {0xff, 0x80}, {0xff, 0xc0}};
  const uint64_t x = v < 0 ? ~static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  if (x < 64) {
    out.push_back(static_cast<char>(kHeader[1][0] ^ static_cast<unsigned char>(v & 0xff)));
    return;
  }
  const int bits = 64 - std::countl_zero(x);  // significant bits of x
  const int len = (bits + 7) / 7;             // 2..10
  unsigned char buf[10];
  const unsigned char sign = v < 0 ? 0xff : 0x00;
  buf[0] = buf[1] = sign;
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf[2 + i] = static_cast<unsigned char>(u >> (56 - 8 * i));
  unsigned char* begin = buf + 10 - len;
  begin[0] ^= kHeader[len][0];
  begin[1] ^= kHeader[len][1];
  out.append(reinterpret_cast<const char*>(begin), static_cast<size_t>(len));
}

std::string encode_shape(const Shape& shape) {
  std::string out, dim;
  for (int64_t d : shape) {
    dim.clear();
    if (d != 0) wire::put_varint_field(dim, 1, static_cast<uint64_t>(d));
    wire::put_bytes_field(out, 2, dim);
  }
  return out;
}

// TensorSliceProto: an Extent per dimension; a full one is empty, an explicit one has its start
// (when non-zero) and its length (always: it is a oneof member).
std::string encode_slice(const TensorSlice& slice) {
  std::string out, extent;
  for (const TensorSlice::Extent& e : slice.extents) {
    extent.clear();
    if (e.length >= 0) {
      if (e.start != 0) wire::put_varint_field(extent, 1, static_cast<uint64_t>(e.start));
      wire::put_varint_field(extent, 2, static_cast<uint64_t>(e.length));
    }
    wire::put_bytes_field(out, 1, extent);
  }
  return out;
}

TensorSlice decode_slice(std::string_view bytes, const std::string& what) {
  TensorSlice slice;
  wire::Reader r(bytes, what + " (TensorSliceProto)");
  wire::Field f;
  while (r.next(f)) {
    if (f.number != 1 || f.type != wire::kLengthDelimited) continue;
    TensorSlice::Extent e;
    bool has_length = false;
    wire::Reader er(f.bytes, what + " (TensorSliceProto.Extent)");
    wire::Field ef;
    while (er.next(ef)) {
      if (ef.number == 1 && ef.type == wire::kVarint) e.start = static_cast<int64_t>(ef.value);
      if (ef.number == 2 && ef.type == wire::kVarint) {
        e.length = static_cast<int64_t>(ef.value);
        has_length = true;
      }
    }
    if (!has_length) e = TensorSlice::Extent{};  // full
    if (e.start < 0 || (has_length && e.length < 0)) {
      throw DataLossError(
          str_cat(what, ": slice extent with negative start ", e.start, " or length ", e.length));
    }
    slice.extents.push_back(e);
  }
  return slice;
}

Shape decode_shape(std::string_view bytes, const std::string& what) {
  Shape shape;
  wire::Reader r(bytes, what + " (TensorShapeProto)");
  wire::Field f;
  while (r.next(f)) {
    if (f.number == 2 && f.type == wire::kLengthDelimited) {
      int64_t size = 0;
      wire::Reader dr(f.bytes, what + " (TensorShapeProto.Dim)");
      wire::Field df;
      while (dr.next(df)) {
        if (df.number == 1 && df.type == wire::kVarint) size = static_cast<int64_t>(df.value);
      }
      if (size < 0) throw DataLossError(str_cat(what, ": negative dimension ", size));
      if (shape.rank() == Shape::kMaxRank) {
        throw UnimplementedError(
            str_cat(what, ": rank above ", Shape::kMaxRank, " is not supported"));
      }
      shape.push_back(size);
    } else if (f.number == 3 && f.value != 0) {
      throw DataLossError(str_cat(what, ": shape of unknown rank in a checkpoint"));
    }
  }
  return shape;
}

bool same_slice(const TensorSlice& a, const TensorSlice& b) {
  if (a.extents.size() != b.extents.size()) return false;
  for (size_t d = 0; d < a.extents.size(); ++d) {
    const bool fa = a.extents[d].length < 0, fb = b.extents[d].length < 0;
    if (fa != fb) return false;
    if (!fa &&
        (a.extents[d].start != b.extents[d].start || a.extents[d].length != b.extents[d].length)) {
      return false;
    }
  }
  return true;
}

}  // namespace

TensorSlice TensorSlice::rows(int rank, int64_t row_begin, int64_t row_end) {
  DTRAIN_CHECK(rank >= 1 && row_begin >= 0 && row_end >= row_begin, "TensorSlice::rows: rows [",
               row_begin, ", ", row_end, ") of a tensor of rank ", rank);
  TensorSlice s;
  s.extents.resize(static_cast<size_t>(rank));
  s.extents[0] = {row_begin, row_end - row_begin};
  return s;
}

Shape TensorSlice::shape_in(const Shape& full_shape) const {
  Shape out;
  for (int d = 0; d < full_shape.rank(); ++d) out.push_back(length(d, full_shape));
  return out;
}

std::string TensorSlice::to_string() const {
  std::string out;
  for (size_t d = 0; d < extents.size(); ++d) {
    if (d > 0) out += ':';
    out += extents[d].length < 0 ? std::string("-")
                                 : str_cat(extents[d].start, ",", extents[d].length);
  }
  return out;
}

std::string encode_tensor_name_slice(std::string_view name, const TensorSlice& slice) {
  std::string out;
  ordered_num_increasing(out, 0);  // every slice key starts with 0
  ordered_string(out, name);
  ordered_num_increasing(out, slice.extents.size());
  for (const TensorSlice::Extent& e : slice.extents) {
    // TF writes start() and length(): 0 and -1 (kFullExtent) for a full dimension.
    ordered_signed_num_increasing(out, e.length < 0 ? 0 : e.start);
    ordered_signed_num_increasing(out, e.length < 0 ? -1 : e.length);
  }
  return out;
}

namespace detail {

std::string encode_entry(const BundleEntry& e) {
  std::string out;
  wire::put_varint_field(out, 1, static_cast<uint64_t>(static_cast<int32_t>(e.dtype)));
  wire::put_bytes_field(out, 2, encode_shape(e.shape));
  if (e.shard_id != 0) wire::put_varint_field(out, 3, static_cast<uint64_t>(e.shard_id));
  if (e.offset != 0) wire::put_varint_field(out, 4, static_cast<uint64_t>(e.offset));
  if (e.size != 0) wire::put_varint_field(out, 5, static_cast<uint64_t>(e.size));
  if (e.masked_crc32c != 0) wire::put_fixed32_field(out, 6, e.masked_crc32c);
  for (const TensorSlice& s : e.slices) wire::put_bytes_field(out, 7, encode_slice(s));
  return out;
}

BundleEntry decode_entry(std::string_view bytes, const std::string& what) {
  BundleEntry e;
  wire::Reader r(bytes, what);
  wire::Field f;
  while (r.next(f)) {
    switch (f.number) {
      case 1:
        e.dtype = static_cast<DType>(static_cast<int32_t>(f.value));
        break;
      case 2:
        e.shape = decode_shape(f.bytes, what);
        break;
      case 3:
        e.shard_id = static_cast<int32_t>(f.value);
        break;
      case 4:
        e.offset = static_cast<int64_t>(f.value);
        break;
      case 5:
        e.size = static_cast<int64_t>(f.value);
        break;
      case 6:
        e.masked_crc32c = static_cast<uint32_t>(f.value);
        break;
      case 7:
        e.partitioned = true;
        e.slices.push_back(decode_slice(f.bytes, what));
        break;
      default:
        break;  // unknown fields are skipped, as protobuf does
    }
  }
  for (const TensorSlice& s : e.slices) {
    if (static_cast<int>(s.extents.size()) != e.shape.rank()) {
      throw DataLossError(str_cat(what, ": slice ", s.to_string(), " has ", s.extents.size(),
                                  " extents but the tensor has rank ", e.shape.rank()));
    }
    for (int d = 0; d < e.shape.rank(); ++d) {
      if (!s.full_at(d) && s.start(d) + s.length(d, e.shape) > e.shape[d]) {
        throw DataLossError(str_cat(what, ": slice ", s.to_string(),
                                    " lies outside the tensor's shape ", e.shape.to_string()));
      }
    }
  }
  return e;
}

}  // namespace detail

std::string serialize_bundle_entries(const BundleEntries& entries) {
  std::string out;
  for (const auto& [key, e] : entries) {
    const std::string value = detail::encode_entry(e);
    wire::put_varint(out, key.size());
    out += key;
    wire::put_varint(out, value.size());
    out += value;
  }
  return out;
}

BundleEntries parse_bundle_entries(std::string_view bytes, const std::string& what) {
  BundleEntries out;
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  auto take = [&](std::string_view& s) {
    uint64_t n = 0;
    if (!wire::get_varint(p, end, &n) || static_cast<uint64_t>(end - p) < n) {
      throw DataLossError(
          str_cat(what, ": truncated bundle entry list (", bytes.size(), " bytes)"));
    }
    s = std::string_view(p, static_cast<size_t>(n));
    p += n;
  };
  while (p < end) {
    std::string_view key, value;
    take(key);
    take(value);
    const auto [it, inserted] = out.emplace(
        std::string(key),
        detail::decode_entry(value, str_cat("BundleEntryProto of '", key, "' from ", what)));
    if (!inserted) throw DataLossError(str_cat(what, ": entry '", key, "' listed twice"));
  }
  return out;
}

void merge_bundle_entries(BundleEntries& merged, const BundleEntries& shard,
                          const std::string& where) {
  for (const auto& [key, e] : shard) {
    auto [it, inserted] = merged.emplace(key, e);
    if (inserted) continue;
    BundleEntry& have = it->second;
    DTRAIN_CHECK(have.partitioned && e.partitioned, where, ": tensor '", key,
                 "' is in two bundles and is not partitioned in both");
    DTRAIN_CHECK(have.dtype == e.dtype && have.shape == e.shape, where, ": the slices of '", key,
                 "' disagree on its dtype or shape (", dtype_name(have.dtype), " ",
                 have.shape.to_string(), " vs ", dtype_name(e.dtype), " ", e.shape.to_string(),
                 ")");
    for (const TensorSlice& s : e.slices) {
      DTRAIN_CHECK(std::none_of(have.slices.begin(), have.slices.end(),
                                [&](const TensorSlice& h) { return same_slice(h, s); }),
                   where, ": slice ", s.to_string(), " of '", key, "' is in two bundles");
      have.slices.push_back(s);
    }
  }
}

}  // namespace dtrain::checkpoint
