// Keras 3's native model file (`model.save("x.keras")`) as plain data: a zip archive of
// metadata.json ({"keras_version", "date_saved"}), config.json (the model serialized by
// keras.saving.serialize_keras_object) and model.weights.h5, whose variables sit in one group per
// saveable object at "<attribute path>/vars" ("layers/dense/vars", "optimizer/vars", "vars" for
// the model itself) as datasets "0", "1", ... with an attribute `name` (docs/keras-files.md). Read
// and written without interpreting the model; the train layer maps models onto it
// (dtrain/train/saving.h). Writes are crash-safe (the archive is built in memory, then written to
// a temporary file, fsynced and renamed). Thread-safe: calls on different files may run
// concurrently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"

namespace dtrain::checkpoint {

// The variables of one saveable object (a layer, the optimizer, the model).
struct KerasV3Vars {
  std::string path;       // "layers/dense", "optimizer"; "" for the model itself
  std::string name = {};  // the group's `name` attribute (the object's name); may be empty
  std::vector<Tensor> values = {};  // datasets "0", "1", ... in index order
};

// A file of the archive's assets/ directory (Keras 3's saving_lib keeps what save_assets writes
// there, e.g. a tokenizer's vocabulary).
struct KerasV3Asset {
  std::string path;  // relative to assets/, e.g. "tokenizer/tokenizer.json"
  std::string bytes = {};
};

struct KerasV3Contents {
  std::string metadata_json = {};  // metadata.json, verbatim
  std::string config_json = {};    // config.json, verbatim
  // Every "<path>/vars" group of model.weights.h5; reading returns them sorted by path, writing
  // creates them in this order (groups without values are written too, as Keras does).
  std::vector<KerasV3Vars> vars = {};
  // Every member under assets/ (read in archive order; written after model.weights.h5).
  std::vector<KerasV3Asset> assets = {};

  // The vars group at `path`, or nullptr.
  const KerasV3Vars* find(std::string_view path) const;
};

// Reads a .keras archive. Throws NotFoundError (naming the path) when it does not exist,
// DataLossError (naming the file and the member) when it is not a zip archive, is truncated or
// corrupt (CRC mismatch), a member claims more bytes than its compressed size can hold, or
// model.weights.h5 is not a readable HDF5 file (a vars group with datasets not named 0..n-1, a
// dataset larger than the file), InvalidArgumentError when config.json or model.weights.h5 is
// missing (naming what the archive holds; model.weights.npz is not supported), UnimplementedError
// for a variable of an element type dtrain has no DType for.
KerasV3Contents read_keras_v3(const std::string& path);

// Writes `contents` as a .keras archive at `path` (members stored uncompressed, as Keras writes
// them), atomically: an existing file is replaced whole or left untouched. Throws
// InvalidArgumentError for duplicate or malformed vars paths (empty components, a component
// named "vars"), UnimplementedError for a dtype HDF5 files do not carry here, NotFoundError when
// the directory does not exist, ResourceExhaustedError when the disk is full, InternalError for
// other failures of libzip or libhdf5.
void write_keras_v3(const std::string& path, const KerasV3Contents& contents);

// Reads a Keras 3 weights file (`model.save_weights("x.weights.h5")`: the layout of a .keras
// archive's model.weights.h5, on its own). Throws as read_keras_v3 does for the weights member.
std::vector<KerasV3Vars> read_keras_v3_weights(const std::string& path);

// Whether `path` is an HDF5 file in Keras 3's weights layout (a root `vars` or `layers` group and
// neither Keras 2's `layer_names` nor `model_weights`). Never throws.
bool is_keras_v3_weights_file(const std::string& path);

// Whether the file at `path` exists and starts with a zip signature ("PK\3\4", or "PK\5\6" for an
// empty archive). Never throws.
bool is_zip_file(const std::string& path);

// Whether `path` ends in ".keras".
bool is_keras_v3_path(std::string_view path);

}  // namespace dtrain::checkpoint
