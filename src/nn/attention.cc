// MultiHeadAttention.
#include "dtrain/nn/attention.h"

#include <algorithm>
#include <cmath>

#include "config.h"
#include "dtrain/autograd/attention.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/attention_fused.h"
#include "layer_registry.h"
#include "masking.h"

namespace dtrain::nn {

using nlohmann::json;

MultiHeadAttention::MultiHeadAttention(int64_t num_heads, int64_t key_dim,
                                       MultiHeadAttentionOptions options)
    : Layer(detail::name_or_default(options.name, "multi_head_attention")),
      num_heads_(num_heads),
      key_dim_(key_dim),
      value_dim_(options.value_dim.value_or(key_dim)),
      dropout_rate_(options.dropout),
      use_bias_(options.use_bias),
      output_shape_(options.output_shape),
      kernel_init_(detail::make_initializer(options.kernel_initializer, options.seed)),
      bias_init_(detail::make_initializer(options.bias_initializer, std::nullopt)),
      seed_(options.seed),
      dropout_(options.dropout, DropoutOptions{.seed = options.seed, .name = name() + "/dropout"}) {
  DTRAIN_CHECK(num_heads > 0 && key_dim > 0 && value_dim_ > 0, "MultiHeadAttention '", name(),
               "': num_heads, key_dim and value_dim must be positive, got ", num_heads, ", ",
               key_dim, " and ", value_dim_);
  DTRAIN_CHECK(!output_shape_ || *output_shape_ > 0, "MultiHeadAttention '", name(),
               "': output_shape must be positive, got ", output_shape_.value_or(0));
}

void MultiHeadAttention::build_for(int64_t query_features, int64_t value_features,
                                   int64_t key_features) {
  if (weights_built_) {
    DTRAIN_CHECK(query_features == query_features_ && value_features == value_features_ &&
                     key_features == key_features_,
                 "MultiHeadAttention '", name(), "': built for query, value and key features ",
                 query_features_, ", ", value_features_, " and ", key_features_, ", got ",
                 query_features, ", ", value_features, " and ", key_features);
    return;
  }
  DTRAIN_CHECK(query_features > 0 && value_features > 0 && key_features > 0, "MultiHeadAttention '",
               name(), "': feature sizes must be positive");
  query_features_ = query_features;
  value_features_ = value_features;
  key_features_ = key_features;
  out_features_ = output_shape_.value_or(query_features);
  const int64_t n = num_heads_;
  // Keras's creation order: query, key, value, attention_output; kernel before bias.
  wq_ = &add_weight("query/kernel", Shape{query_features, n, key_dim_}, *kernel_init_);
  if (use_bias_) bq_ = &add_weight("query/bias", Shape{n, key_dim_}, *bias_init_);
  wk_ = &add_weight("key/kernel", Shape{key_features, n, key_dim_}, *kernel_init_);
  if (use_bias_) bk_ = &add_weight("key/bias", Shape{n, key_dim_}, *bias_init_);
  wv_ = &add_weight("value/kernel", Shape{value_features, n, value_dim_}, *kernel_init_);
  if (use_bias_) bv_ = &add_weight("value/bias", Shape{n, value_dim_}, *bias_init_);
  wo_ = &add_weight("attention_output/kernel", Shape{n, value_dim_, out_features_}, *kernel_init_);
  if (use_bias_) bo_ = &add_weight("attention_output/bias", Shape{out_features_}, *bias_init_);
  weights_built_ = true;
}

void MultiHeadAttention::build_impl(const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() == 2, "MultiHeadAttention '", name(),
               "': expected inputs [batch, time, features], got per-example shape ",
               input_shape.to_string());
  build_for(input_shape[1], input_shape[1], input_shape[1]);
}

