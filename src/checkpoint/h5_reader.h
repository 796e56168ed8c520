// Private to the checkpoint layer: the HDF5 reader behind read_keras_h5 (keras_h5_read.cc) and
// the Keras 3 weights file inside a .keras archive (keras_v3.cc). Reads string attributes in both
// of h5py's encodings and datasets with their sizes checked against the file before allocating.
#pragma once

#include "h5_support.h"

namespace dtrain::checkpoint::h5 {

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    file_size_ = check_readable_file(path_);
    if (H5Fis_hdf5(path_.c_str()) <= 0) {
      throw DataLossError(str_cat(path_, ": not an HDF5 file (no HDF5 signature: empty, ",
                                  "truncated or overwritten)"));
    }
    {
      const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) corrupt(str_cat("cannot open: ", std::strerror(errno)));
      const auto read = [&](uint64_t at, uint64_t n) {
        std::string b(n, '\0');
        const int64_t got = pread_full(fd, b.data(), n, static_cast<int64_t>(at));
        b.resize(got > 0 ? static_cast<size_t>(got) : 0);
        return b;
      };
      try {
        check_global_heaps(file_size_, read, path_);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
    }
    file_ = file_handle(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    if (!file_.valid()) {
      throw DataLossError(
          str_cat(path_, ": cannot open the HDF5 file (truncated or corrupt)", hdf5_detail()));
    }
  }

  // Opens an HDF5 file image held in memory (the weights member of a .keras archive); `label`
  // names it in errors ("x.keras: model.weights.h5").
  Reader(std::string label, const std::string& image) : path_(std::move(label)) {
    file_size_ = image.size();
    static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
    if (image.size() < sizeof(kSignature) ||
        std::memcmp(image.data(), kSignature, sizeof(kSignature)) != 0) {
      throw DataLossError(str_cat(path_, ": not an HDF5 file (no HDF5 signature)"));
    }
    check_global_heaps(
        file_size_,
        [&image](uint64_t at, uint64_t n) {
          return at >= image.size() ? std::string() : image.substr(at, n);
        },
        path_);
    static std::atomic<uint64_t> counter{0};
    Handle fapl = plist_handle(H5Pcreate(H5P_FILE_ACCESS));
    if (!fapl.valid() || H5Pset_fapl_core(fapl.get(), 1 << 16, /*backing_store=*/0) < 0 ||
        H5Pset_file_image(fapl.get(), const_cast<char*>(image.data()), image.size()) < 0) {
      corrupt("cannot set up an in-memory HDF5 file");
    }
    file_ = file_handle(H5Fopen(str_cat("image:", ::getpid(), ".", counter++, ":", path_).c_str(),
                                H5F_ACC_RDONLY, fapl.get()));
    if (!file_.valid()) corrupt("cannot open the HDF5 file (truncated or corrupt)");
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
    // Every string takes file space (a variable-length one its 16-byte global heap reference, a
    // fixed-length one its size): an extent past that is corrupt, and reading it would loop over
    // the claimed count inside HDF5 (a fuzzed file's "1 string" read as billions took minutes).
    const bool variable = H5Tis_variable_str(type.get()) > 0;
    const size_t element_bytes = variable ? 16 : std::max<size_t>(H5Tget_size(type.get()), 1);
    if (n > file_size_ / element_bytes) {
      corrupt(str_cat("attribute '", name, "' of ", where, " claims ", n,
                      " strings, more than the file's ", file_size_, " bytes can hold"));
    }
    if (variable) {
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

}  // namespace dtrain::checkpoint::h5
