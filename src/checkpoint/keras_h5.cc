// Keras HDF5 files over libhdf5's C API: the path and name helpers. Reading is in
// keras_h5_read.cc, writing in keras_h5_write.cc, the shared handles in h5_support.h; the layout
// is described in docs/keras-h5.md. Thread-safe: every function works on its own handles, and the
// threadsafe libhdf5 serializes its calls.
#include "dtrain/checkpoint/keras_h5.h"

#include "h5_support.h"

namespace dtrain::checkpoint {
using namespace h5;

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
