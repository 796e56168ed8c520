// The convolution and pooling layers: Keras weight names and layouts, output shapes, configs
// round-tripping through model_from_json (both dialects), channels_first, and bad input.
#include "dtrain/nn/convolutional.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "dtrain/autograd/convolution.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/pooling.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;
using testutil::expect_throws_with;
using testutil::random_tensor;

class ConvLayerTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_session(); }
};

TEST_F(ConvLayerTest, WeightsHaveKerasNamesAndLayouts) {
  Conv2D conv(8, {3, 2}, {.groups = 2, .input_shape = Shape{10, 9, 4}});
  EXPECT_EQ(conv.name(), "conv2d");
  EXPECT_EQ(conv.kernel().name(), "conv2d/kernel");
  EXPECT_EQ(conv.kernel().shape(), (Shape{3, 2, 2, 8}));  // HWIO, in / groups
  EXPECT_EQ(conv.bias()->name(), "conv2d/bias");
  EXPECT_EQ(conv.compute_output_shape(Shape{10, 9, 4}), (Shape{8, 8, 8}));

  Conv1D c1(5, {3}, {.padding = "causal", .input_shape = Shape{7, 2}});
  EXPECT_EQ(c1.kernel().shape(), (Shape{3, 2, 5}));
  EXPECT_EQ(c1.compute_output_shape(Shape{7, 2}), (Shape{7, 5}));

  DepthwiseConv2D dw({3},
                     {.padding = "same", .depth_multiplier = 2, .input_shape = Shape{5, 5, 3}});
  EXPECT_EQ(dw.kernel().name(), "depthwise_conv2d/depthwise_kernel");
  EXPECT_EQ(dw.kernel().shape(), (Shape{3, 3, 3, 2}));
  EXPECT_EQ(dw.bias()->shape(), (Shape{6}));
  EXPECT_EQ(dw.compute_output_shape(Shape{5, 5, 3}), (Shape{5, 5, 6}));

  Conv2DTranspose tr(4, {3}, {.strides = {2}, .input_shape = Shape{5, 6, 3}});
  EXPECT_EQ(tr.kernel().shape(), (Shape{3, 3, 4, 3}));  // [kh, kw, filters, in]
  EXPECT_EQ(tr.compute_output_shape(Shape{5, 6, 3}), (Shape{11, 13, 4}));
  Conv2DTranspose trs(4, {3}, {.strides = {2}, .padding = "same", .input_shape = Shape{5, 6, 3}});
  EXPECT_EQ(trs.compute_output_shape(Shape{5, 6, 3}), (Shape{10, 12, 4}));

  // glorot_uniform with Keras's fans for a rank-4 kernel: fan_in = kh·kw·in, fan_out = kh·kw·out.
  const float limit = std::sqrt(6.0f / (3 * 2 * 2 + 3 * 2 * 8));
  const Tensor& k = conv.kernel().tensor();
  for (int64_t i = 0; i < k.num_elements(); ++i) ASSERT_LE(std::fabs(k.data<float>()[i]), limit);
}

TEST_F(ConvLayerTest, OutputsMatchTheOps) {
  Conv2D conv(
      3, {3},
      {.strides = {2, 1}, .padding = "same", .activation = "relu", .input_shape = Shape{6, 5, 2}});
  const Tensor x = random_tensor(Shape{2, 6, 5, 2}, 1);
  const Tensor y = conv(x);
  const Tensor want = ops::conv2d(x, conv.kernel().tensor(), conv.bias()->tensor(),
                                  {.strides = {2, 1}, .padding = ops::Padding::kSame});
  ASSERT_EQ(y.shape(), want.shape());
  for (int64_t i = 0; i < y.num_elements(); ++i) {
    EXPECT_EQ(y.data<float>()[i], std::max(0.0f, want.data<float>()[i]));
  }
  MaxPooling2D pool({.pool_size = {2}});
  EXPECT_EQ(pool(y).shape(), (Shape{2, 1, 2, 3}));
  GlobalAveragePooling2D gap({.keepdims = true});
  EXPECT_EQ(gap(y).shape(), (Shape{2, 1, 1, 3}));
  MaxPooling1D p1({.pool_size = {3}, .strides = {1}, .padding = "same"});
  EXPECT_EQ(p1(random_tensor(Shape{2, 7, 4}, 2)).shape(), (Shape{2, 7, 4}));
  GlobalAveragePooling1D gap1;
  EXPECT_EQ(gap1(random_tensor(Shape{2, 7, 4}, 2)).shape(), (Shape{2, 4}));
}

