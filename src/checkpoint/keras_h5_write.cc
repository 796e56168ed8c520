// Writing Keras HDF5 files (write_keras_h5), crash-safe: the file is built in memory, then
// written through an AtomicFile (temp file, fsync, rename, fsync of the directory), so that a
// full disk never leaves a torn file or crashes libhdf5. The layout is in docs/keras-h5.md.
#include "h5_writer.h"

namespace dtrain::checkpoint {
using namespace h5;
namespace {

// ---------------------------------------------------------------------------------------------
// Writing.

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

}  // namespace dtrain::checkpoint
