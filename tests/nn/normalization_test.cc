// The activation, normalization and reshaping layers as Keras layers: config round trips
// through model_from_json, Keras's weight names and order, shapes, and errors that name the
// layer.
#include "dtrain/nn/normalization.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtrain/autograd/functions.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/reshaping.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;
using testutil::expect_throws_with;
using testutil::random_tensor;

std::unique_ptr<Sequential> every_layer() {
  clear_session();
  return std::make_unique<Sequential>(std::initializer_list<LayerRef>{
      Rescaling(1.0f / 255, {.offset = -0.5f, .input_shape = Shape{8, 8, 3}}),
      ZeroPadding2D({.padding = {{{1, 2}, {0, 1}}}}),
      BatchNormalization({.momentum = 0.9f, .epsilon = 1e-2f}), ReLU({.max_value = 6.0f}),
      UpSampling2D({.size = {2, 1}}), SpatialDropout2D(0.2f, {.seed = 3}), Permute({3, 1, 2}),
      Reshape({-1, 6}), LayerNormalization({.center = false}), LeakyReLU({.negative_slope = 0.1f}),
      ELU({.alpha = 0.5f}), Softmax(), Activation("gelu"),
      Dense(4, {.activation = "swish", .seed = 1}), BatchNormalization({.axis = 1, .scale = false}),
      Activation("hard_sigmoid")});
}

TEST(NormalizationLayers, ConfigsRoundTripThroughModelFromJson) {
  auto m = every_layer();
  EXPECT_EQ(m->compute_output_shape(Shape{8, 8, 3}), (Shape{99, 4}));
  const std::string text = m->to_json();
  const json j = json::parse(text);
  const json& layers = j["config"]["layers"];
  auto config_of = [&](const std::string& cls) {
    for (const json& l : layers) {
      if (l["class_name"] == cls) return l["config"];
    }
    return json();
  };
  EXPECT_EQ(config_of("BatchNormalization")["axis"], json::array({3}));
  EXPECT_EQ(config_of("BatchNormalization")["momentum"].get<float>(), 0.9f);
  EXPECT_EQ(config_of("BatchNormalization")["moving_variance_initializer"]["class_name"], "Ones");
  EXPECT_EQ(config_of("LayerNormalization")["axis"], json::array({2}));
  EXPECT_EQ(config_of("ZeroPadding2D")["padding"], json::parse("[[1, 2], [0, 1]]"));
  EXPECT_EQ(config_of("UpSampling2D")["size"], json::parse("[2, 1]"));
  EXPECT_EQ(config_of("Permute")["dims"], json::parse("[3, 1, 2]"));
  EXPECT_EQ(config_of("Reshape")["target_shape"], json::parse("[-1, 6]"));
  EXPECT_EQ(config_of("ReLU")["max_value"].get<float>(), 6.0f);
  EXPECT_EQ(config_of("LeakyReLU")["alpha"].get<float>(), 0.1f);
  EXPECT_EQ(config_of("SpatialDropout2D")["seed"], 3);
  EXPECT_EQ(config_of("Dense")["activation"], "swish");

  clear_session();
  const std::unique_ptr<Model> back = model_from_json(text);
  EXPECT_EQ(back->to_json(), text);
  // Same weights → same inference outputs.
  const std::vector<Variable*> a = m->weights(), b = back->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name(), b[i]->name());
    b[i]->assign(a[i]->tensor());
  }
  const Tensor x = random_tensor(Shape{2, 8, 8, 3}, 7, 0.0f, 255.0f);
  EXPECT_TRUE((*m)(x).equals((*back)(x)));
}

TEST(NormalizationLayers, KerasWeightNamesAndOrder) {
  auto m = every_layer();
  std::vector<std::string> names;
  for (Variable* v : m->layers()[2]->weights()) names.push_back(v->name());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "batch_normalization/gamma", "batch_normalization/beta",
                       "batch_normalization/moving_mean", "batch_normalization/moving_variance"}));
  EXPECT_EQ(m->layers()[2]->trainable_weights().size(), 2u);
  EXPECT_EQ(m->layers()[2]->non_trainable_weights().size(), 2u);
  names.clear();
  for (Variable* v : m->layers()[14]->weights()) names.push_back(v->name());
  EXPECT_EQ(names, (std::vector<std::string>{"batch_normalization_1/beta",
                                             "batch_normalization_1/moving_mean",
                                             "batch_normalization_1/moving_variance"}));
  ASSERT_EQ(m->layers()[8]->weights().size(), 1u);
  EXPECT_EQ(m->layers()[8]->weights()[0]->name(), "layer_normalization/gamma");
  EXPECT_EQ(m->layers()[8]->weights()[0]->shape(), (Shape{6}));
}

TEST(NormalizationLayers, ReshapingLayersMoveValuesAsKeras) {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, Shape{1, 2, 3, 1});
  // Permute((2, 1, 3)): [1, 3, 2, 1], x[0, j, i, 0] = x[0, i, j, 0].
  const Tensor p = Permute({2, 1, 3})(x);
  EXPECT_EQ(p.shape(), (Shape{1, 3, 2, 1}));
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  const Tensor z = ZeroPadding2D({.padding = {{{1, 0}, {0, 1}}}})(x);
  EXPECT_EQ(z.shape(), (Shape{1, 3, 4, 1}));
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 1, 2, 3, 0, 4, 5, 6, 0}));
  const Tensor u = UpSampling2D({.size = {1, 2}})(x);
  EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6}));
  const Tensor uf = UpSampling2D({.size = {2, 1}, .data_format = DataFormat::kChannelsFirst})(
      Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, Shape{1, 1, 2, 2}));
  EXPECT_EQ(uf.to_vector<float>(), (std::vector<float>{1, 2, 1, 2, 3, 4, 3, 4}));
  EXPECT_EQ(Reshape({3, -1})(x).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(Rescaling(2.0f, {.offset = 1.0f})(x).to_vector<float>(),
            (std::vector<float>{3, 5, 7, 9, 11, 13}));
}