TEST_F(ConvLayerTest, ChannelsFirstEqualsTransposedChannelsLast) {
  Conv2D last(4, {3}, {.padding = "same", .seed = 3, .input_shape = Shape{6, 5, 2}});
  Conv2D first(4, {3},
               {.padding = "same",
                .data_format = "channels_first",
                .seed = 3,
                .input_shape = Shape{2, 6, 5}});
  ASSERT_TRUE(last.kernel().tensor().equals(first.kernel().tensor()));
  const Tensor x = random_tensor(Shape{2, 6, 5, 2}, 4);
  const Tensor y_last = last(x);
  const Tensor y_first = first(ops::to_channels_first(x));
  EXPECT_EQ(first.compute_output_shape(Shape{2, 6, 5}), (Shape{4, 6, 5}));
  EXPECT_TRUE(ops::to_channels_last(y_first).equals(y_last));
  AveragePooling2D pool({.padding = "same", .data_format = "channels_first"});
  EXPECT_EQ(pool(y_first).shape(), (Shape{2, 4, 3, 3}));
  // Differentiable through the transposes, weights included.
  Conv2D grad_layer(2, {2}, {.data_format = "channels_first", .input_shape = Shape{3, 4, 4}});
  const double err =
      testutil::gradcheck([&](const std::vector<Tensor>& v) { return grad_layer(v[0]); },
                          {random_tensor(Shape{2, 3, 4, 4}, 5)});
  EXPECT_LT(err, 2e-2);
}

TEST_F(ConvLayerTest, SequentialCnnRoundTripsThroughModelFromJson) {
  Sequential model({Conv2D(4, {3}, {.activation = "relu", .input_shape = Shape{12, 12, 1}}),
                    MaxPooling2D(),
                    Conv2D(6, {3}, {.strides = {1, 2}, .padding = "same", .dilation_rate = {1}}),
                    DepthwiseConv2D({3}, {.padding = "same", .depth_multiplier = 2}),
                    Conv2DTranspose(3, {2}, {.strides = {2}}),
                    AveragePooling2D({.pool_size = {3}, .strides = {2}, .padding = "same"}),
                    GlobalMaxPooling2D(), Dense(5)});
  const std::string j = model.to_json();
  const json cfg = json::parse(j);
  const json& conv = cfg["config"]["layers"][1]["config"];  // [0] is the InputLayer
  for (const char* key :
       {"name", "trainable", "dtype", "filters", "kernel_size", "strides", "padding", "data_format",
        "dilation_rate", "groups", "activation", "use_bias", "kernel_initializer",
        "bias_initializer", "kernel_regularizer", "bias_regularizer", "activity_regularizer",
        "kernel_constraint", "bias_constraint"}) {
    EXPECT_TRUE(conv.contains(key)) << key;
  }
  EXPECT_EQ(conv["kernel_size"], json::parse("[3, 3]"));
  const std::unique_ptr<Model> back = model_from_json(j);
  EXPECT_EQ(back->to_json(), j);
  const auto a = model.weights(), b = back->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name(), b[i]->name());
    b[i]->assign(a[i]->tensor());
  }
  const Tensor x = random_tensor(Shape{2, 12, 12, 1}, 9);
  EXPECT_TRUE(model(x).equals((*back)(x)));
}

TEST_F(ConvLayerTest, ReadsKeras3Configs) {
  // As Keras 3.x writes a Conv2D and a MaxPooling2D (module, registered_name, DTypePolicy).
  const std::string j = R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 8, 8, 3], "dtype": "float32",
     "sparse": false, "name": "input_layer"}},
    {"module": "keras.layers", "class_name": "Conv2D", "config": {"name": "conv2d",
     "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
     "config": {"name": "float32"}, "registered_name": null}, "filters": 4,
     "kernel_size": [3, 3], "strides": [1, 1], "padding": "valid", "data_format": "channels_last",
     "dilation_rate": [1, 1], "groups": 1, "activation": "relu", "use_bias": true,
     "kernel_initializer": {"module": "keras.initializers", "class_name": "GlorotUniform",
     "config": {"seed": null}, "registered_name": null}, "bias_initializer": {"module":
     "keras.initializers", "class_name": "Zeros", "config": {}, "registered_name": null},
     "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null,
     "kernel_constraint": null, "bias_constraint": null}, "registered_name": null},
    {"module": "keras.layers", "class_name": "MaxPooling2D", "config": {"name": "max_pooling2d",
     "trainable": true, "dtype": "float32", "pool_size": [2, 2], "padding": "valid",
     "strides": [2, 2], "data_format": "channels_last"}, "registered_name": null}]}})";
  const std::unique_ptr<Model> m = model_from_json(j);
  EXPECT_EQ(m->compute_output_shape(Shape{8, 8, 3}), (Shape{3, 3, 4}));
}

