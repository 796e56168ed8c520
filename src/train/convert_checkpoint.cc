// .h5 ↔ TF checkpoint conversion (convert_checkpoint.h).
#include "dtrain/train/convert_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string_view>
#include <utility>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/checkpoint/verify.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/train/saving.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

bool is_h5(const std::string& path) {
  return checkpoint::is_keras_h5_path(path) || checkpoint::is_hdf5_file(path);
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The architecture from options.model: Keras model JSON, or an .h5 written by model.save
// (compiled when `compile`, with its optimizer).
std::unique_ptr<nn::Model> model_from_option(const std::string& path, bool compile) {
  if (is_h5(path)) return load_model(path, {.compile = compile});
  std::unique_ptr<nn::Model> model = nn::model_from_json(read_file(path));
  if (!model->built()) {
    throw InvalidArgumentError(str_cat("convert_checkpoint: the model in ", path,
                                       " declares no input shape (an InputLayer or "
                                       "batch_input_shape), so its weights cannot be created"));
  }
  return model;
}

// Refuses to replace an existing destination unless asked to.
void check_destination(const std::string& dst, bool dst_h5, bool overwrite) {
  if (overwrite) return;
  std::error_code ec;
  if (dst_h5) {
    if (fs::exists(fs::symlink_status(dst, ec))) {
      throw FailedPreconditionError(
          str_cat("convert_checkpoint: ", dst, " already exists; pass --overwrite to replace it"));
    }
  } else if (checkpoint::checkpoint_exists(dst)) {
    throw FailedPreconditionError(
        str_cat("convert_checkpoint: ", dst,
                " is an existing checkpoint (its .index exists or its directory's "
                "'checkpoint' state file names it); pass --overwrite to replace it"));
  }
}

// Writes tf.train.Checkpoint(model=model, optimizer=optimizer) to `dst`.
ConvertCheckpointResult write_prefix(const std::string& src, const std::string& dst,
                                     nn::Model& model, bool optimizer_state) {
  std::vector<std::pair<std::string, checkpoint::Trackable>> children = {{"model", model}};
  optim::Optimizer* opt = model.compiled() ? model.optimizer() : nullptr;
  if (opt != nullptr && optimizer_state) children.emplace_back("optimizer", *opt);
  checkpoint::Checkpoint ckpt(children);
  ckpt.write(dst);
  ConvertCheckpointResult r;
  r.source = src;
  r.destination = dst;
  r.optimizer = children.size() > 1;
  r.tensors = ckpt.keys().size();
  return r;
}

// .h5 or .keras → TF checkpoint: loads the model (and its optimizer), then write_prefix.
ConvertCheckpointResult h5_to_prefix(const std::string& src, const std::string& dst,
                                     const ConvertCheckpointOptions& options) {
  std::unique_ptr<nn::Model> model;
  bool optimizer_state = false;
  if (checkpoint::is_zip_file(src) ||
      (checkpoint::is_keras_v3_path(src) && !checkpoint::is_hdf5_file(src))) {
    // A Keras 3 .keras archive always holds the architecture (and, when compiled, the optimizer).
    model = load_model(src, {.compile = !options.skip_optimizer});
    optimizer_state = model->compiled();
    return write_prefix(src, dst, *model, optimizer_state);
  }
  const checkpoint::KerasH5Contents c = checkpoint::read_keras_h5(src);
  if (c.weights_only || c.model_config.empty()) {
    if (options.model.empty()) {
      throw InvalidArgumentError(str_cat(
          "convert_checkpoint: ", src,
          " holds weights only (save_weights) and no architecture; pass --model model.json or "
          "--model x.h5 to supply it"));
    }
    model = model_from_option(options.model, /*compile=*/false);
    load_weights(*model, src);
  } else {
    model = load_model(src, {.compile = !options.skip_optimizer});
  }
  optimizer_state = !c.optimizer_weights.empty();
  return write_prefix(src, dst, *model, optimizer_state);
}

// TF checkpoint → .h5: restores the checkpoint into the options.model architecture, then
// save_model.
ConvertCheckpointResult prefix_to_h5(const std::string& src, const std::string& dst,
                                     const ConvertCheckpointOptions& options) {
  const std::string prefix = checkpoint::resolve_prefix(src);
  if (options.model.empty()) {
    throw InvalidArgumentError(
        str_cat("convert_checkpoint: writing ", dst,
                " needs the model's architecture, which a TF checkpoint ",
                "does not hold; pass --model model.json or --model x.h5 (written by model.save)"));
  }
  std::vector<std::string> keys;
  {
    checkpoint::BundleReader reader(prefix);  // NotFoundError / DataLossError before building
    keys = reader.keys();
  }
  auto has_prefix = [&](std::string_view p) {
    return std::any_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return starts_with(k, p); });
  };
  // tf.train.Checkpoint(model=..., optimizer=...) puts the model under "model/"; Keras's
  // save_weights(prefix) makes the model the root.
  const bool model_child = has_prefix("model/");
  const bool has_optimizer = model_child && has_prefix("optimizer/") && !options.skip_optimizer;
  std::unique_ptr<nn::Model> model = model_from_option(options.model, /*compile=*/has_optimizer);
  optim::Optimizer* opt = has_optimizer && model->compiled() ? model->optimizer() : nullptr;
  std::unique_ptr<checkpoint::Checkpoint> ckpt;
  if (model_child) {
    std::vector<std::pair<std::string, checkpoint::Trackable>> children = {{"model", *model}};
    if (opt != nullptr) children.emplace_back("optimizer", *opt);
    ckpt = std::make_unique<checkpoint::Checkpoint>(children);
  } else {
    ckpt = std::make_unique<checkpoint::Checkpoint>(checkpoint::Trackable(*model));
  }
  const checkpoint::CheckpointLoadStatus status = ckpt->restore(prefix);
  status.expect_partial();
  std::vector<std::string> missing_model, missing_optimizer;
  for (const std::string& k : status.missing_keys()) {
    const bool optimizer_key =
        starts_with(k, "optimizer/") || k.find("/.OPTIMIZER_SLOT/") != std::string::npos;
    (optimizer_key ? missing_optimizer : missing_model).push_back(k);
  }
  if (!missing_model.empty()) {
    throw InvalidArgumentError(str_cat(
        "convert_checkpoint: ", prefix, " has no value for '", missing_model.front(), "'",
        missing_model.size() > 1 ? str_cat(" and ", missing_model.size() - 1, " more") : "",
        " of the model in ", options.model, ": the architecture does not match the checkpoint"));
  }
  ConvertCheckpointResult r;
  r.source = prefix;
  r.destination = dst;
  r.optimizer = opt != nullptr;
  if (r.optimizer && !missing_optimizer.empty()) {
    r.warnings.push_back(str_cat("convert_checkpoint: ", prefix, " lacks '",
                                 missing_optimizer.front(), "' of the optimizer from ",
                                 options.model, "; writing ", dst, " without optimizer state"));
    r.optimizer = false;
  }
  save_model(*model, dst, {.include_optimizer = r.optimizer});
  r.restored = status.restored_count();
  return r;
}

}  // namespace

ConvertCheckpointResult convert_checkpoint(const std::string& src, const std::string& dst,
                                           const ConvertCheckpointOptions& options) {
  const bool src_h5 = is_h5(src);
  const bool dst_h5 = checkpoint::is_keras_h5_path(dst);
  if (src_h5 == dst_h5) {
    throw InvalidArgumentError(str_cat(
        "convert_checkpoint: converts between an .h5 file and a TF checkpoint prefix; got ", src,
        " and ", dst, src_h5 ? " (both .h5)" : " (neither ends in .h5, .hdf5 or .keras)"));
  }
  check_destination(dst, dst_h5, options.overwrite);
  return src_h5 ? h5_to_prefix(src, dst, options) : prefix_to_h5(src, dst, options);
}

}  // namespace dtrain::train
