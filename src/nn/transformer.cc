// TransformerBlock and the GPT decoder language model.
#include "dtrain/nn/transformer.h"

#include "config.h"
#include "dtrain/autograd/array_ops.h"
#include "dtrain/autograd/functions.h"
#include "layer_registry.h"

namespace dtrain::nn {

using nlohmann::json;

namespace {

// Sub-seed `k` of an optional seed (each sub-layer draws from its own stream).
std::optional<uint64_t> sub_seed(const std::optional<uint64_t>& seed, uint64_t k) {
  if (!seed) return std::nullopt;
  return *seed * 1000003ull + k;
}

template <class L>
L* track_as(Model& m, const std::string& attribute, L layer) {
  auto p = std::make_shared<L>(std::move(layer));
  L* raw = p.get();
  m.track(std::move(p), attribute);
  return raw;
}

}  // namespace

// --- TransformerBlock --------------------------------------------------------------------------

TransformerBlock::TransformerBlock(TransformerBlockOptions options)
    : Model(detail::name_or_default(options.name, "transformer_block")), options_(options) {
  const int64_t d = options.d_model, h = options.num_heads;
  DTRAIN_CHECK(d > 0 && h > 0 && d % h == 0, "TransformerBlock '", name(),
               "': d_model must be a positive multiple of num_heads, got d_model ", d,
               " and num_heads ", h);
  DTRAIN_CHECK(options.dropout >= 0.0f && options.dropout < 1.0f, "TransformerBlock '", name(),
               "': dropout must be in [0, 1), got ", options.dropout);
  const std::string p = name() + "/";
  const auto& seed = options.seed;
  ln1_ =
      track_as(*this, "ln1", LayerNormalization({.epsilon = options.epsilon, .name = p + "ln1"}));
  attention_ = track_as(
      *this, "attention",
      MultiHeadAttention(
          h, d / h,
          {.dropout = options.dropout, .seed = sub_seed(seed, 1), .name = p + "attention"}));
  ln2_ =
      track_as(*this, "ln2", LayerNormalization({.epsilon = options.epsilon, .name = p + "ln2"}));
  ffn_up_ = track_as(
      *this, "ffn_up",
      Dense(4 * d, {.activation = "gelu", .seed = sub_seed(seed, 2), .name = p + "ffn_up"}));
  ffn_down_ =
      track_as(*this, "ffn_down", Dense(d, {.seed = sub_seed(seed, 3), .name = p + "ffn_down"}));
  dropout1_ =
      track_as(*this, "dropout1",
               Dropout(options.dropout, {.seed = sub_seed(seed, 4), .name = p + "dropout1"}));
  dropout2_ =
      track_as(*this, "dropout2",
               Dropout(options.dropout, {.seed = sub_seed(seed, 5), .name = p + "dropout2"}));
  // Build every sub-layer for [batch, T, d] now (the weights do not depend on T).
  const Shape per_example{1, d};
  ln1_->build(per_example);
  attention_->build(per_example);
  ln2_->build(per_example);
  ffn_up_->build(per_example);
  ffn_down_->build(Shape{1, 4 * d});
  dropout1_->build(per_example);
  dropout2_->build(per_example);
  mark_built(per_example);
}

Tensor TransformerBlock::call(const Tensor& x, bool training) {
  DTRAIN_CHECK(x.rank() == 3 && x.dim(2) == options_.d_model, "TransformerBlock '", name(),
               "': expected [batch, time, ", options_.d_model, "], got ", x.shape().to_string());
  const Tensor a = (*ln1_)(x);
  Tensor h = (*attention_)(a, a, {.use_causal_mask = true, .training = training});
  if (options_.dropout > 0.0f) h = (*dropout1_)(h, training);
  const Tensor r = x + h;
  Tensor f = (*ffn_down_)((*ffn_up_)((*ln2_)(r)));
  if (options_.dropout > 0.0f) f = (*dropout2_)(f, training);
  return r + f;
}

std::string TransformerBlock::config_json() const {
  json c = detail::base_config(*this);
  c["d_model"] = options_.d_model;
  c["num_heads"] = options_.num_heads;
  c["dropout"] = options_.dropout;
  c["epsilon"] = options_.epsilon;
  c["seed"] = options_.seed ? json(*options_.seed) : json(nullptr);
  return c.dump();
}

// --- GPT ---------------------------------------------------------------------------------------

GPT::GPT(GPTConfig config)
    : Model(detail::name_or_default(config.name, "gpt")), config_(std::move(config)) {
  const GPTConfig& c = config_;
  DTRAIN_CHECK(
      c.vocab_size > 0 && c.context > 0 && c.num_layers >= 0 && c.d_model > 0 && c.num_heads > 0,
      "GPT '", name(), "': vocab_size, context, d_model and num_heads must be positive ",
      "and num_layers >= 0, got vocab_size ", c.vocab_size, ", context ", c.context,
      ", num_layers ", c.num_layers, ", d_model ", c.d_model, ", num_heads ", c.num_heads);
  DTRAIN_CHECK(c.d_model % c.num_heads == 0, "GPT '", name(), "': d_model ", c.d_model,
               " must be a multiple of num_heads ", c.num_heads);
  // GPT-2's initialization scale for the embeddings: N(0, 0.02).
  auto emb_init = [&](uint64_t k) {
    const std::optional<uint64_t> s = sub_seed(c.seed, k);
    return json{{"class_name", "RandomNormal"},
                {"config", {{"mean", 0.0}, {"stddev", 0.02}, {"seed", s ? json(*s) : json()}}}}
        .dump();
  };
  token_embedding_ =
      track_as(*this, "token_embedding",
               Embedding(c.vocab_size, c.d_model,
                         {.embeddings_initializer = emb_init(10), .name = "token_embedding"}));
  position_embedding_ =
      track_as(*this, "position_embedding",
               Embedding(c.context, c.d_model,
                         {.embeddings_initializer = emb_init(11), .name = "position_embedding"}));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string block_name = str_cat("block_", i);
    auto block = std::make_shared<TransformerBlock>(
        TransformerBlockOptions{.d_model = c.d_model,
                                .num_heads = c.num_heads,
                                .dropout = c.dropout,
                                .seed = sub_seed(c.seed, 100 + static_cast<uint64_t>(i)),
                                .name = block_name});
    blocks_.push_back(block.get());
    track(std::move(block), block_name);
  }
  final_norm_ =
      track_as(*this, "final_norm", LayerNormalization({.epsilon = 1e-5f, .name = "final_norm"}));
  head_ =
      track_as(*this, "head", Dense(c.vocab_size, {.seed = sub_seed(c.seed, 12), .name = "head"}));
  final_norm_->build(Shape{1, c.d_model});
  head_->build(Shape{1, c.d_model});
  mark_built(Shape{c.context});
}