TEST(NormalizationLayers, SpatialDropoutDropsWholeChannels) {
  SpatialDropout2D drop(0.5f, {.seed = 11});
  Tensor x(Shape{4, 3, 3, 8});
  std::fill_n(x.data<float>(), x.num_elements(), 1.0f);
  const Tensor y = drop(x, /*training=*/true);
  int dropped = 0;
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t c = 0; c < 8; ++c) {
      const float first = y.data<float>()[b * 72 + c];
      EXPECT_TRUE(first == 0.0f || first == 2.0f);
      dropped += first == 0.0f;
      for (int64_t s = 0; s < 9; ++s) EXPECT_EQ(y.data<float>()[b * 72 + s * 8 + c], first);
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 32);
  EXPECT_TRUE(drop(x, /*training=*/false).equals(x));
  // The same seed draws the same masks.
  SpatialDropout2D again(0.5f, {.seed = 11});
  EXPECT_TRUE(again(x, true).equals(y));
}

TEST(NormalizationLayers, ReLUVariantsMatchKerasFormula) {
  const Tensor x = Tensor::from_vector(std::vector<float>{-2, -0.5f, 0.25f, 1, 3, 8}, Shape{1, 6});
  EXPECT_EQ(
      ReLU({.max_value = 2.0f, .negative_slope = 0.5f, .threshold = 0.5f})(x).to_vector<float>(),
      (std::vector<float>{-1.25f, -0.5f, -0.125f, 1, 2, 2}));
  EXPECT_EQ(LeakyReLU()(x).to_vector<float>()[0], -2 * 0.3f);
  EXPECT_NEAR(ELU()(x).to_vector<float>()[0], std::expm1(-2.0f), 1e-7);
}

TEST(NormalizationLayers, BadInputsNameTheLayer) {
  clear_session();
  BatchNormalization bn({.input_shape = Shape{4}});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        bn(Tensor(Shape{2, 5}));
      },
      {"batch_normalization"});
  expect_throws_with<InvalidArgumentError>(
      [] { BatchNormalization({.axis = 3, .input_shape = Shape{4}}); },
      {"BatchNormalization 'batch_normalization_1'", "axis 3 is out of range", "(None, 4)"});
  expect_throws_with<InvalidArgumentError>(
      [] { BatchNormalization({.axis = 0, .input_shape = Shape{4}}); }, {"batch axis"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        LayerNormalization({.axis = {1}, .input_shape = Shape{3, 4}});
      },
      {"LayerNormalization", "only trailing axes"});
  expect_throws_with<InvalidArgumentError>(
      [] { ZeroPadding2D({.input_shape = Shape{4}}); },
      {"ZeroPadding2D 'zero_padding2d'", "expected images of rank 4", "(None, 4)"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        Reshape({3, 3}, {.input_shape = Shape{4}});
      },
      {"Reshape 'reshape'", "cannot be reshaped", "[3,3]"});
  expect_throws_with<InvalidArgumentError>([] { Reshape({-1, -1}); }, {"at most one -1"});
  expect_throws_with<InvalidArgumentError>([] { Permute({1, 3}); }, {"Permute", "permutation"});
  expect_throws_with<InvalidArgumentError>([] { Dense(3, {.activation = "gleu"}); },
                                           {"unknown activation 'gleu'", "gelu"});
  const std::string bad_format = R"({"class_name": "Sequential", "config": {"name": "s",
      "layers": [{"class_name": "UpSampling2D", "config": {"name": "up",
      "batch_input_shape": [null, 4, 4, 1], "size": [2, 2], "data_format": "channels_middle"}}]}})";
  expect_throws_with<InvalidArgumentError>([&] { model_from_json(bad_format); },
                                           {"layers[0]", "channels_middle"});
}

TEST(NormalizationLayers, LayersPassFiniteDifferenceChecks) {
  using Inputs = std::vector<Tensor>;
  const Tensor img = random_tensor(Shape{2, 3, 2, 3}, 81);
  Permute perm({3, 1, 2});
  ZeroPadding2D zp({.padding = {{{1, 0}, {2, 1}}}});
  ZeroPadding2D zpf({.padding = {{{0, 1}, {1, 1}}}, .data_format = DataFormat::kChannelsFirst});
  UpSampling2D up({.size = {2, 3}});
  UpSampling2D upf({.size = {3, 2}, .data_format = DataFormat::kChannelsFirst});
  Reshape rs({-1});
  for (Layer* l : std::initializer_list<Layer*>{&perm, &zp, &zpf, &up, &upf, &rs}) {
    SCOPED_TRACE(l->class_name());
    EXPECT_LT(testutil::gradcheck([l](const Inputs& v) { return (*l)(v[0]); }, {img}), 2e-2);
  }
}

}  // namespace
}  // namespace dtrain::nn
