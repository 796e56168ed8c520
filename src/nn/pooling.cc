// The pooling layers and their Keras configs.
#include "dtrain/nn/pooling.h"

#include "config.h"
#include "dtrain/autograd/convolution.h"
#include "dtrain/autograd/functions.h"
#include "layer_registry.h"
#include "masking.h"

namespace dtrain::nn {

using detail::int_list;
using detail::parse_channels_first;
using detail::per_axis;
using nlohmann::json;

BasePool::BasePool(ops::PoolKind kind, int rank, const PoolOptions& options,
                   const char* default_name, const char* class_name)
    : Layer(detail::name_or_default(options.name, default_name)),
      kind_(kind),
      rank_(rank),
      attrs_(std::make_shared<ops::Pool2DAttrs>()),
      class_name_(class_name) {
  const std::string w = str_cat(class_name, " '", name(), "'");
  pool_ = per_axis(options.pool_size, rank, "pool_size", w);
  strides_ = options.strides.empty() ? pool_ : per_axis(options.strides, rank, "strides", w);
  for (int i = 0; i < rank; ++i) {
    DTRAIN_CHECK(pool_[i] > 0 && strides_[i] > 0, w, ": pool_size and strides must be positive");
  }
  channels_first_ = parse_channels_first(options.data_format, w);
  attrs_->padding = ops::padding_from_name(options.padding, w);
  DTRAIN_CHECK(attrs_->padding != ops::Padding::kCausal, w,
               ": padding must be 'valid' or 'same', got 'causal'");
  const int off = 2 - rank;
  attrs_->pool[0] = attrs_->strides[0] = 1;
  for (int i = 0; i < rank; ++i) {
    attrs_->pool[i + off] = pool_[i];
    attrs_->strides[i + off] = strides_[i];
  }
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void BasePool::check_rank(const Shape& s) const {
  DTRAIN_CHECK(s.rank() == rank_ + 1, class_name_, " '", name(), "': expected inputs of rank ",
               rank_ + 2, " [batch, ", rank_ == 1 ? "steps" : "height, width",
               ", channels], got [batch, ", s.to_string().substr(1));
}

void BasePool::build_impl(const Shape& input_shape) { (void)compute_output_shape(input_shape); }

Shape BasePool::compute_output_shape(const Shape& input_shape) const {
  check_rank(input_shape);
  Shape out = input_shape;
  const int first = channels_first_ ? 1 : 0;
  for (int i = 0; i < rank_; ++i) {
    const int64_t in = input_shape[first + i];
    const int64_t o = ops::conv_output_size(in, pool_[i], strides_[i], 1, attrs_->padding);
    DTRAIN_CHECK(o > 0, class_name_, " '", name(), "': pool_size ", pool_[i],
                 " is larger than the input's ", in, " along spatial axis ", i,
                 " under padding='valid' (input shape ", input_shape.to_string(), ")");
    out[first + i] = o;
  }
  return out;
}

Tensor BasePool::call(const Tensor& in, bool) {
  DTRAIN_CHECK(in.rank() == rank_ + 2, class_name_, " '", name(), "': expected inputs of rank ",
               rank_ + 2, ", got ", in.shape().to_string());
  Tensor x = channels_first_ ? to_channels_last(in) : in;
  if (rank_ == 1) x = reshape(x, Shape{x.dim(0), 1, x.dim(1), x.dim(2)});
  Tensor y = kind_ == ops::PoolKind::kMax ? max_pool2d(x, attrs_) : avg_pool2d(x, attrs_);
  if (rank_ == 1) y = reshape(y, Shape{y.dim(0), y.dim(2), y.dim(3)});
  return channels_first_ ? to_channels_first(y) : y;
}

std::string BasePool::config_json() const {
  json c = detail::base_config(*this);
  detail::add_batch_input_shape(*this, c);
  c["pool_size"] = int_list(pool_);
  c["padding"] = ops::padding_name(attrs_->padding);
  c["strides"] = int_list(strides_);
  c["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  return c.dump();
}

MaxPooling1D::MaxPooling1D(PoolOptions o)
    : BasePool(ops::PoolKind::kMax, 1, o, "max_pooling1d", "MaxPooling1D") {}
MaxPooling2D::MaxPooling2D(PoolOptions o)
    : BasePool(ops::PoolKind::kMax, 2, o, "max_pooling2d", "MaxPooling2D") {}
AveragePooling1D::AveragePooling1D(PoolOptions o)
    : BasePool(ops::PoolKind::kAverage, 1, o, "average_pooling1d", "AveragePooling1D") {}
AveragePooling2D::AveragePooling2D(PoolOptions o)
    : BasePool(ops::PoolKind::kAverage, 2, o, "average_pooling2d", "AveragePooling2D") {}

// ---------------------------------------------------------------------------------------------

BaseGlobalPool::BaseGlobalPool(ops::PoolKind kind, int rank, const GlobalPoolOptions& options,
                               const char* default_name, const char* class_name)
    : Layer(detail::name_or_default(options.name, default_name)),
      class_name_(class_name),
      kind_(kind),
      rank_(rank),
      channels_first_(
          parse_channels_first(options.data_format, str_cat(class_name, " '", name(), "'"))),
      keepdims_(options.keepdims) {
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

void BaseGlobalPool::build_impl(const Shape& input_shape) {
  (void)compute_output_shape(input_shape);
}

Shape BaseGlobalPool::compute_output_shape(const Shape& s) const {
  DTRAIN_CHECK(s.rank() == rank_ + 1, class_name(), " '", name(), "': expected inputs of rank ",
               rank_ + 2, " [batch, ", rank_ == 1 ? "steps" : "height, width",
               ", channels], got [batch, ", s.to_string().substr(1));
  const int64_t c = channels_first_ ? s[0] : s[rank_];
  if (!keepdims_) return Shape{c};
  Shape out = s;
  for (int i = 0; i < rank_; ++i) out[(channels_first_ ? 1 : 0) + i] = 1;
  return out;
}

Tensor BaseGlobalPool::call(const Tensor& in, bool) {
  DTRAIN_CHECK(in.rank() == rank_ + 2, class_name(), " '", name(), "': expected inputs of rank ",
               rank_ + 2, ", got ", in.shape().to_string());
  const Tensor x = channels_first_ ? to_channels_last(in) : in;
  Tensor y = kind_ == ops::PoolKind::kMax ? global_max_pool(x) : global_avg_pool(x);
  if (!keepdims_) return y;
  return reshape(y, compute_output_shape(in.shape().without_first()).with_first(in.dim(0)));
}

Tensor BaseGlobalPool::call_with_mask(const Tensor& in, const Tensor& mask, bool training) {
  if (kind_ != ops::PoolKind::kAverage || rank_ != 1) return call(in, training);
  DTRAIN_CHECK(in.rank() == 3, class_name(), " '", name(), "': expected inputs of rank 3, got ",
               in.shape().to_string());
  const Tensor x = channels_first_ ? to_channels_last(in) : in;  // [B, T, C]
  const int64_t B = x.dim(0), T = x.dim(1);
  const Tensor m = detail::sequence_mask(mask, B, T, *this);
  // sum_t x·m / max(sum_t m, 1): the mask is a constant, so only the product is differentiated.
  Tensor inv_count(Shape{B, 1});
  for (int64_t b = 0; b < B; ++b) {
    float n = 0.0f;
    for (int64_t t = 0; t < T; ++t) n += m.data<float>()[b * T + t];
    inv_count.data<float>()[b] = 1.0f / std::max(n, 1.0f);
  }
  const Tensor sum = reduce_sum(multiply(x, reshape(m, Shape{B, T, 1})), 1);  // [B, C]
  Tensor y = multiply(sum, inv_count);
  if (!keepdims_) return y;
  return reshape(y, compute_output_shape(in.shape().without_first()).with_first(in.dim(0)));
}

std::string BaseGlobalPool::config_json() const {
  json c = detail::base_config(*this);
  detail::add_batch_input_shape(*this, c);
  c["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  c["keepdims"] = keepdims_;
  return c.dump();
}

GlobalAveragePooling1D::GlobalAveragePooling1D(GlobalPoolOptions o)
    : BaseGlobalPool(ops::PoolKind::kAverage, 1, o, "global_average_pooling1d",
                     "GlobalAveragePooling1D") {}
GlobalAveragePooling2D::GlobalAveragePooling2D(GlobalPoolOptions o)
    : BaseGlobalPool(ops::PoolKind::kAverage, 2, o, "global_average_pooling2d",
                     "GlobalAveragePooling2D") {}
GlobalMaxPooling2D::GlobalMaxPooling2D(GlobalPoolOptions o)
    : BaseGlobalPool(ops::PoolKind::kMax, 2, o, "global_max_pooling2d", "GlobalMaxPooling2D") {}

// ---------------------------------------------------------------------------------------------

namespace {

PoolOptions pool_options(const json& c, int rank, const std::string& where) {
  const auto pool = detail::int_tuple_field(c, "pool_size", static_cast<size_t>(rank), where,
                                            std::vector<int64_t>(static_cast<size_t>(rank), 2));
  return PoolOptions{
      .pool_size = pool,
      .strides = detail::int_tuple_field(c, "strides", static_cast<size_t>(rank), where, pool),
      .padding = detail::str_field(c, "padding", where, "valid"),
      .data_format = detail::str_field(c, "data_format", where, "channels_last"),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)};
}

GlobalPoolOptions global_options(const json& c, const std::string& where) {
  return GlobalPoolOptions{
      .data_format = detail::str_field(c, "data_format", where, "channels_last"),
      .keepdims = detail::bool_field(c, "keepdims", where, false),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)};
}

template <class L>
std::shared_ptr<Layer> pool_factory(const json& c, const std::string& where) {
  return std::make_shared<L>(pool_options(
      c, std::is_same_v<L, MaxPooling1D> || std::is_same_v<L, AveragePooling1D> ? 1 : 2, where));
}

template <class L>
std::shared_ptr<Layer> global_factory(const json& c, const std::string& where) {
  return std::make_shared<L>(global_options(c, where));
}

}  // namespace

namespace detail {
void register_pooling_layers(LayerRegistry& registry) {
  registry.add("MaxPooling1D", pool_factory<MaxPooling1D>);
  registry.add("MaxPooling2D", pool_factory<MaxPooling2D>);
  registry.add("AveragePooling1D", pool_factory<AveragePooling1D>);
  registry.add("AveragePooling2D", pool_factory<AveragePooling2D>);
  // Keras's aliases.
  registry.add("MaxPool1D", pool_factory<MaxPooling1D>);
  registry.add("MaxPool2D", pool_factory<MaxPooling2D>);
  registry.add("AvgPool1D", pool_factory<AveragePooling1D>);
  registry.add("AvgPool2D", pool_factory<AveragePooling2D>);
  registry.add("GlobalAveragePooling1D", global_factory<GlobalAveragePooling1D>);
  registry.add("GlobalAveragePooling2D", global_factory<GlobalAveragePooling2D>);
  registry.add("GlobalMaxPooling2D", global_factory<GlobalMaxPooling2D>);
  registry.add("GlobalAvgPool2D", global_factory<GlobalAveragePooling2D>);
  registry.add("GlobalMaxPool2D", global_factory<GlobalMaxPooling2D>);
}
}  // namespace detail

}  // namespace dtrain::nn