namespace {

// x [batch, time, features] · kernel [features, heads, dim] + bias [heads, dim] as one GEMM →
// [batch, time, heads, dim].
Tensor project(const Tensor& x, const Variable& kernel, const Variable* bias) {
  const int64_t features = kernel.shape()[0];
  const int64_t heads = kernel.shape()[1], dim = kernel.shape()[2];
  const Tensor flat = reshape(x, Shape{x.dim(0) * x.dim(1), features});
  const Tensor w = reshape(kernel.value(), Shape{features, heads * dim});
  const Tensor b = bias ? reshape(bias->value(), Shape{heads * dim}) : Tensor();
  return reshape(dense(flat, w, b, ops::Activation::kLinear),
                 Shape{x.dim(0), x.dim(1), heads, dim});
}

}  // namespace

Tensor MultiHeadAttention::combined_mask(const AttentionCallOptions& options,
                                         const Tensor& attention_mask, int64_t batch, int64_t t_len,
                                         int64_t s_len) const {
  // Keras's _compute_attention_mask: query_mask[:, :, None] & value_mask[:, None, :] &
  // key_mask[:, None, :] & attention_mask & causal (s <= t), materialized as [batch, 1, T, S].
  auto rows = [&](const Tensor& m, int64_t len) {
    return m.defined() ? detail::sequence_mask(m, batch, len, *this) : Tensor();
  };
  const Tensor qm = rows(options.query_mask, t_len);
  const Tensor vm = rows(options.value_mask, s_len);
  const Tensor km = rows(options.key_mask, s_len);
  Tensor am;  // [B or 1, 1, T or 1, S or 1] (rank 4 after the reshape above) or [T|1, S|1]
  int64_t ab = 1, at = 1, as = 1;
  if (attention_mask.defined()) {
    am = detail::nonzero_mask(attention_mask);
    const Shape& m = am.shape();
    ab = m.rank() == 4 ? m[0] : 1;
    at = m.dim(-2);
    as = m.dim(-1);
  }
  Tensor out(Shape{batch, 1, t_len, s_len});
  float* o = out.data<float>();
  const float* pq = qm.defined() ? qm.data<float>() : nullptr;
  const float* pv = vm.defined() ? vm.data<float>() : nullptr;
  const float* pk = km.defined() ? km.data<float>() : nullptr;
  const float* pa = am.defined() ? am.data<float>() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < t_len; ++t) {
      const float q = pq ? pq[b * t_len + t] : 1.0f;
      for (int64_t s = 0; s < s_len; ++s) {
        float v = q;
        if (pv) v *= pv[b * s_len + s];
        if (pk) v *= pk[b * s_len + s];
        if (pa) {
          v *= pa[((ab == 1 ? 0 : b) * at + (at == 1 ? 0 : t)) * as + (as == 1 ? 0 : s)];
        }
        if (options.use_causal_mask && s > t) v = 0.0f;
        o[(b * t_len + t) * s_len + s] = v;
      }
    }
  }
  return out;
}

