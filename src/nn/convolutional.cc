// Conv1D, Conv2D, DepthwiseConv2D, Conv2DTranspose and their Keras configs.
#include "dtrain/nn/convolutional.h"

#include "config.h"
#include "dtrain/autograd/array_ops.h"
#include "dtrain/autograd/convolution.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/reshaping.h"
#include "layer_registry.h"

namespace dtrain::nn {

using detail::int_list;
using detail::parse_channels_first;
using detail::per_axis;
using nlohmann::json;

namespace {

const char* kind_class(BaseConv::Kind kind, int rank) {
  switch (kind) {
    case BaseConv::Kind::kConv:
      return rank == 1 ? "Conv1D" : "Conv2D";
    case BaseConv::Kind::kDepthwise:
      return "DepthwiseConv2D";
    case BaseConv::Kind::kTranspose:
      return "Conv2DTranspose";
  }
  return "Conv2D";
}

}  // namespace

BaseConv::BaseConv(Kind kind, int rank, int64_t filters, std::vector<int64_t> kernel_size,
                   const ConvOptions& options, const char* default_name)
    : Layer(detail::name_or_default(options.name, default_name)),
      class_name_(kind_class(kind, rank)),
      kind_(kind),
      rank_(rank),
      filters_(filters),
      depth_multiplier_(options.depth_multiplier),
      activation_(ops::activation_from_name(options.activation)),
      use_bias_(options.use_bias),
      kernel_init_(detail::make_initializer(options.kernel_initializer, options.seed)),
      bias_init_(detail::make_initializer(options.bias_initializer, std::nullopt)),
      attrs_(std::make_shared<ops::Conv2DAttrs>()) {
  const std::string w = str_cat(kind_class(kind, rank), " '", name(), "'");
  DTRAIN_CHECK(kind == Kind::kDepthwise || filters > 0, w, ": filters must be positive, got ",
               filters);
  DTRAIN_CHECK(kind != Kind::kDepthwise || depth_multiplier_ > 0, w,
               ": depth_multiplier must be positive, got ", depth_multiplier_);
  kernel_size_ = per_axis(kernel_size, rank, "kernel_size", w);
  strides_ = per_axis(options.strides, rank, "strides", w);
  dilation_ = per_axis(options.dilation_rate, rank, "dilation_rate", w);
  bool strided = false, dilated = false;
  for (int i = 0; i < rank; ++i) {
    DTRAIN_CHECK(kernel_size_[i] > 0 && strides_[i] > 0 && dilation_[i] > 0, w,
                 ": kernel_size, strides and dilation_rate must be positive");
    strided |= strides_[i] > 1;
    dilated |= dilation_[i] > 1;
  }
  DTRAIN_CHECK(!(strided && dilated), w,
               ": strides > 1 together with dilation_rate > 1 is not supported (as in Keras)");
  channels_first_ = parse_channels_first(options.data_format, w);
  attrs_->padding = ops::padding_from_name(options.padding, w);
  DTRAIN_CHECK(attrs_->padding != ops::Padding::kCausal || (kind == Kind::kConv && rank == 1), w,
               ": padding='causal' is only supported by Conv1D");
  DTRAIN_CHECK(options.groups >= 1, w, ": groups must be positive, got ", options.groups);
  DTRAIN_CHECK(kind == Kind::kConv || options.groups == 1, w, ": groups must be 1");
  DTRAIN_CHECK(kind == Kind::kDepthwise || filters % options.groups == 0, w,
               ": groups=", options.groups, " does not divide filters=", filters);
  attrs_->groups = options.groups;
  const int off = 2 - rank;  // a 1-D convolution is a 2-D one over height 1
  for (int i = 0; i < rank; ++i) {
    attrs_->strides[i + off] = strides_[i];
    attrs_->dilation[i + off] = dilation_[i];
  }
  if (!options.output_padding.empty()) {
    DTRAIN_CHECK(kind == Kind::kTranspose, w, ": output_padding applies to Conv2DTranspose only");
    output_padding_ = per_axis(options.output_padding, rank, "output_padding", w);
    for (int i = 0; i < rank; ++i) {
      DTRAIN_CHECK(output_padding_[i] >= 0 && output_padding_[i] < strides_[i], w,
                   ": output_padding ", output_padding_[i],
                   " must be at least 0 and less than "
                   "the stride ",
                   strides_[i], " along spatial axis ", i);
    }
    full_attrs_ = std::make_shared<ops::Conv2DAttrs>(*attrs_);
    full_attrs_->padding = ops::Padding::kValid;
  }
  if (options.input_shape) {
    set_input_shape(*options.input_shape);
    build(*options.input_shape);
  }
}

namespace {

// Keras's deconv_output_length with output_padding (dilated kernel k_d).
int64_t padded_transpose_size(int64_t in, int64_t k, int64_t stride, int64_t dilation,
                              ops::Padding p, int64_t output_padding) {
  const int64_t kd = (k - 1) * dilation + 1;
  const int64_t pad = p == ops::Padding::kSame ? kd / 2 : 0;
  return (in - 1) * stride + kd - 2 * pad + output_padding;
}

}  // namespace

std::string BaseConv::where() const { return str_cat(class_name(), " '", name(), "'"); }

int64_t BaseConv::channels_of(const Shape& s) const {
  DTRAIN_CHECK(s.rank() == rank_ + 1, where(), ": expected inputs of rank ", rank_ + 2, " [batch, ",
               rank_ == 1 ? "steps" : "height, width", ", channels]",
               channels_first_ ? " (channels_first: channels after the batch)" : "",
               ", got [batch, ", s.to_string().substr(1));
  return channels_first_ ? s[0] : s[rank_];
}

void BaseConv::build_impl(const Shape& input_shape) {
  const int64_t c = channels_of(input_shape);
  DTRAIN_CHECK(c > 0, where(), ": the channel dimension must be known and positive, got ",
               input_shape.to_string());
  (void)compute_output_shape(input_shape);  // checks the kernel fits
  Shape kshape;
  switch (kind_) {
    case Kind::kConv:
      DTRAIN_CHECK(c % attrs_->groups == 0, where(), ": groups=", attrs_->groups,
                   " does not divide the ", c, " input channels");
      kshape = rank_ == 1 ? Shape{kernel_size_[0], c / attrs_->groups, filters_}
                          : Shape{kernel_size_[0], kernel_size_[1], c / attrs_->groups, filters_};
      break;
    case Kind::kDepthwise:
      kshape = Shape{kernel_size_[0], kernel_size_[1], c, depth_multiplier_};
      filters_ = c * depth_multiplier_;
      attrs_->groups = c;
      break;
    case Kind::kTranspose:
      kshape = Shape{kernel_size_[0], kernel_size_[1], filters_, c};
      break;
  }
  kernel_ =
      &add_weight(kind_ == Kind::kDepthwise ? "depthwise_kernel" : "kernel", kshape, *kernel_init_);
  if (use_bias_) bias_ = &add_weight("bias", Shape{filters_}, *bias_init_);
}

Shape BaseConv::compute_output_shape(const Shape& input_shape) const {
  const int64_t c = channels_of(input_shape);
  std::vector<int64_t> out(static_cast<size_t>(rank_ + 1));
  const int first = channels_first_ ? 1 : 0;
  for (int i = 0; i < rank_; ++i) {
    const int64_t in = input_shape[first + i];
    int64_t o;
    if (kind_ == Kind::kTranspose && !output_padding_.empty()) {
      o = padded_transpose_size(in, kernel_size_[i], strides_[i], dilation_[i], attrs_->padding,
                                output_padding_[i]);
    } else if (kind_ == Kind::kTranspose) {
      o = ops::conv_transpose_output_size(in, kernel_size_[i], strides_[i], dilation_[i],
                                          attrs_->padding);
    } else {
      o = ops::conv_output_size(in, kernel_size_[i], strides_[i], dilation_[i], attrs_->padding);
      if (attrs_->padding == ops::Padding::kCausal) o = (in + strides_[i] - 1) / strides_[i];
    }
    DTRAIN_CHECK(o > 0, where(), ": kernel_size ", kernel_size_[i], " (dilation ", dilation_[i],
                 ") is larger than the input's ", in, " along spatial axis ", i,
                 " under padding='valid' (input shape ", input_shape.to_string(), ")");
    out[static_cast<size_t>(first + i)] = o;
  }
  const int64_t oc = kind_ == Kind::kDepthwise ? c * depth_multiplier_ : filters_;
  out[channels_first_ ? 0 : static_cast<size_t>(rank_)] = oc;
  return Shape(out);
}

Tensor BaseConv::call(const Tensor& in, bool) {
  DTRAIN_CHECK(in.rank() == rank_ + 2, where(), ": expected inputs of rank ", rank_ + 2, ", got ",
               in.shape().to_string());
  const Tensor x = channels_first_ ? to_channels_last(in) : in;
  const int64_t expected = kind_ == Kind::kTranspose   ? kernel_->shape()[3]
                           : kind_ == Kind::kDepthwise ? kernel_->shape()[2]
                                                       : kernel_->shape()[rank_] * attrs_->groups;
  DTRAIN_CHECK(x.dim(-1) == expected, where(), ": input has ", x.dim(-1),
               " channels, the layer was built for ", expected);
  const Tensor k = kernel_->value();
  const Tensor b = bias_ ? bias_->value() : Tensor();
  Tensor y;
  switch (kind_) {
    case Kind::kConv:
      y = rank_ == 1 ? conv1d(x, k, b, attrs_, activation_) : conv2d(x, k, b, attrs_, activation_);
      break;
    case Kind::kDepthwise:
      y = depthwise_conv2d(x, k, b, attrs_, activation_);
      break;
    case Kind::kTranspose:
      if (output_padding_.empty()) {
        y = conv2d_transpose(x, k, b, attrs_, activation_);
        break;
      }
      // The full (valid) transposed convolution, cut to tf.nn.conv2d_transpose's window for
      // the output size: `same` drops max(full − size, 0) / 2 leading rows, and rows past the
      // full output (output_padding) receive nothing but the bias.
      y = conv2d_transpose(x, k, Tensor(), full_attrs_);
      for (int i = 0; i < 2; ++i) {
        const int64_t size =
            padded_transpose_size(x.dim(1 + i), kernel_size_[i], strides_[i], dilation_[i],
                                  attrs_->padding, output_padding_[i]);
        const int64_t full = y.dim(1 + i);
        const int64_t begin =
            attrs_->padding == ops::Padding::kSame ? std::max<int64_t>(full - size, 0) / 2 : 0;
        const int64_t kept = std::min(size, full - begin);
        if (begin != 0 || kept != full) y = slice_axis(y, 1 + i, begin, kept);
        if (kept < size) {
          Shape before{0, 0, 0, 0}, after{0, 0, 0, 0};
          after[1 + i] = size - kept;
          y = pad(y, before, after);
        }
      }
      if (b.defined()) y = add(y, b);
      y = dtrain::activation(y, activation_);
      break;
  }
  return channels_first_ ? to_channels_first(y) : y;
}

std::string BaseConv::config_json() const {
  json c = detail::base_config(*this);
  detail::add_batch_input_shape(*this, c);
  if (kind_ != Kind::kDepthwise) c["filters"] = filters_;
  c["kernel_size"] = int_list(kernel_size_);
  c["strides"] = int_list(strides_);
  c["padding"] = ops::padding_name(attrs_->padding);
  c["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  c["dilation_rate"] = int_list(dilation_);
  c["groups"] = kind_ == Kind::kDepthwise ? 1 : attrs_->groups;
  c["activation"] = ops::activation_name(activation_);
  c["use_bias"] = use_bias_;
  c["bias_initializer"] = detail::initializer_config(*bias_init_);
  c["bias_regularizer"] = nullptr;
  c["activity_regularizer"] = nullptr;
  c["bias_constraint"] = nullptr;
  if (kind_ == Kind::kDepthwise) {
    c["depth_multiplier"] = depth_multiplier_;
    c["depthwise_initializer"] = detail::initializer_config(*kernel_init_);
    c["depthwise_regularizer"] = nullptr;
    c["depthwise_constraint"] = nullptr;
  } else {
    c["kernel_initializer"] = detail::initializer_config(*kernel_init_);
    c["kernel_regularizer"] = nullptr;
    c["kernel_constraint"] = nullptr;
  }
  if (kind_ == Kind::kTranspose) {
    c["output_padding"] = output_padding_.empty() ? json() : int_list(output_padding_);
  }
  return c.dump();
}

Conv1D::Conv1D(int64_t filters, std::vector<int64_t> kernel_size, ConvOptions options)
    : BaseConv(Kind::kConv, 1, filters, std::move(kernel_size), options, "conv1d") {}

Conv2D::Conv2D(int64_t filters, std::vector<int64_t> kernel_size, ConvOptions options)
    : BaseConv(Kind::kConv, 2, filters, std::move(kernel_size), options, "conv2d") {}

DepthwiseConv2D::DepthwiseConv2D(std::vector<int64_t> kernel_size, ConvOptions options)
    : BaseConv(Kind::kDepthwise, 2, 0, std::move(kernel_size), options, "depthwise_conv2d") {}

Conv2DTranspose::Conv2DTranspose(int64_t filters, std::vector<int64_t> kernel_size,
                                 ConvOptions options)
    : BaseConv(Kind::kTranspose, 2, filters, std::move(kernel_size), options, "conv2d_transpose") {}

// ---------------------------------------------------------------------------------------------
// Rebuilding from Keras configs (either dialect).

namespace {

// Regularizers and constraints are accepted when null; anything else is refused by name.
void refuse_unsupported(const json& c, const std::string& where,
                        std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (c.contains(key) && !c[key].is_null()) {
      throw UnimplementedError(str_cat(where, ": ", key, " ", c[key].dump(),
                                       " is not supported (dtrain supports null only)"));
    }
  }
}

ConvOptions conv_options(const json& c, int rank, const std::string& where,
                         const char* kernel_init_key) {
  refuse_unsupported(
      c, where,
      {"kernel_regularizer", "bias_regularizer", "activity_regularizer", "kernel_constraint",
       "bias_constraint", "depthwise_regularizer", "depthwise_constraint"});
  const std::vector<int64_t> ones(static_cast<size_t>(rank), 1);
  std::vector<int64_t> output_padding;
  if (c.contains("output_padding") && !c["output_padding"].is_null()) {
    output_padding = detail::int_tuple_field(c, "output_padding", static_cast<size_t>(rank), where);
  }
  return ConvOptions{
      .strides = detail::int_tuple_field(c, "strides", static_cast<size_t>(rank), where, ones),
      .padding = detail::str_field(c, "padding", where, "valid"),
      .data_format = detail::str_field(c, "data_format", where, "channels_last"),
      .dilation_rate =
          detail::int_tuple_field(c, "dilation_rate", static_cast<size_t>(rank), where, ones),
      .groups = detail::int_field(c, "groups", where, 1),
      .depth_multiplier = detail::int_field(c, "depth_multiplier", where, 1),
      .output_padding = output_padding,
      .activation = detail::str_field(c, "activation", where, "linear"),
      .use_bias = detail::bool_field(c, "use_bias", where, true),
      .kernel_initializer = detail::initializer_json(c, kernel_init_key, "glorot_uniform"),
      .bias_initializer = detail::initializer_json(c, "bias_initializer", "zeros"),
      .input_shape = detail::declared_input_shape(c, where),
      .name = detail::str_field(c, "name", where)};
}

std::shared_ptr<Layer> conv1d_from_config(const json& c, const std::string& where) {
  return std::make_shared<Conv1D>(detail::int_field(c, "filters", where),
                                  detail::int_tuple_field(c, "kernel_size", 1, where),
                                  conv_options(c, 1, where, "kernel_initializer"));
}

std::shared_ptr<Layer> conv2d_from_config(const json& c, const std::string& where) {
  return std::make_shared<Conv2D>(detail::int_field(c, "filters", where),
                                  detail::int_tuple_field(c, "kernel_size", 2, where),
                                  conv_options(c, 2, where, "kernel_initializer"));
}

std::shared_ptr<Layer> depthwise_from_config(const json& c, const std::string& where) {
  return std::make_shared<DepthwiseConv2D>(detail::int_tuple_field(c, "kernel_size", 2, where),
                                           conv_options(c, 2, where, "depthwise_initializer"));
}

std::shared_ptr<Layer> transpose_from_config(const json& c, const std::string& where) {
  return std::make_shared<Conv2DTranspose>(detail::int_field(c, "filters", where),
                                           detail::int_tuple_field(c, "kernel_size", 2, where),
                                           conv_options(c, 2, where, "kernel_initializer"));
}

}  // namespace

namespace detail {
void register_convolutional_layers(LayerRegistry& registry) {
  registry.add("Conv1D", conv1d_from_config);
  registry.add("Conv2D", conv2d_from_config);
  registry.add("DepthwiseConv2D", depthwise_from_config);
  registry.add("Conv2DTranspose", transpose_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