// Conv2DTranspose(output_padding): Keras's output size, and the values of
// tf.nn.conv2d_transpose with that output shape (conv2d's input gradient for it), plus the bias.
TEST_F(ConvLayerTest, TransposeOutputPaddingMatchesConv2dTransposeWithAnOutputShape) {
  struct Case {
    const char* padding;
    std::vector<int64_t> strides, output_padding, dilation;
    Shape out;  // per example, for a [5, 4, 2] input
  };
  const std::vector<Case> cases = {
      {"valid", {2, 3}, {1, 2}, {1}, Shape{12, 14, 3}},  // (in-1)s + k + p
      {"same", {2, 2}, {1, 0}, {1}, Shape{10, 7, 3}},    // (in-1)s + 1 + p for k = 3
      {"same", {2, 3}, {0, 2}, {1}, Shape{9, 12, 3}},
      {"valid", {1, 1}, {0, 0}, {2}, Shape{9, 8, 3}},  // dilated kernel 5, no extra rows
  };
  for (const Case& c : cases) {
    Conv2DTranspose t(3, {3, 3},
                      {.strides = c.strides,
                       .padding = c.padding,
                       .dilation_rate = c.dilation,
                       .output_padding = c.output_padding,
                       .activation = "tanh",
                       .bias_initializer = "ones",
                       .input_shape = Shape{5, 4, 2}});
    EXPECT_EQ(t.compute_output_shape(Shape{5, 4, 2}), c.out) << c.padding;
    const Tensor x = random_tensor(Shape{2, 5, 4, 2}, 3);
    const Tensor y = t(x);
    ASSERT_EQ(y.shape(), c.out.with_first(2)) << c.padding;
    ops::Conv2DAttrs a;
    a.strides[0] = c.strides[0];
    a.strides[1] = c.strides[1];
    a.dilation[0] = a.dilation[1] = c.dilation[0];
    a.padding = std::string(c.padding) == "same" ? ops::Padding::kSame : ops::Padding::kValid;
    const Tensor want = ops::conv2d_backward_input(x, t.kernel().tensor(), y.shape(), a);
    for (int64_t i = 0; i < y.num_elements(); ++i) {
      ASSERT_NEAR(y.data<float>()[i], std::tanh(want.data<float>()[i] + 1.0f), 1e-5)
          << c.padding << " element " << i;
    }
    // Gradients through the crop and the padding.
    const double err = testutil::gradcheck(
        [&](const std::vector<Tensor>& xs) { return t(xs[0], true); }, {x}, 1e-2f);
    EXPECT_LT(err, 1e-2) << c.padding;
    // The config carries output_padding and rebuilds the layer.
    const json cfg = json::parse(t.config_json());
    EXPECT_EQ(cfg["output_padding"], json(c.output_padding));
  }
  const std::string j = R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
    {"class_name": "Conv2DTranspose", "config": {"name": "up", "filters": 2, "kernel_size": 3,
     "strides": 2, "padding": "same", "output_padding": 1,
     "batch_input_shape": [null, 4, 4, 1]}}]}})";
  auto m = model_from_json(j);
  EXPECT_EQ(m->compute_output_shape(Shape{4, 4, 1}), (Shape{8, 8, 2}));
  expect_throws_with<InvalidArgumentError>(
      [] { Conv2DTranspose(2, {3}, {.strides = {2}, .output_padding = {2}, .name = "op"}); },
      {"Conv2DTranspose 'op'", "output_padding 2", "less than the stride 2"});
  expect_throws_with<InvalidArgumentError>(
      [] { Conv2D(2, {3}, {.output_padding = {1}, .name = "c"}); },
      {"Conv2D 'c'", "Conv2DTranspose only"});
}

TEST_F(ConvLayerTest, BadInputNamesTheLayer) {
  expect_throws_with<InvalidArgumentError>(
      [] {
        Conv2D(4, {3}, {.input_shape = Shape{8, 8}});
      },
      {"Conv2D 'conv2d'", "rank 4"});
  Conv2D built(4, {3}, {.input_shape = Shape{8, 8, 3}, .name = "c"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        built(Tensor::zeros(Shape{1, 8, 8, 2}));
      },
      {"Conv2D 'c'"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        Conv2D(4, {5}, {.input_shape = Shape{4, 4, 1}, .name = "big"});
      },
      {"Conv2D 'big'", "larger than the input"});
  expect_throws_with<InvalidArgumentError>([] { Conv2D(4, {3}, {.padding = "full", .name = "p"}); },
                                           {"Conv2D 'p'", "unknown padding 'full'"});
  expect_throws_with<InvalidArgumentError>(
      [] { Conv2D(4, {3}, {.data_format = "NHWC", .name = "f"}); },
      {"Conv2D 'f'", "unknown data_format 'NHWC'"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        Conv2D(4, {3}, {.groups = 2, .input_shape = Shape{8, 8, 3}, .name = "g"});
      },
      {"Conv2D 'g'", "groups=2 does not divide the 3 input channels"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        MaxPooling2D({.pool_size = {3}, .input_shape = Shape{2, 2, 1}, .name = "mp"});
      },
      {"MaxPooling2D 'mp'", "larger than"});
  expect_throws_with<InvalidArgumentError>(
      [] { MaxPooling2D({.padding = "causal", .name = "mp2"}); }, {"MaxPooling2D 'mp2'"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        GlobalAveragePooling2D({.input_shape = Shape{4, 3}, .name = "gap"});
      },
      {"GlobalAveragePooling2D 'gap'", "rank 4"});
  const std::string l2 = R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
    {"class_name": "Conv2D", "config": {"name": "reg", "filters": 2, "kernel_size": 3,
     "batch_input_shape": [null, 5, 5, 1], "kernel_regularizer": {"class_name": "L2",
     "config": {"l2": 0.01}}}}]}})";
  expect_throws_with<UnimplementedError>([&] { model_from_json(l2); },
                                         {"Conv2D", "kernel_regularizer"});
}

}  // namespace
}  // namespace dtrain::nn
