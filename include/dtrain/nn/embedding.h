// keras.layers.Embedding: integer ids → rows of a trainable table. Thread-safety as for Layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

struct EmbeddingOptions {
  std::string embeddings_initializer = "uniform";  // Keras's RandomUniform(-0.05, 0.05)
  std::optional<uint64_t> seed = std::nullopt;     // initializer seed
  // Id 0 is padding: the output's mask [batch, T] is ids != 0, which Sequential and Functional
  // pass on to the layers that use it (Layer::call_masked; docs/layers.md, "Masking").
  bool mask_zero = false;
  std::optional<int64_t> input_length = std::nullopt;  // Keras 2's input_length (accepted)
  std::optional<Shape> input_shape = std::nullopt;     // per-example ids shape, e.g. [T]
  std::string name = {};                               // default "embedding", "embedding_1", ...
};

// out[..., :] = embeddings[ids[...], :] with the weight "embeddings" [input_dim, output_dim].
// Ids may be of any integer or float dtype (Keras casts them to int); an id outside
// [0, input_dim) throws InvalidArgumentError naming the layer, its input_dim, the position
// and the id. The
// weights do not depend on the ids' shape, so the layer is built at construction and takes
// sequences of any length.
class Embedding : public Layer {
 public:
  Embedding(int64_t input_dim, int64_t output_dim, EmbeddingOptions options = {});
  std::string class_name() const override { return "Embedding"; }
  Tensor call(const Tensor& ids, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  // With mask_zero, ids != 0 (float32 0/1 of the ids' shape); else none.
  Tensor compute_mask(const Tensor& ids, const Tensor& mask) const override;
  std::string config_json() const override;

  int64_t input_dim() const { return input_dim_; }
  int64_t output_dim() const { return output_dim_; }
  bool mask_zero() const { return mask_zero_; }
  Variable& embeddings() { return *embeddings_; }

 protected:
  // A declared input shape fixes the rank only: ids of any length map to the same table.
  bool accepts_input_shape(const Shape& built_for, const Shape& input_shape) const override {
    return same_rank_and_trailing(built_for, input_shape, 0);
  }

 private:
  int64_t input_dim_;
  int64_t output_dim_;
  bool mask_zero_;
  std::optional<int64_t> input_length_;
  std::shared_ptr<Initializer> init_;
  Variable* embeddings_ = nullptr;
  std::string where_;         // "Embedding 'name'", for errors
  std::string lookup_where_;  // "Embedding 'name' (input_dim N)", for bad ids
};

}  // namespace dtrain::nn
