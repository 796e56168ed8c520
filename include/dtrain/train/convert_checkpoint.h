// Conversion between a Keras .h5 file and a TensorFlow checkpoint prefix, as `dtrain ckpt convert`
// does (docs/checkpoint-cli.md). It lives in train, not checkpoint, because both directions go
// through a model: load_model / load_weights and save_model (dtrain/train/saving.h). Not
// thread-safe with respect to the files it writes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dtrain::train {

struct ConvertCheckpointOptions {
  // The architecture: Keras model JSON (with an input shape) or an .h5 written by model.save.
  // Needed to write an .h5 (a TF checkpoint holds no architecture) and to read a weights-only
  // .h5 (save_weights).
  std::string model = {};
  bool skip_optimizer = false;  // convert the model's weights only
  // Replace an existing destination: an .h5 file, or a checkpoint (its .index exists or its
  // directory's `checkpoint` state file names it). Without it such a destination is refused.
  bool overwrite = false;
};

struct ConvertCheckpointResult {
  std::string source;       // what was read: the .h5, or the checkpoint prefix `src` named
  std::string destination;  // what was written
  bool optimizer = false;   // the optimizer state was written too
  size_t tensors = 0;       // .h5 → prefix: the tensors written (object graph excluded)
  size_t restored = 0;      // prefix → .h5: the values restored from the checkpoint
  std::vector<std::string> warnings;  // e.g. optimizer state left out because it was incomplete
};

// Converts `src` into `dst`; the direction follows from which of them is an .h5 path (".h5",
// ".hdf5", ".keras"; `src` may also be any HDF5 file). `src` as a checkpoint may be a prefix, its
// .index or a data file, or a directory (its newest committed checkpoint).
//   .h5 → prefix: tf.train.Checkpoint(model=model, optimizer=optimizer).write(dst), the
//     optimizer only when the file holds optimizer weights and not options.skip_optimizer.
//   prefix → .h5: restores the checkpoint (keys under "model/", or the model as the root) into
//     the options.model architecture and writes it with save_model; every model weight must be
//     in the checkpoint. Optimizer state the checkpoint holds only in part is left out, with a
//     warning in the result.
// Throws InvalidArgumentError (neither or both sides .h5; no architecture where one is needed;
// an architecture that does not match the checkpoint), FailedPreconditionError naming `dst`
// when it exists and options.overwrite is false (nothing is read or written then), and what
// load_model, Checkpoint::restore/write and save_model throw (NotFoundError, DataLossError,
// ResourceExhaustedError, ...). A failed conversion leaves an existing `dst` as it was.
ConvertCheckpointResult convert_checkpoint(const std::string& src, const std::string& dst,
                                           const ConvertCheckpointOptions& options = {});

}  // namespace dtrain::train
