// Private to the checkpoint layer: the in-memory HDF5 writer behind write_keras_h5
// (keras_h5_write.cc) and the Keras 3 weights file of a .keras archive (keras_v3.cc). The file is
// built with HDF5's core driver and its image handed back as bytes; callers write them atomically.
#pragma once

#include "h5_support.h"

namespace dtrain::checkpoint::h5 {

// Where a write failed, with errno (when the failure came from the OS) mapped as TensorFlow
// maps it.
[[noreturn]] inline void write_failed(const std::string& path, const std::string& what, int err) {
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

}  // namespace dtrain::checkpoint::h5
