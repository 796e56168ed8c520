// Keras HDF5 files as plain data: what `model.save("x.h5")` and `model.save_weights("x.h5")`
// write (root attributes, /model_weights, /optimizer_weights; docs/keras-h5.md), read and
// written through libhdf5 without interpreting the model. The train layer turns this into models
// (dtrain/train/saving.h). Reads accept every string encoding Keras 2.x files use (h5py 2.x
// fixed-length and h5py 3.x variable-length attributes, split `name0`, `name1`, ... attributes);
// writes are crash-safe (temp file, fsync, rename, fsync of the directory). Thread-safe: calls
// on different files may run concurrently (libhdf5 serializes them internally).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::checkpoint {

// One stored weight: its Keras name ("dense/kernel:0", "Adam/m/dense/kernel:0") and value.
struct H5Weight {
  std::string name;
  Tensor value;
};

// The weights of one layer group, in the order of its `weight_names` attribute (Keras writes
// trainable weights first, then non-trainable ones).
struct H5LayerWeights {
  std::string name;  // the layer's name (its group name)
  std::vector<H5Weight> weights = {};
};

// Everything a Keras .h5 file holds that dtrain uses.
struct KerasH5Contents {
  // true: the `save_weights` layout (layer groups and `layer_names` at the root, no configs, no
  // optimizer); false: the `model.save` layout (/model_weights, root configs).
  bool weights_only = false;
  std::string keras_version = "2.12.0";     // root attribute `keras_version`
  std::string backend = "tensorflow";       // root attribute `backend`
  std::string model_config = {};            // JSON {"class_name", "config"}; empty when absent
  std::string training_config = {};         // JSON {"loss", "metrics", "optimizer_config", ...}
  std::vector<H5LayerWeights> layers = {};  // in `layer_names` order
  // Weights owned by the model itself (group `top_level_model_weights`, Keras >= 2.7).
  std::vector<H5Weight> top_level_weights = {};
  // /optimizer_weights in `weight_names` order; empty when the file has none.
  std::vector<H5Weight> optimizer_weights = {};
};

struct KerasH5WriteOptions {
  // Write string attributes as fixed-length NULLPAD ASCII strings, as h5py 2.x (TF <= 2.3,
  // keras_version "2.2.4-tf") did; default: variable-length strings, as h5py 3.x (Keras 2.12).
  bool fixed_length_strings = false;
  // Write the `top_level_model_weights` group (Keras >= 2.7) even when it holds no weights.
  bool top_level_group = true;
};

// Reads the whole file. Throws NotFoundError (naming the path) when it does not exist,
// DataLossError (naming the file and the object) when it is not a readable HDF5 file
// (truncated, corrupt) or a stored object cannot be read, InvalidArgumentError when it is an
// HDF5 file without Keras's layout (no `layer_names`), UnimplementedError for a weight of an
// element type dtrain has no DType for.
KerasH5Contents read_keras_h5(const std::string& path);

// Writes `contents` to `path` in Keras's layout, atomically: into a temporary file in the same
// directory, fsynced and then renamed over `path` (the directory is fsynced too), so an existing
// file is replaced whole or not at all and a failed write leaves no temporary file behind.
// Blocks until the data is on disk. Throws InvalidArgumentError for duplicate or empty layer
// names or weight names, UnimplementedError for a weight dtype HDF5 files do not carry here
// (anything but float32/64 and 8-64-bit integers), NotFoundError when the directory does not
// exist, ResourceExhaustedError when the disk is full or the file size limit is hit, and
// InternalError for any other write failure (with libhdf5's message).
void write_keras_h5(const std::string& path, const KerasH5Contents& contents,
                    const KerasH5WriteOptions& options = {});

// One object of an HDF5 file, as inspection tools (`dtrain ckpt inspect`) and tests see it.
struct H5ObjectInfo {
  std::string path;        // "/model_weights/dense/dense/kernel:0"; "/" for the root group
  bool is_group = false;   // else a dataset
  std::string dtype = {};  // datasets: "float32", "int64", ... or HDF5's class for others
  Shape shape = {};        // datasets
  // Attribute name → description of its HDF5 type and extent, e.g. "vlen string",
  // "vlen string[3]", "fixed string(6, nullpad)[3]", "float64[0]".
  std::vector<std::pair<std::string, std::string>> attributes = {};
};

// Every group and dataset of the file in name order, root first. Throws as read_keras_h5 does
// for a missing or unreadable file.
std::vector<H5ObjectInfo> list_h5_objects(const std::string& path);

// Whether `path` names an HDF5 file for Keras (ends with ".h5", ".hdf5" or ".keras", as Keras
// 2.x decides between HDF5 and a TF checkpoint prefix).
bool is_keras_h5_path(std::string_view path);

// Whether the file at `path` exists and starts with an HDF5 signature. Never throws.
bool is_hdf5_file(const std::string& path);

// Keras's stored name of a variable: "dense/kernel" → "dense/kernel:0" (unchanged when it
// already ends with ":<digits>").
std::string keras_weight_name(std::string_view variable_name);
// The inverse: "dense/kernel:0" → "dense/kernel".
std::string strip_weight_suffix(std::string_view weight_name);

}  // namespace dtrain::checkpoint