Tensor MultiHeadAttention::attend(const Tensor& query, const Tensor& value,
                                  const AttentionCallOptions& options) {
  const Tensor& key = options.key.defined() ? options.key : value;
  auto check_input = [&](const Tensor& t, const char* what) {
    DTRAIN_CHECK(t.defined() && t.dtype() == DType::kFloat32 && t.rank() == 3,
                 "MultiHeadAttention '", name(), "': ", what,
                 " must be float32 [batch, time, features], got ",
                 t.defined() ? str_cat(dtype_name(t.dtype()), " ", t.shape().to_string())
                             : std::string("undefined"));
  };
  check_input(query, "the query");
  check_input(value, "the value");
  check_input(key, "the key");
  DTRAIN_CHECK(
      value.dim(0) == query.dim(0) && key.dim(0) == query.dim(0) && key.dim(1) == value.dim(1),
      "MultiHeadAttention '", name(), "': query ", query.shape().to_string(), ", value ",
      value.shape().to_string(), " and key ", key.shape().to_string(),
      " must share the batch size, and key and value the length");
  build_for(query.dim(2), value.dim(2), key.dim(2));
  if (!built()) mark_built();
  const int64_t batch = query.dim(0), t_len = query.dim(1), s_len = value.dim(1);

  // The mask as [batch, 1, T, S] (broadcast over heads, as Keras expands it).
  Tensor mask = options.attention_mask;
  if (mask.defined()) {
    const Shape& m = mask.shape();
    const bool rank_ok = m.rank() == 2 || m.rank() == 3;
    const bool fits = rank_ok && (m.dim(-1) == s_len || m.dim(-1) == 1) &&
                      (m.dim(-2) == t_len || m.dim(-2) == 1) &&
                      (m.rank() == 2 || m.dim(0) == batch || m.dim(0) == 1);
    DTRAIN_CHECK(fits, "MultiHeadAttention '", name(), "': attention_mask ", m.to_string(),
                 " does not match [batch, T, S] = [", batch, ", ", t_len, ", ", s_len, "]");
    if (m.rank() == 3) mask = mask.reshape(Shape{m[0], 1, m[1], m[2]});
  }
  // The fused kernel when nothing needs the [B, N, T, S] probabilities (returned scores,
  // dropout on them) and the masks are causal and/or a key padding mask under which every query
  // sees a key (Keras's uniform fully-masked rows stay on the unfused path).
  if (!mask.defined() && !options.attention_scores &&
      (dropout_rate_ <= 0.0f || !options.training)) {
    Tensor key_padding;
    if (fusable_masks(options, batch, t_len, s_len, &key_padding)) {
      const Tensor q = project(query, *wq_, bq_);
      const Tensor k = project(key, *wk_, bk_);
      const Tensor v = project(value, *wv_, bv_);
      const Tensor context =
          fused_attention(q, k, v, key_padding,
                          {.scale = 1.0f / std::sqrt(static_cast<float>(key_dim_)),
                           .causal = options.use_causal_mask});
      return output_projection(context, batch, t_len);
    }
  }
  // With any mask, the causal mask joins the combined mask (one −1e9 per masked score, so a
  // fully masked row is uniform, as Keras's single combined mask gives).
  const bool keras_masks =
      options.query_mask.defined() || options.value_mask.defined() || options.key_mask.defined();
  if (keras_masks || (mask.defined() && options.use_causal_mask)) {
    mask = combined_mask(options, mask, batch, t_len, s_len);
  }
  const bool causal_in_softmax = options.use_causal_mask && !mask.defined();

  const Tensor q = project(query, *wq_, bq_);
  const Tensor k = project(key, *wk_, bk_);
  const Tensor v = project(value, *wv_, bv_);
  // A causal softmax never reads the scores above the diagonal: the products skip them.
  const bool causal_products = causal_in_softmax && t_len == s_len;
  const Tensor scores = multihead_scores(q, k, causal_products);  // [B, N, T, S]
  const Tensor probs = masked_softmax(
      scores, mask,
      {.scale = 1.0f / std::sqrt(static_cast<float>(key_dim_)), .causal = causal_in_softmax});
  if (options.attention_scores) *options.attention_scores = probs;
  // Dropout::call directly: Layer::operator() would pin the first call's [B, N, T, S].
  const Tensor dropped = dropout_rate_ > 0.0f ? dropout_.call(probs, options.training) : probs;
  const Tensor context = multihead_combine(dropped, v, causal_products);  // [B, T, N, Hv]
  return output_projection(context, batch, t_len);
}

Tensor MultiHeadAttention::output_projection(const Tensor& context, int64_t batch,
                                             int64_t t_len) const {
  const Tensor flat = reshape(context, Shape{batch * t_len, num_heads_ * value_dim_});
  const Tensor w = reshape(wo_->value(), Shape{num_heads_ * value_dim_, out_features_});
  const Tensor b = bo_ ? bo_->value() : Tensor();
  return reshape(dense(flat, w, b, ops::Activation::kLinear), Shape{batch, t_len, out_features_});
}

