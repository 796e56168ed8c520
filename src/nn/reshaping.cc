// Reshape, Permute, ZeroPadding2D, UpSampling2D, Rescaling, SpatialDropout2D.
#include "dtrain/nn/reshaping.h"

#include <algorithm>

#include "config.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/autograd/reshaping.h"
#include "layer_registry.h"

namespace dtrain::nn {

using detail::add_batch_input_shape;
using detail::batch_shape_string;
using detail::name_or_default;
using nlohmann::json;

namespace {

// The rows and cols axes of a per-example image shape (without the batch).
std::pair<int, int> spatial_axes(DataFormat f) {
  return f == DataFormat::kChannelsLast ? std::pair{0, 1} : std::pair{1, 2};
}

void check_image(const Layer& layer, const Shape& input_shape) {
  DTRAIN_CHECK(input_shape.rank() == 3, layer.class_name(), " '", layer.name(),
               "': expected images of rank 4 (batch, rows, cols, channels), got inputs of shape ",
               batch_shape_string(input_shape));
}

}  // namespace

DataFormat data_format_from_name(const std::string& name, const std::string& where) {
  if (name.empty() || name == "channels_last") return DataFormat::kChannelsLast;
  if (name == "channels_first") return DataFormat::kChannelsFirst;
  throw InvalidArgumentError(where + ": unknown data_format '" + name +
                             "' (expected channels_last or channels_first)");
}

const char* data_format_name(DataFormat f) {
  return f == DataFormat::kChannelsLast ? "channels_last" : "channels_first";
}

// ---------------------------------------------------------------------------------------------

Reshape::Reshape(std::vector<int64_t> target_shape, ReshapeOptions options)
    : Layer(name_or_default(options.name, "reshape")), target_(std::move(target_shape)) {
  int unknown = 0;
  for (int64_t d : target_) {
    DTRAIN_CHECK(d > 0 || d == -1, "Reshape '", name(),
                 "': target_shape entries must be "
                 "positive or -1, got ",
                 json(target_).dump());
    unknown += d == -1;
  }
  DTRAIN_CHECK(unknown <= 1, "Reshape '", name(), "': at most one -1 in target_shape, got ",
               json(target_).dump());
  DTRAIN_CHECK(target_.size() < static_cast<size_t>(Shape::kMaxRank), "Reshape '", name(),
               "': target_shape of rank ", target_.size(), " is too large");
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

Shape Reshape::compute_output_shape(const Shape& input_shape) const {
  const int64_t total = input_shape.num_elements();
  int64_t known = 1;
  for (int64_t d : target_) known *= d == -1 ? 1 : d;
  Shape out;
  for (int64_t d : target_) {
    if (d == -1) {
      DTRAIN_CHECK(known > 0 && total % known == 0, "Reshape '", name(),
                   "': cannot reshape inputs of shape ", batch_shape_string(input_shape),
                   " to target_shape ", json(target_).dump());
      out.push_back(total / known);
    } else {
      out.push_back(d);
    }
  }
  DTRAIN_CHECK(out.num_elements() == total, "Reshape '", name(), "': inputs of shape ",
               batch_shape_string(input_shape), " (", total,
               " values per example) cannot be reshaped to target_shape ", json(target_).dump(),
               " (", out.num_elements(), " values)");
  return out;
}

Tensor Reshape::call(const Tensor& x, bool) {
  return reshape(x, compute_output_shape(x.shape().without_first()).with_first(x.dim(0)));
}

std::string Reshape::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["target_shape"] = target_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Permute::Permute(std::vector<int> dims, PermuteOptions options)
    : Layer(name_or_default(options.name, "permute")), dims_(std::move(dims)) {
  std::vector<int> sorted = dims_;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    DTRAIN_CHECK(sorted[i] == static_cast<int>(i) + 1, "Permute '", name(),
                 "': dims must be a permutation of 1..", dims_.size(), " (1-based), got ",
                 json(dims_).dump());
  }
  perm_.push_back(0);
  for (int d : dims_) perm_.push_back(d);
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

Shape Permute::compute_output_shape(const Shape& input_shape) const {
  DTRAIN_CHECK(input_shape.rank() == static_cast<int>(dims_.size()), "Permute '", name(),
               "': dims ", json(dims_).dump(), " do not match inputs of shape ",
               batch_shape_string(input_shape));
  Shape out;
  for (int d : dims_) out.push_back(input_shape[d - 1]);
  return out;
}

Tensor Permute::call(const Tensor& x, bool) {
  compute_output_shape(x.shape().without_first());  // checks the rank
  return transpose(x, perm_);
}

std::string Permute::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["dims"] = dims_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

ZeroPadding2D::ZeroPadding2D(ZeroPadding2DOptions options)
    : Layer(name_or_default(options.name, "zero_padding2d")), options_(options) {
  for (const auto& p : options_.padding) {
    DTRAIN_CHECK(p[0] >= 0 && p[1] >= 0, "ZeroPadding2D '", name(),
                 "': padding must be non-negative");
  }
  if (options_.input_shape) {
    set_input_shape(*options_.input_shape);
    build(*options_.input_shape);
  }
}

void ZeroPadding2D::build_impl(const Shape& input_shape) { check_image(*this, input_shape); }

Shape ZeroPadding2D::compute_output_shape(const Shape& input_shape) const {
  check_image(*this, input_shape);
  Shape out = input_shape;
  const auto [r, c] = spatial_axes(options_.data_format);
  out[r] += options_.padding[0][0] + options_.padding[0][1];
  out[c] += options_.padding[1][0] + options_.padding[1][1];
  return out;
}

Tensor ZeroPadding2D::call(const Tensor& x, bool) {
  Shape before{0, 0, 0, 0}, after{0, 0, 0, 0};
  const auto [r, c] = spatial_axes(options_.data_format);
  before[r + 1] = options_.padding[0][0];
  after[r + 1] = options_.padding[0][1];
  before[c + 1] = options_.padding[1][0];
  after[c + 1] = options_.padding[1][1];
  return pad(x, before, after);
}

std::string ZeroPadding2D::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["padding"] = json::array({json::array({options_.padding[0][0], options_.padding[0][1]}),
                              json::array({options_.padding[1][0], options_.padding[1][1]})});
  c["data_format"] = data_format_name(options_.data_format);
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

UpSampling2D::UpSampling2D(UpSampling2DOptions options)
    : Layer(name_or_default(options.name, "up_sampling2d")), options_(std::move(options)) {
  DTRAIN_CHECK(options_.size[0] >= 1 && options_.size[1] >= 1, "UpSampling2D '", name(),
               "': size must be positive, got (", options_.size[0], ", ", options_.size[1], ")");
  DTRAIN_CHECK(options_.interpolation == "nearest", "UpSampling2D '", name(), "': interpolation '",
               options_.interpolation, "' is not supported (only \"nearest\")");
  if (options_.input_shape) {
    set_input_shape(*options_.input_shape);
    build(*options_.input_shape);
  }
}

void UpSampling2D::build_impl(const Shape& input_shape) { check_image(*this, input_shape); }

Shape UpSampling2D::compute_output_shape(const Shape& input_shape) const {
  check_image(*this, input_shape);
  Shape out = input_shape;
  const auto [r, c] = spatial_axes(options_.data_format);
  out[r] *= options_.size[0];
  out[c] *= options_.size[1];
  return out;
}

Tensor UpSampling2D::call(const Tensor& x, bool) {
  const auto [r, c] = spatial_axes(options_.data_format);
  Tensor y = options_.size[0] == 1 ? x : repeat_elements(x, r + 1, options_.size[0]);
  return options_.size[1] == 1 ? y : repeat_elements(y, c + 1, options_.size[1]);
}

std::string UpSampling2D::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["size"] = json::array({options_.size[0], options_.size[1]});
  c["data_format"] = data_format_name(options_.data_format);
  c["interpolation"] = options_.interpolation;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Rescaling::Rescaling(float scale_value, RescalingOptions options)
    : Layer(name_or_default(options.name, "rescaling")),
      scale_(scale_value),
      offset_(options.offset) {
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

Tensor Rescaling::call(const Tensor& x, bool) { return scale(x, scale_, offset_); }

std::string Rescaling::config_json() const {
  json c = detail::base_config(*this);
  add_batch_input_shape(*this, c);
  c["scale"] = scale_;
  c["offset"] = offset_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

SpatialDropout2D::SpatialDropout2D(float rate, SpatialDropout2DOptions options)
    : Dropout(rate, DropoutOptions{.seed = options.seed,
                                   .name = name_or_default(options.name, "spatial_dropout2d")}),
      data_format_(options.data_format) {}

void SpatialDropout2D::build_impl(const Shape& input_shape) { check_image(*this, input_shape); }

Tensor SpatialDropout2D::call(const Tensor& x, bool training) {
  if (!training || rate() == 0.0f) return x;
  const int64_t channels = data_format_ == DataFormat::kChannelsLast ? x.dim(3) : x.dim(1);
  const Shape mask_shape = data_format_ == DataFormat::kChannelsLast
                               ? Shape{x.dim(0), 1, 1, channels}
                               : Shape{x.dim(0), channels, 1, 1};
  Tensor ones(mask_shape);
  std::fill_n(ones.data<float>(), ones.num_elements(), 1.0f);
  // Dropout's draw on a [batch, channels] tensor of ones is the mask (keep_scale or 0).
  Tensor mask;
  {
    NoGradGuard no_grad;
    mask = Dropout::call(ones, true);
  }
  return multiply(x, mask);
}

std::string SpatialDropout2D::config_json() const {
  json c = json::parse(Dropout::config_json());
  c["data_format"] = data_format_name(data_format_);
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

namespace {

std::vector<int64_t> int_list(const json& c, const char* key, const std::string& where) {
  DTRAIN_CHECK(c.contains(key) && c[key].is_array(), where, ".", key, ": expected a list");
  std::vector<int64_t> out;
  for (const json& v : c[key]) {
    DTRAIN_CHECK(v.is_number_integer(), where, ".", key, ": expected integers, got ", v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

DataFormat format_field(const json& c, const std::string& where) {
  return data_format_from_name(detail::str_field(c, "data_format", where, "channels_last"), where);
}

std::shared_ptr<Layer> reshape_from_config(const json& c, const std::string& where) {
  return std::make_shared<Reshape>(
      int_list(c, "target_shape", where),
      ReshapeOptions{.input_shape = detail::declared_input_shape(c, where),
                     .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> permute_from_config(const json& c, const std::string& where) {
  std::vector<int> dims;
  for (int64_t d : int_list(c, "dims", where)) dims.push_back(static_cast<int>(d));
  return std::make_shared<Permute>(
      dims, PermuteOptions{.input_shape = detail::declared_input_shape(c, where),
                           .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> zero_padding_from_config(const json& c, const std::string& where) {
  ZeroPadding2DOptions o{.data_format = format_field(c, where),
                         .input_shape = detail::declared_input_shape(c, where),
                         .name = detail::str_field(c, "name", where)};
  // padding: an int, (rows, cols), or ((top, bottom), (left, right)).
  const json p = c.contains("padding") ? c["padding"] : json(1);
  auto bad = [&] {
    return InvalidArgumentError(
        where + ".padding: expected an integer, 2 integers or 2 pairs, got " + p.dump());
  };
  if (p.is_number_integer()) {
    const int64_t v = p.get<int64_t>();
    o.padding = {{{v, v}, {v, v}}};
  } else if (p.is_array() && p.size() == 2) {
    for (size_t i = 0; i < 2; ++i) {
      if (p[i].is_number_integer()) {
        o.padding[i] = {p[i].get<int64_t>(), p[i].get<int64_t>()};
      } else if (p[i].is_array() && p[i].size() == 2 && p[i][0].is_number_integer() &&
                 p[i][1].is_number_integer()) {
        o.padding[i] = {p[i][0].get<int64_t>(), p[i][1].get<int64_t>()};
      } else {
        throw bad();
      }
    }
  } else {
    throw bad();
  }
  return std::make_shared<ZeroPadding2D>(o);
}

std::shared_ptr<Layer> up_sampling_from_config(const json& c, const std::string& where) {
  const std::vector<int64_t> size = detail::int_tuple_field(c, "size", 2, where, {{2, 2}});
  return std::make_shared<UpSampling2D>(
      UpSampling2DOptions{.size = {size[0], size[1]},
                          .data_format = format_field(c, where),
                          .interpolation = detail::str_field(c, "interpolation", where, "nearest"),
                          .input_shape = detail::declared_input_shape(c, where),
                          .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> rescaling_from_config(const json& c, const std::string& where) {
  return std::make_shared<Rescaling>(
      static_cast<float>(detail::number_field(c, "scale", where)),
      RescalingOptions{.offset = static_cast<float>(detail::number_field(c, "offset", where, 0.0)),
                       .input_shape = detail::declared_input_shape(c, where),
                       .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> spatial_dropout_from_config(const json& c, const std::string& where) {
  std::optional<uint64_t> seed;
  if (c.contains("seed") && c["seed"].is_number_integer()) seed = c["seed"].get<uint64_t>();
  return std::make_shared<SpatialDropout2D>(
      static_cast<float>(detail::number_field(c, "rate", where)),
      SpatialDropout2DOptions{.data_format = format_field(c, where),
                              .seed = seed,
                              .name = detail::str_field(c, "name", where)});
}

}  // namespace

namespace detail {
void register_reshaping_layers(LayerRegistry& registry) {
  registry.add("Reshape", reshape_from_config);
  registry.add("Permute", permute_from_config);
  registry.add("ZeroPadding2D", zero_padding_from_config);
  registry.add("UpSampling2D", up_sampling_from_config);
  registry.add("Rescaling", rescaling_from_config);
  registry.add("SpatialDropout2D", spatial_dropout_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
