// Keras HDF5 layout over libhdf5's C API: string attributes in both of h5py's encodings,
// weight datasets at "<group>/<weight name>" paths, and the crash-safe write (the file is built
// in memory, then written through an AtomicFile: temp file, fsync, rename, fsync of the directory).
// The layout is described in docs/keras-h5.md. Thread-safe: every function works on its own
// handles, and the threadsafe libhdf5 serializes its calls.
#include "dtrain/checkpoint/keras_h5.h"

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

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {
namespace {

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

Handle group_handle(hid_t id) { return Handle(id, H5Gclose); }
Handle dataset_handle(hid_t id) { return Handle(id, H5Dclose); }
Handle attribute_handle(hid_t id) { return Handle(id, H5Aclose); }
Handle type_handle(hid_t id) { return Handle(id, H5Tclose); }
Handle space_handle(hid_t id) { return Handle(id, H5Sclose); }
Handle plist_handle(hid_t id) { return Handle(id, H5Pclose); }
Handle file_handle(hid_t id) { return Handle(id, H5Fclose); }
Handle object_handle(hid_t id) { return Handle(id, H5Oclose); }

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
std::string hdf5_detail() {
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

bool attribute_exists(hid_t obj, const std::string& name) {
  return H5Aexists(obj, name.c_str()) > 0;
}

bool link_exists(hid_t loc, const std::string& name) {
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

std::string join_path(const std::string& group, const std::string& name) {
  if (group.empty() || group == "/") return "/" + name;
  return group + "/" + name;
}

// The DType stored in an HDF5 numeric type and the native memory type to read it with;
// kInvalid when dtrain has no equivalent.
std::pair<DType, hid_t> dtype_of(hid_t type) {
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
std::pair<hid_t, hid_t> h5_types_for(DType dtype) {
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
std::string describe_type(hid_t type, hid_t space) {
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
uint64_t check_readable_file(const std::string& path) {
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

// ---------------------------------------------------------------------------------------------
// Reading.

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    file_size_ = check_readable_file(path_);
    if (H5Fis_hdf5(path_.c_str()) <= 0) {
      throw DataLossError(str_cat(path_, ": not an HDF5 file (no HDF5 signature: empty, ",
                                  "truncated or overwritten)"));
    }
    file_ = file_handle(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_.valid()) {
      throw DataLossError(
          str_cat(path_, ": cannot open the HDF5 file (truncated or corrupt)", hdf5_detail()));
    }
  }

  hid_t file() const { return file_.get(); }
  const std::string& path() const { return path_; }

  [[noreturn]] void corrupt(const std::string& what) const {
    throw DataLossError(str_cat(path_, ": ", what, hdf5_detail()));
  }

  Handle open_group(hid_t loc, const std::string& name, const std::string& full) const {
    Handle g = group_handle(H5Gopen2(loc, name.c_str(), H5P_DEFAULT));
    if (!g.valid()) corrupt(str_cat("cannot open group ", full));
    return g;
  }

  // The strings of attribute `name` of `obj` (scalar → one string). Accepts variable- and
  // fixed-length strings and Keras's empty float64 array (no strings).
  std::vector<std::string> read_strings(hid_t obj, const std::string& name,
                                        const std::string& where) const {
    Handle attr = attribute_handle(H5Aopen(obj, name.c_str(), H5P_DEFAULT));
    if (!attr.valid()) corrupt(str_cat("cannot open attribute '", name, "' of ", where));
    Handle type = type_handle(H5Aget_type(attr.get()));
    Handle space = space_handle(H5Aget_space(attr.get()));
    if (!type.valid() || !space.valid()) {
      corrupt(str_cat("cannot read the type of attribute '", name, "' of ", where));
    }
    const hssize_t points = H5Sget_simple_extent_npoints(space.get());
    if (points < 0) corrupt(str_cat("bad extent of attribute '", name, "' of ", where));
    const size_t n = static_cast<size_t>(points);
    std::vector<std::string> out;
    if (H5Tget_class(type.get()) != H5T_STRING) {
      // save_weights_to_hdf5_group stores an empty list as np.asarray([]) (float64, size 0).
      if (n == 0) return out;
      throw InvalidArgumentError(str_cat(path_, ": attribute '", name, "' of ", where,
                                         " should hold strings but has type ",
                                         describe_type(type.get(), space.get())));
    }
    if (n == 0) return out;
    if (H5Tis_variable_str(type.get()) > 0) {
      Handle mem = type_handle(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      std::vector<char*> buf(n, nullptr);
      if (H5Aread(attr.get(), mem.get(), buf.data()) < 0) {
        corrupt(str_cat("cannot read attribute '", name, "' of ", where));
      }
      for (char* s : buf) out.emplace_back(s != nullptr ? s : "");
      H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, buf.data());
      return out;
    }
    const size_t size = H5Tget_size(type.get());
    const H5T_str_t pad = H5Tget_strpad(type.get());
    Handle mem = type_handle(H5Tcopy(type.get()));
    std::vector<char> buf(n * size + 1, '\0');
    if (size == 0 || H5Aread(attr.get(), mem.get(), buf.data()) < 0) {
      corrupt(str_cat("cannot read attribute '", name, "' of ", where));
    }
    for (size_t i = 0; i < n; ++i) {
      const char* s = buf.data() + i * size;
      size_t len = strnlen(s, size);
      if (pad == H5T_STR_SPACEPAD) {
        while (len > 0 && s[len - 1] == ' ') --len;
      }
      out.emplace_back(s, len);
    }
    return out;
  }

  // A list attribute, joined from `<name>0`, `<name>1`, ... when Keras split it; nullopt when
  // absent.
  std::optional<std::vector<std::string>> read_list(hid_t obj, const std::string& name,
                                                    const std::string& where) const {
    if (attribute_exists(obj, name)) return read_strings(obj, name, where);
    if (!attribute_exists(obj, name + "0")) return std::nullopt;
    std::vector<std::string> out;
    for (int chunk = 0; attribute_exists(obj, str_cat(name, chunk)); ++chunk) {
      std::vector<std::string> part = read_strings(obj, str_cat(name, chunk), where);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  // A scalar string attribute, or "" when absent.
  std::string read_scalar(hid_t obj, const std::string& name, const std::string& where) const {
    if (!attribute_exists(obj, name)) return {};
    std::vector<std::string> v = read_strings(obj, name, where);
    DTRAIN_CHECK(v.size() == 1, path_, ": attribute '", name, "' of ", where,
                 " should be one string, has ", v.size());
    return v[0];
  }

  Tensor read_dataset(hid_t loc, const std::string& name, const std::string& full) const {
    Handle ds = dataset_handle(H5Dopen2(loc, name.c_str(), H5P_DEFAULT));
    if (!ds.valid()) corrupt(str_cat("cannot open dataset ", full));
    Handle type = type_handle(H5Dget_type(ds.get()));
    Handle space = space_handle(H5Dget_space(ds.get()));
    if (!type.valid() || !space.valid()) corrupt(str_cat("cannot read the type of ", full));
    const auto [dtype, mem] = dtype_of(type.get());
    if (dtype == DType::kInvalid) {
      throw UnimplementedError(str_cat(path_, ": ", full, " has element type ",
                                       describe_type(type.get(), space.get()),
                                       "; dtrain reads float32/float64 and integer weights"));
    }
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) corrupt(str_cat("bad dataspace of ", full));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    check_dataset_size(ds.get(), full, dtype, dims);
    std::vector<int64_t> shape(dims.begin(), dims.end());
    Tensor t(dtype, Shape(shape));
    if (t.num_elements() > 0 &&
        H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw_data()) < 0) {
      corrupt(str_cat("cannot read dataset ", full));
    }
    return t;
  }

  // A dataset's shape comes from the file and is untrusted: before allocating, checks that the
  // file can hold the bytes it claims (all of them for contiguous or compact storage; for chunked,
  // possibly compressed storage, deflate's 1032:1 at most).
  void check_dataset_size(hid_t ds, const std::string& full, DType dtype,
                          const std::vector<hsize_t>& dims) const {
    uint64_t bytes = dtype_size(dtype);
    std::string shape = "[";
    bool overflow = false;
    for (size_t i = 0; i < dims.size(); ++i) {
      shape += str_cat(i ? ", " : "", dims[i]);
      overflow = overflow || dims[i] > static_cast<hsize_t>(INT64_MAX) ||
                 __builtin_mul_overflow(bytes, static_cast<uint64_t>(dims[i]), &bytes);
    }
    shape += "]";
    constexpr uint64_t kMaxDeflateRatio = 1032;
    Handle plist = plist_handle(H5Dget_create_plist(ds));
    const bool chunked = plist.valid() && H5Pget_layout(plist.get()) == H5D_CHUNKED;
    uint64_t limit = file_size_;
    if (chunked && __builtin_mul_overflow(file_size_, kMaxDeflateRatio, &limit)) limit = UINT64_MAX;
    if (overflow || bytes > limit) {
      throw DataLossError(str_cat(path_, ": dataset ", full, " claims shape ", shape, " (",
                                  dtype_name(dtype), ", ",
                                  overflow ? std::string("more than 2^64") : str_cat(bytes),
                                  " bytes), more than the file's ", file_size_, " bytes can hold",
                                  chunked ? " even compressed" : "", " (a corrupt dataspace)"));
    }
  }

  // The datasets listed in `weight_names` of group `g` (full path `where`).
  std::vector<H5Weight> read_weight_list(hid_t g, const std::string& where) const {
    std::optional<std::vector<std::string>> names = read_list(g, "weight_names", where);
    if (!names) {
      corrupt(str_cat("group ", where, " has no 'weight_names' attribute"));
    }
    std::vector<H5Weight> out;
    out.reserve(names->size());
    for (const std::string& n : *names) {
      out.push_back({n, read_dataset(g, n, join_path(where, n))});
    }
    return out;
  }

  // layer_names and the layer groups under `g` (path `where`).
  void read_layers(hid_t g, const std::string& where, KerasH5Contents& c) const {
    std::optional<std::vector<std::string>> names = read_list(g, "layer_names", where);
    if (!names) corrupt(str_cat(where, " has no 'layer_names' attribute"));
    for (const std::string& name : *names) {
      const std::string full = join_path(where, name);
      if (!link_exists(g, name)) {
        corrupt(
            str_cat("layer '", name, "' is listed in layer_names but ", full, " does not exist"));
      }
      Handle lg = open_group(g, name, full);
      c.layers.push_back({name, read_weight_list(lg.get(), full)});
    }
    if (link_exists(g, "top_level_model_weights")) {
      const std::string full = join_path(where, "top_level_model_weights");
      Handle tg = open_group(g, "top_level_model_weights", full);
      c.top_level_weights = read_weight_list(tg.get(), full);
    }
  }

  KerasH5Contents read() const {
    KerasH5Contents c;
    const hid_t root = file_.get();
    c.keras_version = read_scalar(root, "keras_version", "/");
    c.backend = read_scalar(root, "backend", "/");
    if (attribute_exists(root, "layer_names") || attribute_exists(root, "layer_names0")) {
      c.weights_only = true;
      read_layers(root, "/", c);
      return c;
    }
    if (!link_exists(root, "model_weights")) {
      throw InvalidArgumentError(
          str_cat(path_,
                  ": not a Keras HDF5 file: it has neither a root 'layer_names' attribute "
                  "(model.save_weights) nor a /model_weights group (model.save)"));
    }
    c.weights_only = false;
    c.model_config = read_scalar(root, "model_config", "/");
    c.training_config = read_scalar(root, "training_config", "/");
    Handle mw = open_group(root, "model_weights", "/model_weights");
    if (c.keras_version.empty()) c.keras_version = read_scalar(mw.get(), "keras_version", "/");
    if (c.backend.empty()) c.backend = read_scalar(mw.get(), "backend", "/");
    read_layers(mw.get(), "/model_weights", c);
    if (link_exists(root, "optimizer_weights")) {
      Handle ow = open_group(root, "optimizer_weights", "/optimizer_weights");
      c.optimizer_weights = read_weight_list(ow.get(), "/optimizer_weights");
    }
    return c;
  }

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  Handle file_;
};

// ---------------------------------------------------------------------------------------------
// Writing.

// Where a write failed, with errno (when the failure came from the OS) mapped as TensorFlow
// maps it.
[[noreturn]] void write_failed(const std::string& path, const std::string& what, int err) {
  const std::string msg = str_cat(path, ": ", what, hdf5_detail(),
                                  err != 0 ? str_cat(": ", std::strerror(err)) : std::string());
  if (err == ENOSPC || err == EFBIG || err == EDQUOT || err == ENOMEM) {
    throw ResourceExhaustedError(msg);
  }
  if (err == ENOENT || err == ENOTDIR) throw NotFoundError(msg);
  if (err == EACCES || err == EPERM || err == EROFS) throw PermissionDeniedError(msg);
  throw InternalError(msg);
}

// Builds the file in memory (HDF5's core driver without a backing store): libhdf5 never touches
// the disk, and its bytes reach the file through an AtomicFile. libhdf5 1.10 cannot recover from
// a failed write to its own file: after ENOSPC in H5Dclose/H5Fflush, H5Fclose fails and leaves a
// file ID whose file it has half torn down, and the library's atexit handler then crashes
// (SIGSEGV in H5F__close_cb) closing it again.

class Writer {
 public:
  // `memory_name` names the in-memory file inside libhdf5 (unique per write: libhdf5 shares the
  // files it has open by name); `increment` is how much memory it grows by.
  Writer(const std::string& memory_name, std::string final_path, size_t increment,
         const KerasH5WriteOptions& options)
      : final_(std::move(final_path)), options_(options) {
    errno = 0;
    Handle fapl = plist_handle(H5Pcreate(H5P_FILE_ACCESS));
    if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), increment, /*backing_store=*/0) < 0) {
      fail("cannot set up an in-memory HDF5 file");
    }
    file_ = file_handle(H5Fcreate(memory_name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!file_.valid()) fail("cannot create an in-memory HDF5 file");
    lcpl_ = plist_handle(H5Pcreate(H5P_LINK_CREATE));
    if (!lcpl_.valid() || H5Pset_create_intermediate_group(lcpl_.get(), 1) < 0) {
      fail("cannot create a link property list");
    }
  }

  hid_t root() const { return file_.get(); }

  [[noreturn]] void fail(const std::string& what) const { write_failed(final_, what, errno); }

  // The bytes of the finished file; closes it (in memory: nothing can fail for lack of disk).
  std::string finish() {
    errno = 0;
    if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) fail("cannot flush the in-memory HDF5 file");
    const ssize_t size = H5Fget_file_image(file_.get(), nullptr, 0);
    if (size < 0) fail("cannot get the file image");
    std::string image(static_cast<size_t>(size), '\0');
    if (H5Fget_file_image(file_.get(), image.data(), image.size()) != size) {
      fail("cannot get the file image");
    }
    lcpl_.reset();
    if (file_.close() < 0) fail("cannot close the in-memory HDF5 file");
    return image;
  }

  Handle create_group(hid_t loc, const std::string& name, const std::string& full) {
    errno = 0;
    Handle g = group_handle(H5Gcreate2(loc, name.c_str(), lcpl_.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!g.valid()) fail("cannot create group " + full);
    return g;
  }

  // A scalar string attribute; `utf8` marks it as h5py marks Python str (else bytes).
  void write_string(hid_t obj, const std::string& name, const std::string& value, bool utf8,
                    const std::string& where) {
    errno = 0;
    Handle type = type_handle(H5Tcopy(H5T_C_S1));
    H5Tset_cset(type.get(), utf8 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    Handle space = space_handle(H5Screate(H5S_SCALAR));
    herr_t ok = 0;
    Handle attr;
    if (options_.fixed_length_strings) {
      H5Tset_size(type.get(), std::max<size_t>(value.size(), 1));
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
      attr = attribute_handle(
          H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
      if (attr.valid()) ok = H5Awrite(attr.get(), type.get(), value.c_str());
    } else {
      H5Tset_size(type.get(), H5T_VARIABLE);
      attr = attribute_handle(
          H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
      const char* p = value.c_str();
      if (attr.valid()) ok = H5Awrite(attr.get(), type.get(), &p);
    }
    if (!attr.valid() || ok < 0) {
      fail(
          str_cat("cannot write attribute '", name, "' of ", where, " (", value.size(), " bytes)"));
    }
  }

  // A list of strings; empty lists as Keras writes them (float64, extent [0]); fixed-length lists
  // above Keras's header limit split into `<name>0`, `<name>1`, ...
  void write_list(hid_t obj, const std::string& name, const std::vector<std::string>& values,
                  const std::string& where) {
    errno = 0;
    if (values.empty()) {
      const hsize_t zero = 0;
      Handle space = space_handle(H5Screate_simple(1, &zero, nullptr));
      Handle attr = attribute_handle(
          H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
      const double dummy = 0;
      if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &dummy) < 0) {
        fail(str_cat("cannot write attribute '", name, "' of ", where));
      }
      return;
    }
    if (!options_.fixed_length_strings) {
      write_list_chunk(obj, name, values, 0, values.size(), 0, where);
      return;
    }
    size_t width = 1;
    for (const std::string& v : values) width = std::max(width, v.size());
    DTRAIN_CHECK(width <= kObjectHeaderLimit, "write_keras_h5: a name in '", name, "' of ", where,
                 " is longer than ", kObjectHeaderLimit, " bytes");
    // np.array_split into the fewest chunks that each fit the header limit.
    size_t chunks = 1;
    while ((values.size() + chunks - 1) / chunks * width > kObjectHeaderLimit) ++chunks;
    if (chunks == 1) {
      write_list_chunk(obj, name, values, 0, values.size(), width, where);
      return;
    }
    size_t begin = 0;
    for (size_t k = 0; k < chunks; ++k) {
      const size_t len = values.size() / chunks + (k < values.size() % chunks ? 1 : 0);
      write_list_chunk(obj, str_cat(name, k), values, begin, begin + len, width, where);
      begin += len;
    }
  }

  void write_dataset(hid_t loc, const std::string& name, const Tensor& value,
                     const std::string& full) {
    errno = 0;
    const auto [file_type, mem_type] = h5_types_for(value.dtype());
    DTRAIN_INTERNAL_CHECK(file_type >= 0);  // checked before writing started
    const std::vector<int64_t> shape = value.shape().to_vector();
    const std::vector<hsize_t> dims(shape.begin(), shape.end());
    Handle space = space_handle(
        dims.empty() ? H5Screate(H5S_SCALAR)
                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    Handle ds = dataset_handle(H5Dcreate2(loc, name.c_str(), file_type, space.get(), lcpl_.get(),
                                          H5P_DEFAULT, H5P_DEFAULT));
    if (!space.valid() || !ds.valid()) fail("cannot create dataset " + full);
    if (value.num_elements() > 0 &&
        H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, value.raw_data()) < 0) {
      fail("cannot write dataset " + full);
    }
    if (ds.close() < 0) fail("cannot close dataset " + full);
  }

  // A group with `weight_names` and one dataset per weight.
  void write_weight_group(hid_t g, const std::vector<H5Weight>& weights, const std::string& where) {
    std::vector<std::string> names;
    for (const H5Weight& w : weights) names.push_back(w.name);
    write_list(g, "weight_names", names, where);
    for (const H5Weight& w : weights) write_dataset(g, w.name, w.value, join_path(where, w.name));
  }

  void write_layers(hid_t g, const std::string& where, const KerasH5Contents& c) {
    std::vector<std::string> names;
    for (const H5LayerWeights& l : c.layers) names.push_back(l.name);
    write_list(g, "layer_names", names, where);
    write_string(g, "backend", c.backend, false, where);
    write_string(g, "keras_version", c.keras_version, false, where);
    // Keras creates the layer groups in sorted name order; readers follow layer_names.
    std::vector<const H5LayerWeights*> sorted;
    for (const H5LayerWeights& l : c.layers) sorted.push_back(&l);
    std::sort(sorted.begin(), sorted.end(),
              [](const H5LayerWeights* a, const H5LayerWeights* b) { return a->name < b->name; });
    for (const H5LayerWeights* l : sorted) {
      const std::string full = join_path(where, l->name);
      Handle lg = create_group(g, l->name, full);
      write_weight_group(lg.get(), l->weights, full);
    }
    if (options_.top_level_group || !c.top_level_weights.empty()) {
      const std::string full = join_path(where, "top_level_model_weights");
      Handle tg = create_group(g, "top_level_model_weights", full);
      write_weight_group(tg.get(), c.top_level_weights, full);
    }
  }

  void write(const KerasH5Contents& c) {
    const hid_t root = file_.get();
    if (c.weights_only) {
      write_layers(root, "/", c);
      return;
    }
    write_string(root, "keras_version", c.keras_version, true, "/");
    write_string(root, "backend", c.backend, true, "/");
    if (!c.model_config.empty()) write_string(root, "model_config", c.model_config, false, "/");
    if (!c.training_config.empty()) {
      write_string(root, "training_config", c.training_config, false, "/");
    }
    Handle mw = create_group(root, "model_weights", "/model_weights");
    write_layers(mw.get(), "/model_weights", c);
    if (!c.optimizer_weights.empty()) {
      Handle ow = create_group(root, "optimizer_weights", "/optimizer_weights");
      write_weight_group(ow.get(), c.optimizer_weights, "/optimizer_weights");
    }
  }

 private:
  void write_list_chunk(hid_t obj, const std::string& name, const std::vector<std::string>& values,
                        size_t begin, size_t end, size_t width, const std::string& where) {
    errno = 0;
    const hsize_t n = end - begin;
    Handle space = space_handle(H5Screate_simple(1, &n, nullptr));
    Handle type = type_handle(H5Tcopy(H5T_C_S1));
    H5Tset_cset(type.get(), H5T_CSET_ASCII);
    herr_t ok = -1;
    Handle attr;
    if (width == 0) {
      H5Tset_size(type.get(), H5T_VARIABLE);
      std::vector<const char*> ptrs;
      for (size_t i = begin; i < end; ++i) ptrs.push_back(values[i].c_str());
      attr = attribute_handle(
          H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
      if (attr.valid()) ok = H5Awrite(attr.get(), type.get(), ptrs.data());
    } else {
      H5Tset_size(type.get(), width);
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
      std::vector<char> buf(static_cast<size_t>(n) * width, '\0');
      for (size_t i = begin; i < end; ++i) {
        std::memcpy(buf.data() + (i - begin) * width, values[i].data(), values[i].size());
      }
      attr = attribute_handle(
          H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
      if (attr.valid()) ok = H5Awrite(attr.get(), type.get(), buf.data());
    }
    if (!attr.valid() || ok < 0) fail(str_cat("cannot write attribute '", name, "' of ", where));
  }

  std::string final_;
  KerasH5WriteOptions options_;
  Handle file_;
  Handle lcpl_;
};

// Rejects contents Keras could not read back: empty or duplicate names, unsupported dtypes.
void validate(const std::string& path, const KerasH5Contents& c) {
  auto check_weights = [&](const std::vector<H5Weight>& weights, const std::string& where) {
    std::set<std::string> seen;
    for (const H5Weight& w : weights) {
      DTRAIN_CHECK(!w.name.empty(), "write_keras_h5: ", path, ": a weight of ", where,
                   " has an empty name");
      DTRAIN_CHECK(w.name.front() != '/' && w.name.back() != '/', "write_keras_h5: ", path,
                   ": weight name '", w.name, "' of ", where, " must not start or end with '/'");
      DTRAIN_CHECK(seen.insert(w.name).second, "write_keras_h5: ", path, ": two weights of ", where,
                   " are named '", w.name, "'");
      DTRAIN_CHECK(w.value.defined(), "write_keras_h5: ", path, ": weight '", w.name, "' of ",
                   where, " is undefined");
      if (h5_types_for(w.value.dtype()).first < 0) {
        throw UnimplementedError(str_cat("write_keras_h5: ", path, ": weight '", w.name, "' of ",
                                         where, " is ", dtype_name(w.value.dtype()),
                                         "; Keras HDF5 files are written with float32/float64 "
                                         "and integer weights only"));
      }
    }
  };
  std::set<std::string> layers;
  for (const H5LayerWeights& l : c.layers) {
    DTRAIN_CHECK(!l.name.empty() && l.name.find('/') == std::string::npos, "write_keras_h5: ", path,
                 ": bad layer name '", l.name, "' (empty or containing '/')");
    DTRAIN_CHECK(l.name != "top_level_model_weights", "write_keras_h5: ", path,
                 ": a layer cannot be named 'top_level_model_weights'");
    DTRAIN_CHECK(layers.insert(l.name).second, "write_keras_h5: ", path, ": two layers are named '",
                 l.name, "'");
    check_weights(l.weights, "layer '" + l.name + "'");
  }
  check_weights(c.top_level_weights, "top_level_model_weights");
  check_weights(c.optimizer_weights, "optimizer_weights");
  DTRAIN_CHECK(!c.weights_only || (c.model_config.empty() && c.training_config.empty() &&
                                   c.optimizer_weights.empty()),
               "write_keras_h5: ", path,
               ": a weights-only file (save_weights layout) has no model_config, "
               "training_config or optimizer weights");
}

// Memory for the in-memory file: the weights' bytes and strings, and room for HDF5's metadata,
// so that it is usually allocated once.
size_t estimated_size(const KerasH5Contents& c) {
  size_t n = (size_t{1} << 20) + c.model_config.size() + c.training_config.size();
  const auto add = [&](const std::vector<H5Weight>& weights) {
    for (const H5Weight& w : weights) n += w.value.nbytes() + w.name.size() + 1024;
  };
  for (const H5LayerWeights& l : c.layers) add(l.weights);
  add(c.top_level_weights);
  add(c.optimizer_weights);
  return n;
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

KerasH5Contents read_keras_h5(const std::string& path) {
  QuietErrors quiet;
  Reader reader(path);
  return reader.read();
}

void write_keras_h5(const std::string& path, const KerasH5Contents& contents,
                    const KerasH5WriteOptions& options) {
  DTRAIN_CHECK(!path.empty() && path.back() != '/', "write_keras_h5: bad path '", path, "'");
  validate(path, contents);
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw NotFoundError(str_cat(path, ": directory '", dir, "' does not exist"));
  }
  std::string image;
  {
    QuietErrors quiet;
    Writer writer(str_cat(path, ".in-memory.", ::getpid(), ".", g_temp_counter++), path,
                  estimated_size(contents), options);
    writer.write(contents);
    image = writer.finish();
  }
  // Temporary file, fdatasync, rename over `path`, fsync of the directory; on failure the
  // temporary file is removed and `path` is unchanged.
  write_file_atomically(path, image);
}

std::vector<H5ObjectInfo> list_h5_objects(const std::string& path) {
  QuietErrors quiet;
  Reader reader(path);
  struct Visit {
    const Reader* reader;
    std::vector<H5ObjectInfo> out;
  } visit{&reader, {}};
  const herr_t r = H5Ovisit(
      reader.file(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t loc, const char* name, const H5O_info_t* info, void* data) -> herr_t {
        auto* v = static_cast<Visit*>(data);
        H5ObjectInfo o;
        o.path = std::string(name) == "." ? "/" : "/" + std::string(name);
        o.is_group = info->type == H5O_TYPE_GROUP;
        Handle obj = object_handle(H5Oopen(loc, name, H5P_DEFAULT));
        if (!obj.valid()) return -1;
        if (info->type == H5O_TYPE_DATASET) {
          Handle type = type_handle(H5Dget_type(obj.get()));
          Handle space = space_handle(H5Dget_space(obj.get()));
          const auto [dtype, mem] = dtype_of(type.get());
          (void)mem;
          o.dtype =
              dtype != DType::kInvalid ? dtype_name(dtype) : describe_type(type.get(), space.get());
          const int rank = H5Sget_simple_extent_ndims(space.get());
          std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
          if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
          o.shape = Shape(std::vector<int64_t>(dims.begin(), dims.end()));
        }
        H5Aiterate2(
            obj.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
            [](hid_t owner, const char* attr_name, const H5A_info_t*, void* out) -> herr_t {
              Handle a = attribute_handle(H5Aopen(owner, attr_name, H5P_DEFAULT));
              Handle t = type_handle(H5Aget_type(a.get()));
              Handle s = space_handle(H5Aget_space(a.get()));
              static_cast<H5ObjectInfo*>(out)->attributes.emplace_back(
                  attr_name, describe_type(t.get(), s.get()));
              return 0;
            },
            &o);
        v->out.push_back(std::move(o));
        return 0;
      },
      &visit);
  if (r < 0) reader.corrupt("cannot list the objects of the file");
  return std::move(visit.out);
}

bool is_keras_h5_path(std::string_view path) {
  for (std::string_view ext : {".h5", ".hdf5", ".keras"}) {
    if (path.size() > ext.size() && path.substr(path.size() - ext.size()) == ext) return true;
  }
  return false;
}

bool is_hdf5_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  QuietErrors quiet;
  return H5Fis_hdf5(path.c_str()) > 0;
}

std::string keras_weight_name(std::string_view variable_name) {
  const size_t colon = variable_name.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < variable_name.size() &&
      std::all_of(variable_name.begin() + static_cast<std::ptrdiff_t>(colon) + 1,
                  variable_name.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::string(variable_name);
  }
  return str_cat(variable_name, ":0");
}

std::string strip_weight_suffix(std::string_view weight_name) {
  const size_t colon = weight_name.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < weight_name.size() &&
      std::all_of(weight_name.begin() + static_cast<std::ptrdiff_t>(colon) + 1, weight_name.end(),
                  [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::string(weight_name.substr(0, colon));
  }
  return std::string(weight_name);
}

}  // namespace dtrain::checkpoint