Tensor GPT::call(const Tensor& tokens, bool training) {
  DTRAIN_CHECK(tokens.defined() && tokens.rank() == 2, "GPT '", name(),
               "': expected token ids [batch, time], got ",
               tokens.defined() ? tokens.shape().to_string() : std::string("undefined"));
  const int64_t t_len = tokens.dim(1);
  DTRAIN_CHECK(t_len >= 1 && t_len <= config_.context, "GPT '", name(), "': a sequence of ", t_len,
               " tokens does not fit the context of ", config_.context,
               " (the longest sequence the position embedding covers)");
  const Tensor positions = slice_axis(position_embedding_->embeddings().value(), 0, 0, t_len);
  Tensor h = (*token_embedding_)(tokens) + positions;  // [B, T, d] + [T, d]
  for (TransformerBlock* b : blocks_) h = (*b)(h, training);
  return (*head_)((*final_norm_)(h));
}

Shape GPT::compute_output_shape(const Shape& input_shape) const {
  Shape out = input_shape;
  out.push_back(config_.vocab_size);
  return out;
}

std::string GPT::config_json() const {
  json c = detail::base_config(*this);
  c["vocab_size"] = config_.vocab_size;
  c["context"] = config_.context;
  c["num_layers"] = config_.num_layers;
  c["d_model"] = config_.d_model;
  c["num_heads"] = config_.num_heads;
  c["dropout"] = config_.dropout;
  c["seed"] = config_.seed ? json(*config_.seed) : json(nullptr);
  return c.dump();
}

std::string GPT::to_json() const {
  json j;
  j["class_name"] = class_name();
  j["config"] = json::parse(config_json());
  j["keras_version"] = "2.12.0";
  j["backend"] = "tensorflow";
  return j.dump();
}

std::unique_ptr<GPT> GPT::from_config(const std::string& config_json, const std::string& where) {
  json c;
  try {
    c = json::parse(config_json);
  } catch (const json::exception& e) {
    throw InvalidArgumentError(str_cat(where, ": invalid JSON: ", e.what()));
  }
  DTRAIN_CHECK(c.is_object(), where, ": expected a JSON object, got ", c.dump());
  std::optional<uint64_t> seed;
  if (c.contains("seed") && c["seed"].is_number_integer()) seed = c["seed"].get<uint64_t>();
  auto gpt = std::make_unique<GPT>(
      GPTConfig{.vocab_size = detail::int_field(c, "vocab_size", where),
                .context = detail::int_field(c, "context", where),
                .num_layers = detail::int_field(c, "num_layers", where),
                .d_model = detail::int_field(c, "d_model", where),
                .num_heads = detail::int_field(c, "num_heads", where),
                .dropout = static_cast<float>(detail::number_field(c, "dropout", where, 0.0)),
                .seed = seed,
                .name = c.contains("name") && c["name"].is_string() ? c["name"].get<std::string>()
                                                                    : std::string()});
  gpt->set_trainable(detail::bool_field(c, "trainable", where, true));
  return gpt;
}

namespace {

std::shared_ptr<Layer> block_from_config(const json& c, const std::string& where) {
  std::optional<uint64_t> seed;
  if (c.contains("seed") && c["seed"].is_number_integer()) seed = c["seed"].get<uint64_t>();
  return std::make_shared<TransformerBlock>(TransformerBlockOptions{
      .d_model = detail::int_field(c, "d_model", where),
      .num_heads = detail::int_field(c, "num_heads", where),
      .dropout = static_cast<float>(detail::number_field(c, "dropout", where, 0.0)),
      .epsilon = static_cast<float>(detail::number_field(c, "epsilon", where, 1e-5)),
      .seed = seed,
      .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> gpt_from_config(const json& c, const std::string& where) {
  return std::shared_ptr<Layer>(GPT::from_config(c.dump(), where).release());
}

}  // namespace

namespace detail {
void register_transformer_layers(LayerRegistry& registry) {
  registry.add("TransformerBlock", block_from_config);
  registry.add("GPT", gpt_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
