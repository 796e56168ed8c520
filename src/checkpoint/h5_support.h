// Private to the checkpoint layer: RAII handles and small helpers over libhdf5's C API shared by
// the Keras .h5 reader (keras_h5_read.cc) and writer (keras_h5_write.cc). Thread-safe as
// keras_h5.cc says: every function works on its own handles.
#pragma once

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <string>

#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint::h5 {

// Keras's HDF5_OBJECT_HEADER_LIMIT: a fixed-length string list attribute larger than this is
// split into `<name>0`, `<name>1`, ... (save_attributes_to_hdf5_group).
constexpr size_t kObjectHeaderLimit = 64512;

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = -1;
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns H5*close's result (negative on failure).
  herr_t close() {
    herr_t r = 0;
    if (id_ >= 0 && closer_ != nullptr) r = closer_(id_);
    id_ = -1;
    return r;
  }
  void reset() { (void)close(); }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

inline Handle group_handle(hid_t id) { return Handle(id, H5Gclose); }
inline Handle dataset_handle(hid_t id) { return Handle(id, H5Dclose); }
inline Handle attribute_handle(hid_t id) { return Handle(id, H5Aclose); }
inline Handle type_handle(hid_t id) { return Handle(id, H5Tclose); }
inline Handle space_handle(hid_t id) { return Handle(id, H5Sclose); }
inline Handle plist_handle(hid_t id) { return Handle(id, H5Pclose); }
inline Handle file_handle(hid_t id) { return Handle(id, H5Fclose); }
inline Handle object_handle(hid_t id) { return Handle(id, H5Oclose); }

// Stops libhdf5 from printing its error stack to stderr on this thread while in scope; dtrain
// reports errors as exceptions instead.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// " (HDF5: <the most specific message on this thread's error stack>)", or "" when empty. Call it
// right after the failing call: the next libhdf5 call clears the stack.
inline std::string hdf5_detail() {
  std::string innermost;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* out) -> herr_t {
        if (n == 0 && err != nullptr && err->desc != nullptr) {
          *static_cast<std::string*>(out) = err->desc;
        }
        return 0;
      },
      &innermost);
  return innermost.empty() ? std::string() : str_cat(" (HDF5: ", innermost, ")");
}

inline bool attribute_exists(hid_t obj, const std::string& name) {
  return H5Aexists(obj, name.c_str()) > 0;
}

inline bool link_exists(hid_t loc, const std::string& name) {
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

inline std::string join_path(const std::string& group, const std::string& name) {
  if (group.empty() || group == "/") return "/" + name;
  return group + "/" + name;
}

// The DType stored in an HDF5 numeric type and the native memory type to read it with;
// kInvalid when dtrain has no equivalent.
inline std::pair<DType, hid_t> dtype_of(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return {DType::kFloat32, H5T_NATIVE_FLOAT};
    if (size == 8) return {DType::kFloat64, H5T_NATIVE_DOUBLE};
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    switch (size) {
      case 1:
        return is_signed ? std::pair{DType::kInt8, H5T_NATIVE_INT8}
                         : std::pair{DType::kUInt8, H5T_NATIVE_UINT8};
      case 2:
        return is_signed ? std::pair{DType::kInt16, H5T_NATIVE_INT16}
                         : std::pair{DType::kUInt16, H5T_NATIVE_UINT16};
      case 4:
        return is_signed ? std::pair{DType::kInt32, H5T_NATIVE_INT32}
                         : std::pair{DType::kUInt32, H5T_NATIVE_UINT32};
      case 8:
        return is_signed ? std::pair{DType::kInt64, H5T_NATIVE_INT64}
                         : std::pair{DType::kUInt64, H5T_NATIVE_UINT64};
      default:
        break;
    }
  }
  return {DType::kInvalid, -1};
}

// The little-endian file type and the native memory type a DType is written with; {-1, -1}
// when HDF5 files of Keras do not carry it here.
inline std::pair<hid_t, hid_t> h5_types_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::kFloat64:
      return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::kInt8:
      return {H5T_STD_I8LE, H5T_NATIVE_INT8};
    case DType::kInt16:
      return {H5T_STD_I16LE, H5T_NATIVE_INT16};
    case DType::kInt32:
      return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::kInt64:
      return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case DType::kUInt8:
      return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case DType::kUInt16:
      return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case DType::kUInt32:
      return {H5T_STD_U32LE, H5T_NATIVE_UINT32};
    case DType::kUInt64:
      return {H5T_STD_U64LE, H5T_NATIVE_UINT64};
    default:
      return {-1, -1};
  }
}

