// Embedding.
#include "dtrain/nn/embedding.h"

#include "config.h"
#include "dtrain/autograd/embedding.h"
#include "layer_registry.h"
#include "masking.h"

namespace dtrain::nn {

using nlohmann::json;

Embedding::Embedding(int64_t input_dim, int64_t output_dim, EmbeddingOptions options)
    : Layer(detail::name_or_default(options.name, "embedding")),
      input_dim_(input_dim),
      output_dim_(output_dim),
      mask_zero_(options.mask_zero),
      input_length_(options.input_length),
      init_(detail::make_initializer(options.embeddings_initializer, options.seed)),
      where_(str_cat("Embedding '", name(), "'")),
      lookup_where_(str_cat(where_, " (input_dim ", input_dim, ")")) {
  DTRAIN_CHECK(input_dim > 0 && output_dim > 0, where_,
               ": input_dim and output_dim must be positive, got ", input_dim, " and ", output_dim);
  embeddings_ = &add_weight("embeddings", Shape{input_dim_, output_dim_}, *init_);
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
  } else if (input_length_) {
    set_input_shape(Shape{*input_length_});
  }
  mark_built(input_shape());
}

Tensor Embedding::call(const Tensor& ids, bool) {
  return embedding_lookup(embeddings_->value(), ids, lookup_where_);
}

Tensor Embedding::compute_mask(const Tensor& ids, const Tensor& /*mask*/) const {
  return mask_zero_ ? detail::nonzero_mask(ids) : Tensor();
}

Shape Embedding::compute_output_shape(const Shape& input_shape) const {
  Shape out = input_shape;
  out.push_back(output_dim_);
  return out;
}

std::string Embedding::config_json() const {
  json c = detail::base_config(*this);
  c["input_dim"] = input_dim_;
  c["output_dim"] = output_dim_;
  c["embeddings_initializer"] = detail::initializer_config(*init_);
  c["embeddings_regularizer"] = nullptr;
  c["activity_regularizer"] = nullptr;
  c["embeddings_constraint"] = nullptr;
  c["mask_zero"] = mask_zero_;
  c["input_length"] = input_length_ ? json(*input_length_) : json(nullptr);
  return c.dump();
}

namespace {

std::shared_ptr<Layer> embedding_from_config(const json& c, const std::string& where) {
  std::optional<int64_t> input_length;
  if (c.contains("input_length") && c["input_length"].is_number_integer()) {
    input_length = c["input_length"].get<int64_t>();
  }
  return std::make_shared<Embedding>(
      detail::int_field(c, "input_dim", where), detail::int_field(c, "output_dim", where),
      EmbeddingOptions{.embeddings_initializer =
                           detail::initializer_json(c, "embeddings_initializer", "uniform"),
                       .mask_zero = detail::bool_field(c, "mask_zero", where, false),
                       .input_length = input_length,
                       .input_shape = detail::declared_input_shape(c, where),
                       .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_embedding_layers(LayerRegistry& registry) {
  registry.add("Embedding", embedding_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