bool MultiHeadAttention::fusable_masks(const AttentionCallOptions& options, int64_t batch,
                                       int64_t t_len, int64_t s_len, Tensor* key_padding) const {
  if (s_len == 0) return false;  // no key at all: the unfused path's result, whatever it is
  if (options.query_mask.defined()) {
    // A masked query's row is fully masked (uniform in Keras): only an all-true mask fuses.
    const Tensor qm = detail::sequence_mask(options.query_mask, batch, t_len, *this);
    const float* p = qm.data<float>();
    if (!std::all_of(p, p + qm.num_elements(), [](float x) { return x != 0.0f; })) return false;
  }
  auto rows = [&](const Tensor& m) {
    return m.defined() ? detail::sequence_mask(m, batch, s_len, *this) : Tensor();
  };
  Tensor km = rows(options.value_mask);
  if (const Tensor k = rows(options.key_mask); k.defined()) {
    km = km.defined() ? detail::mask_and(km, k, *this) : k;
  }
  *key_padding = km;
  return !km.defined() || ops::fused_attention_rows_have_keys(km.data<float>(), batch, s_len,
                                                              options.use_causal_mask);
}

namespace {

// a [B, S, N, H] ++ b [B, t, N, H] along time (a undefined: b).
Tensor append_time(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b.clone();
  const int64_t B = a.dim(0), S = a.dim(1), t = b.dim(1);
  const int64_t row = a.dim(2) * a.dim(3);
  Tensor out(Shape{B, S + t, a.dim(2), a.dim(3)});
  for (int64_t i = 0; i < B; ++i) {
    std::copy_n(a.data<float>() + i * S * row, S * row, out.data<float>() + i * (S + t) * row);
    std::copy_n(b.data<float>() + i * t * row, t * row,
                out.data<float>() + (i * (S + t) + S) * row);
  }
  return out;
}

}  // namespace

Tensor MultiHeadAttention::call_cached(const Tensor& x, AttentionCache& cache) {
  NoGradGuard no_grad;
  DTRAIN_CHECK(x.defined() && x.dtype() == DType::kFloat32 && x.rank() == 3 && x.dim(1) > 0,
               "MultiHeadAttention '", name(),
               "': call_cached expects float32 [batch, t > 0, features], got ",
               x.defined() ? x.shape().to_string() : std::string("undefined"));
  build_for(x.dim(2), x.dim(2), x.dim(2));
  if (!built()) mark_built();
  DTRAIN_CHECK(cache.length() == 0 || cache.keys.dim(0) == x.dim(0), "MultiHeadAttention '", name(),
               "': the cache holds a batch of ", cache.length() ? cache.keys.dim(0) : 0,
               ", got inputs ", x.shape().to_string());
  const int64_t batch = x.dim(0), t_len = x.dim(1);
  const Tensor q = project(x, *wq_, bq_);
  cache.keys = append_time(cache.keys, project(x, *wk_, bk_));
  cache.values = append_time(cache.values, project(x, *wv_, bv_));
  // New position i is absolute position past + i: it sees the cache and the new ones up to i.
  const int64_t past = cache.length() - t_len;
  const Tensor probs = masked_softmax(multihead_scores(q, cache.keys), Tensor(),
                                      {.scale = 1.0f / std::sqrt(static_cast<float>(key_dim_)),
                                       .causal = true,
                                       .causal_offset = past});
  const Tensor context = multihead_combine(probs, cache.values);
  const Tensor flat = reshape(context, Shape{batch * t_len, num_heads_ * value_dim_});
  const Tensor w = reshape(wo_->value(), Shape{num_heads_ * value_dim_, out_features_});
  const Tensor b = bo_ ? bo_->value() : Tensor();
  return reshape(dense(flat, w, b, ops::Activation::kLinear), Shape{batch, t_len, out_features_});
}