// "vlen string[3]", "fixed string(6, nullpad)", "float64[0]", "int64", ...
inline std::string describe_type(hid_t type, hid_t space) {
  std::string out;
  const H5T_class_t cls = H5Tget_class(type);
  if (cls == H5T_STRING) {
    if (H5Tis_variable_str(type) > 0) {
      out = "vlen string";
    } else {
      const H5T_str_t pad = H5Tget_strpad(type);
      out = str_cat("fixed string(", H5Tget_size(type), ", ",
                    pad == H5T_STR_NULLPAD    ? "nullpad"
                    : pad == H5T_STR_NULLTERM ? "nullterm"
                                              : "spacepad",
                    ")");
    }
  } else {
    const auto [dtype, native] = dtype_of(type);
    (void)native;
    out = dtype != DType::kInvalid
              ? std::string(dtype_name(dtype))
              : str_cat("hdf5 class ", static_cast<int>(cls), " size ", H5Tget_size(type));
  }
  if (H5Sget_simple_extent_type(space) == H5S_SIMPLE) {
    const int rank = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    out += "[";
    for (size_t i = 0; i < dims.size(); ++i) out += str_cat(i ? ", " : "", dims[i]);
    out += "]";
  }
  return out;
}

// Fails with NotFoundError / InvalidArgumentError unless `path` is an existing regular file;
// returns its size.
// Debian 12's libhdf5 (1.10.8) loops forever on a global heap collection ("GCOL", where the
// variable-length strings of h5py's attributes live) whose free-space object has size 0: its
// parser never advances (H5HG__cache_heap_deserialize). A corrupt or crafted .h5 would hang
// load_model inside the library, so every collection is walked as that parser walks it before
// the file is opened, and such a file is rejected. `read(offset, n)` returns up to n bytes at
// offset of a file of `size` bytes; `label` names it in the error. Lengths are 8 bytes (the
// superblock default that h5py and Keras use; with 4-byte lengths a collection reads as
// implausible and is skipped).
template <class Read>
void check_global_heaps(uint64_t size, const Read& read, const std::string& label) {
  constexpr uint64_t kChunk = uint64_t{1} << 20, kHeader = 16, kMinCollection = 4096;
  const auto u64 = [](const std::string& b, size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, b.data() + at, sizeof v);  // little-endian, as the file
    return v;
  };
  for (uint64_t at = 0; at < size; at += kChunk) {
    const std::string chunk = read(at, kChunk + 3);  // a signature across chunks is seen once
    for (size_t i = chunk.find("GCOL"); i != std::string::npos && i < kChunk;
         i = chunk.find("GCOL", i + 1)) {
      const uint64_t start = at + i;
      const std::string head = read(start, kHeader);
      if (head.size() < kHeader || head[4] != 1) continue;  // not a version-1 collection
      const uint64_t bytes = u64(head, 8);
      if (bytes < kMinCollection || bytes > size - start) continue;  // HDF5 rejects it itself
      const std::string c = read(start, bytes);
      for (uint64_t p = kHeader; p + kHeader <= c.size();) {
        uint16_t index = 0;
        std::memcpy(&index, c.data() + p, sizeof index);
        const uint64_t object = u64(c, p + 8);
        const uint64_t need = index > 0 ? kHeader + ((object + 7) & ~uint64_t{7}) : object;
        if (need == 0) {
          throw DataLossError(str_cat(label, ": corrupt HDF5 global heap collection at offset ",
                                      start, " (a free-space object of size 0 at offset ",
                                      start + p, ")"));
        }
        if (need > c.size() - p) break;  // past the collection: HDF5's walk ends there too
        p += need;
      }
    }
  }
}

inline uint64_t check_readable_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) {
      throw NotFoundError(str_cat(path, ": no such file"));
    }
    throw UnavailableError(str_cat(path, ": cannot access: ", std::strerror(e)));
  }
  DTRAIN_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace dtrain::checkpoint::h5