Tensor MultiHeadAttention::operator()(const Tensor& query, const Tensor& value,
                                      const AttentionCallOptions& options) {
  return attend(query, value, options);
}

Tensor MultiHeadAttention::call(const Tensor& x, bool training) {
  return attend(x, x, {.training = training});
}

Tensor MultiHeadAttention::call_with_mask(const Tensor& x, const Tensor& mask, bool training) {
  return attend(x, x, {.query_mask = mask, .value_mask = mask, .training = training});
}

std::vector<Tensor> MultiHeadAttention::call_list(std::span<const Tensor> inputs, bool training) {
  return call_list_masked(inputs, {}, training);
}

std::vector<Tensor> MultiHeadAttention::call_list_masked(std::span<const Tensor> inputs,
                                                         std::span<const Tensor> masks,
                                                         bool training) {
  DTRAIN_CHECK(inputs.size() >= 2 && inputs.size() <= 4, "MultiHeadAttention '", name(),
               "': expects inputs {query, value[, key[, attention_mask]]}, got ", inputs.size());
  auto mask_of = [&](size_t i) { return i < masks.size() ? masks[i] : Tensor(); };
  Tensor scores;
  AttentionCallOptions o{.key = inputs.size() >= 3 ? inputs[2] : Tensor(),
                         .attention_mask = inputs.size() == 4 ? inputs[3] : Tensor(),
                         .use_causal_mask = functional_causal_,
                         .query_mask = mask_of(0),
                         .value_mask = mask_of(1),
                         .key_mask = inputs.size() >= 3 ? mask_of(2) : Tensor(),
                         .training = training,
                         .attention_scores = functional_scores_ ? &scores : nullptr};
  Tensor out = attend(inputs[0], inputs[1], o);
  if (functional_scores_) return {out, scores};
  return {out};
}

std::vector<Tensor> MultiHeadAttention::compute_masks(std::span<const Tensor> /*inputs*/,
                                                      std::span<const Tensor> masks,
                                                      size_t num_outputs) const {
  std::vector<Tensor> out(num_outputs);
  if (num_outputs > 0 && !masks.empty()) out[0] = masks[0];  // Keras: the query's mask
  return out;
}

void MultiHeadAttention::build_list(std::span<const Shape> input_shapes) {
  DTRAIN_CHECK(input_shapes.size() >= 2 && input_shapes.size() <= 4, "MultiHeadAttention '", name(),
               "': expects inputs {query, value[, key[, attention_mask]]}, got ",
               input_shapes.size());
  for (size_t i = 0; i < std::min<size_t>(input_shapes.size(), 3); ++i) {
    DTRAIN_CHECK(input_shapes[i].rank() == 2, "MultiHeadAttention '", name(),
                 "': expected inputs [batch, time, features], got per-example shape ",
                 input_shapes[i].to_string());
  }
  const int64_t value_features = input_shapes[1][1];
  build_for(input_shapes[0][1], value_features,
            input_shapes.size() >= 3 ? input_shapes[2][1] : value_features);
  mark_built();
}

Shape MultiHeadAttention::compute_output_shape(const Shape& input_shape) const {
  Shape out = input_shape;
  if (out.rank() >= 1) out[out.rank() - 1] = output_shape_.value_or(input_shape.dim(-1));
  return out;
}

std::vector<Shape> MultiHeadAttention::compute_output_shapes(
    std::span<const Shape> input_shapes) const {
  DTRAIN_CHECK(input_shapes.size() >= 2, "MultiHeadAttention '", name(),
               "': expects inputs {query, value[, key[, attention_mask]]}");
  std::vector<Shape> out{compute_output_shape(input_shapes[0])};
  if (functional_scores_) {
    out.push_back(Shape{num_heads_, input_shapes[0].dim(0), input_shapes[1].dim(0)});
  }
  return out;
}

std::string MultiHeadAttention::config_json() const {
  json c = detail::base_config(*this);
  c["num_heads"] = num_heads_;
  c["key_dim"] = key_dim_;
  c["value_dim"] = value_dim_;
  c["dropout"] = dropout_rate_;
  c["use_bias"] = use_bias_;
  c["output_shape"] = output_shape_ ? json(*output_shape_) : json(nullptr);
  c["attention_axes"] = nullptr;
  c["kernel_initializer"] = detail::initializer_config(*kernel_init_);
  c["bias_initializer"] = detail::initializer_config(*bias_init_);
  c["kernel_regularizer"] = nullptr;
  c["bias_regularizer"] = nullptr;
  c["activity_regularizer"] = nullptr;
  c["kernel_constraint"] = nullptr;
  c["bias_constraint"] = nullptr;
  c["seed"] = seed_ ? json(*seed_) : json(nullptr);
  if (weights_built_) {
    // Keras 2.12+ writes the build shapes so a loaded layer can create its weights.
    c["query_shape"] = json::array({nullptr, nullptr, query_features_});
    c["value_shape"] = json::array({nullptr, nullptr, value_features_});
    c["key_shape"] = json::array({nullptr, nullptr, key_features_});
  }
  return c.dump();
}

namespace {

std::optional<int64_t> feature_of(const json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_array() || c[key].empty()) return std::nullopt;
  const json& last = c[key].back();
  return last.is_number_integer() ? std::optional<int64_t>(last.get<int64_t>()) : std::nullopt;
}

std::shared_ptr<Layer> mha_from_config(const json& c, const std::string& where) {
  std::optional<int64_t> value_dim, output_shape;
  if (c.contains("value_dim") && c["value_dim"].is_number_integer()) {
    value_dim = c["value_dim"].get<int64_t>();
  }
  if (c.contains("output_shape") && !c["output_shape"].is_null()) {
    const json& o = c["output_shape"];
    if (o.is_number_integer()) {
      output_shape = o.get<int64_t>();
    } else {
      DTRAIN_CHECK(o.is_array() && o.size() == 1 && o[0].is_number_integer(), where,
                   ".output_shape: only a single output dimension is supported, got ", o.dump());
      output_shape = o[0].get<int64_t>();
    }
  }
  DTRAIN_CHECK(!c.contains("attention_axes") || c["attention_axes"].is_null(), where,
               ".attention_axes: only the default (attention over the time axis) is supported");
  std::optional<uint64_t> seed;
  if (c.contains("seed") && c["seed"].is_number_integer()) seed = c["seed"].get<uint64_t>();
  auto layer = std::make_shared<MultiHeadAttention>(
      detail::int_field(c, "num_heads", where), detail::int_field(c, "key_dim", where),
      MultiHeadAttentionOptions{
          .value_dim = value_dim,
          .dropout = static_cast<float>(detail::number_field(c, "dropout", where, 0.0)),
          .use_bias = detail::bool_field(c, "use_bias", where, true),
          .output_shape = output_shape,
          .kernel_initializer = detail::initializer_json(c, "kernel_initializer", "glorot_uniform"),
          .bias_initializer = detail::initializer_json(c, "bias_initializer", "zeros"),
          .seed = seed,
          .name = detail::str_field(c, "name", where)});
  // Keras 2.12+ records the build shapes; build now so the weights exist before loading.
  const auto q = feature_of(c, "query_shape"), v = feature_of(c, "value_shape");
  if (q && v) {
    const auto k = feature_of(c, "key_shape");
    const Shape shapes[3] = {Shape{1, *q}, Shape{1, *v}, Shape{1, k.value_or(*v)}};
    layer->build_list(std::span<const Shape>(shapes, 3));
  }
  return layer;
}

}  // namespace

namespace detail {
void register_attention_layers(LayerRegistry& registry) {
  registry.add("MultiHeadAttention", mha_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
