#include "dtrain/nn/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/initializers.h"
#include "dtrain/nn/layers.h"

namespace dtrain::nn {
namespace {

// The model_config attribute of ../shared/fixtures/keras_h5/mnist_mlp_keras212/mnist_model.h5,
// written by Keras 2.12.
constexpr const char* kKeras212Json =
    R"({"class_name": "Sequential", "config": {"name": "sequential", "layers": [{"class_name": "InputLayer", "config": {"batch_input_shape": [null, 28, 28], "dtype": "float32", "sparse": false, "ragged": false, "name": "flatten_input"}}, {"class_name": "Flatten", "config": {"name": "flatten", "trainable": true, "dtype": "float32", "batch_input_shape": [null, 28, 28], "data_format": "channels_last"}}, {"class_name": "Dense", "config": {"name": "dense", "trainable": true, "dtype": "float32", "units": 128, "activation": "relu", "use_bias": true, "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}}, "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null}}, {"class_name": "Dense", "config": {"name": "dense_1", "trainable": true, "dtype": "float32", "units": 10, "activation": "softmax", "use_bias": true, "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}}, "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null}}]}, "keras_version": "2.12.0", "backend": "tensorflow"})";

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_session(); }
};

TEST_F(ModelTest, SequentialBuildsFromTheFirstLayersInputShape) {
  Sequential model({Dense(128, {.activation = "relu", .input_shape = Shape{784}}), Dense(10)});
  EXPECT_TRUE(model.built());
  EXPECT_EQ(model.count_params(), 101770);
  const auto vars = model.trainable_variables();
  ASSERT_EQ(vars.size(), 4u);
  EXPECT_EQ(vars[0]->name(), "dense/kernel");
  EXPECT_EQ(vars[0]->shape(), (Shape{784, 128}));
  EXPECT_EQ(vars[3]->name(), "dense_1/bias");
  const Tensor y = model(Tensor::zeros(Shape{3, 784}));
  EXPECT_EQ(y.shape(), (Shape{3, 10}));
}

TEST_F(ModelTest, AFrozenSubLayersWeightsAreNotTrainable) {
  nn::Sequential model({nn::Dense(4, {.input_shape = Shape{3}}), nn::Dense(2)});
  model.layers()[0]->set_trainable(false);
  const std::vector<Variable*> trainable = model.trainable_variables();
  const std::vector<Variable*> frozen = model.non_trainable_variables();
  ASSERT_EQ(trainable.size(), 2u);
  EXPECT_EQ(trainable[0]->name(), model.layers()[1]->name() + "/kernel");
  ASSERT_EQ(frozen.size(), 2u);
  EXPECT_EQ(frozen[0]->name(), model.layers()[0]->name() + "/kernel");
  // Freezing the model freezes everything; unfreezing a layer restores it.
  model.set_trainable(false);
  EXPECT_TRUE(model.trainable_variables().empty());
  EXPECT_EQ(model.non_trainable_variables().size(), 4u);
  model.set_trainable(true);
  model.layers()[0]->set_trainable(true);
  EXPECT_EQ(model.trainable_variables().size(), 4u);
}

TEST_F(ModelTest, GlorotUniformKernelsHaveKerasLimitsAndZeroBiases) {
  Dense d(128, {.input_shape = Shape{784}, .name = "d"});
  const float limit = std::sqrt(6.0f / (784 + 128));
  const Tensor& k = d.kernel().tensor();
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < k.num_elements(); ++i) {
    lo = std::min(lo, k.data<float>()[i]);
    hi = std::max(hi, k.data<float>()[i]);
  }
  EXPECT_GE(lo, -limit);
  EXPECT_LE(hi, limit);
  EXPECT_LT(lo, -0.9f * limit);
  EXPECT_GT(hi, 0.9f * limit);
  EXPECT_TRUE(d.bias()->tensor().equals(Tensor::zeros(Shape{128})));
}

TEST_F(ModelTest, SeededInitializersAreReproducible) {
  Dense a(4, {.seed = 7, .input_shape = Shape{3}});
  Dense b(4, {.seed = 7, .input_shape = Shape{3}});
  EXPECT_TRUE(a.kernel().tensor().equals(b.kernel().tensor()));
}

TEST_F(ModelTest, WrongInputShapeNamesTheLayerAndShapes) {
  Sequential model({Dense(8, {.input_shape = Shape{784}})});
  try {
    model(Tensor::zeros(Shape{2, 783}));
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("783"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("784"), std::string::npos) << e.what();
  }
}

TEST_F(ModelTest, SummaryMatchesKerasLayout) {
  Sequential model({Dense(128, {.activation = "relu", .input_shape = Shape{784}}), Dense(10)});
  std::ostringstream os;
  model.summary(os);
  const std::string s = os.str();
  EXPECT_NE(s.find("Model: \"sequential\""), std::string::npos) << s;
  EXPECT_NE(s.find(" dense (Dense)               (None, 128)               100480"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("Total params: 101,770"), std::string::npos) << s;
  EXPECT_NE(s.find("Non-trainable params: 0"), std::string::npos) << s;
}

TEST_F(ModelTest, LoadsKeras212Json) {
  auto model = model_from_json(kKeras212Json);
  EXPECT_EQ(model->name(), "sequential");
  ASSERT_EQ(model->layers().size(), 3u);
  EXPECT_EQ(model->layers()[0]->class_name(), "Flatten");
  EXPECT_EQ(model->layers()[2]->name(), "dense_1");
  EXPECT_EQ(model->count_params(), 784 * 128 + 128 + 128 * 10 + 10);
  const Tensor y = (*model)(Tensor::zeros(Shape{2, 28, 28}));
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
  EXPECT_NEAR(y.data<float>()[0] * 10, 1.0, 1e-5);  // softmax of zeros: uniform
}

TEST_F(ModelTest, JsonRoundTripKeepsArchitecture) {
  Sequential model({Flatten({.input_shape = Shape{28, 28}}), Dense(64, {.activation = "tanh"}),
                    Dropout(0.25f), Dense(10)});
  auto copy = model_from_json(model.to_json());
  EXPECT_EQ(copy->to_json(), model.to_json());
  EXPECT_EQ(copy->count_params(), model.count_params());
}

TEST_F(ModelTest, LoadsKeras224StyleJsonWithoutInputLayer) {
  const char* old = R"({"class_name": "Sequential", "config": {"name": "seq", "layers": [
    {"class_name": "Dense", "config": {"name": "d0", "units": 4, "activation": "relu",
     "use_bias": true, "batch_input_shape": [null, 3]}},
    {"class_name": "Dense", "config": {"name": "d1", "units": 2, "activation": "linear"}}]},
    "keras_version": "2.2.4-tf", "backend": "tensorflow"})";
  auto model = model_from_json(old);
  EXPECT_EQ(model->count_params(), 3 * 4 + 4 + 4 * 2 + 2);
}

TEST_F(ModelTest, InvalidJsonGivesClearErrors) {
  EXPECT_THROW(model_from_json("{not json"), InvalidArgumentError);
  try {
    model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": 3}}, {"class_name": "Conv2D", "config": {}}]}})");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("layers[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Conv2D"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": 3, "activation": "swishy"}}]}})"),
               InvalidArgumentError);
}

// Found by fuzzing model_from_json with Keras 2 and 3 configs whose fields were replaced by
// values of other JSON types and sizes: each escaped as an nlohmann exception, or asked for a
// 4 TiB kernel.
TEST_F(ModelTest, MalformedConfigValuesAreClearErrors) {
  const auto message = [](const char* json) -> std::string {
    try {
      model_from_json(json);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string m = message(R"({"class_name": "Sequential", "config": "x"})");
  EXPECT_NE(m.find("model_from_json"), std::string::npos) << m;
  m = message(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"name": "d", "units": 3,
       "kernel_initializer": {"class_name": {}, "config": {}}}}]}})");
  EXPECT_NE(m.find("layers[0] (Dense)"), std::string::npos) << m;
  m = message(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "Dense", "config": {"units": "many"}}]}})");
  EXPECT_NE(m.find("layers[0] (Dense)"), std::string::npos) << m;
  m = message(R"({"class_name": "Sequential", "config": {"layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8]}},
      {"class_name": "Dense", "config": {"units": 1099511627776}}]}})");
  EXPECT_NE(m.find("more than this machine's memory"), std::string::npos) << m;
  // The public initializer_from_json the same way.
  EXPECT_THROW(initializer_from_json(R"({"class_name": {}})"), InvalidArgumentError);
  EXPECT_THROW(initializer_from_json(R"({"class_name": "Orthogonal", "config": {"gain": "x"}})"),
               InvalidArgumentError);
  EXPECT_NE(initializer_from_json(R"({"class_name": "Orthogonal", "config": {"gain": 2}})"),
            nullptr);
}

class TutorialModel : public Model {
 public:
  TutorialModel() : Model("tutorial_model") {}
  Tensor call(const Tensor& x, bool training) override { return d3_(d2_(d1_(x, training))); }

 private:
  Dense& d1_ = add("dense1", Dense(10, {.activation = "relu"}));
  Dense& d2_ = add("dense2", Dense(10, {.activation = "relu"}));
  Dense& d3_ = add("dense3", Dense(1));
};

TEST_F(ModelTest, SubclassedModelTracksMembersAndTrains) {
  TutorialModel model;
  model.build(Shape{5});
  EXPECT_EQ(model.trainable_variables().size(), 6u);
  EXPECT_EQ(model.layer_attributes()[1], "dense2");
  EXPECT_THROW(model.to_json(), UnimplementedError);
  const Tensor x = Tensor::full(Shape{4, 5}, 0.5);
  std::vector<Variable*> vars = model.trainable_variables();
  GradientTape tape;
  const Tensor loss = reduce_mean(square(model(x, true)));
  const auto grads = tape.gradient(loss, vars);
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << vars[i]->name();
    EXPECT_EQ(grads[i].shape(), vars[i]->shape());
  }
}

TEST_F(ModelTest, DropoutIsIdentityAtInferenceAndScalesInTraining) {
  Dropout drop(0.5f, {.seed = 1});
  const Tensor x = Tensor::ones(Shape{1000});
  EXPECT_TRUE(drop(x.reshape(Shape{10, 100}), false).equals(x.reshape(Shape{10, 100})));
  const Tensor y = drop(x.reshape(Shape{10, 100}), true);
  int zeros = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    const float v = y.data<float>()[i];
    ASSERT_TRUE(v == 0.0f || v == 2.0f);
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(zeros, 500, 60);
}

// Each call draws from its own part of the stream; each replica of a strategy (as the strategy
// marks its threads) from its own stream, the same whatever order the replicas call in.
TEST_F(ModelTest, DropoutMasksDependOnCallIndexAndReplicaOnly) {
  const Tensor x = Tensor::ones(Shape{4, 64});
  auto mask = [&](Dropout& d, ReplicaStream stream) {
    set_current_replica_stream(stream);
    Tensor y = d(x, true);
    set_current_replica_stream({});
    return y;
  };
  Dropout a(0.5f, {.seed = 3}), b(0.5f, {.seed = 3});
  // Replica 1 first on one layer, replica 0 first on the other: the same masks per replica.
  const Tensor a1 = mask(a, {1, 1}), a0 = mask(a, {0, 0});
  const Tensor b0 = mask(b, {0, 0}), b1 = mask(b, {1, 1});
  EXPECT_TRUE(a0.equals(b0));
  EXPECT_TRUE(a1.equals(b1));
  EXPECT_FALSE(a0.equals(a1));  // replicas do not share masks
  // Global replica 2 on another worker (local index 0 there) differs from replica 0.
  Dropout c(0.5f, {.seed = 3});
  EXPECT_FALSE(mask(c, {2, 0}).equals(a0));
  // The next call differs from the first; restoring the state repeats it.
  const RngState after_one = a.rng_state();
  EXPECT_EQ(after_one.counter, 1u);
  const Tensor second = mask(a, {0, 0});
  EXPECT_FALSE(second.equals(a0));
  a.set_rng_state(after_one);
  EXPECT_TRUE(mask(a, {0, 0}).equals(second));
  EXPECT_TRUE(mask(a, {1, 1}).equals(mask(b, {1, 1})));  // every replica's count was restored
  // Outside strategies: the layer's own stream, the same for the same seed and call.
  Dropout d(0.5f, {.seed = 3}), e(0.5f, {.seed = 3});
  EXPECT_TRUE(d(x, true).equals(e(x, true)));
}

TEST_F(ModelTest, DefaultNamesFollowKeras) {
  Dense a(1), b(1);
  EXPECT_EQ(a.name(), "dense");
  EXPECT_EQ(b.name(), "dense_1");
  clear_session();
  EXPECT_EQ(Dense(1).name(), "dense");
}

}  // namespace
}  // namespace dtrain::nn

namespace dtrain::nn {
namespace {

TEST(ModelJson, SeededInitializersSurviveTheRoundTrip) {
  clear_session();
  Sequential model({Dense(4, {.seed = 7, .input_shape = Shape{3}}), Dense(2, {.seed = 9})});
  const std::string json = model.to_json();
  EXPECT_NE(json.find("\"seed\":7"), std::string::npos) << json;
  auto copy = model_from_json(json);
  EXPECT_EQ(copy->to_json(), json);
  // Same seeds, same initial weights.
  const auto a = model.weights(), b = copy->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i]->tensor().equals(b[i]->tensor()));
}

TEST(ModelJson, LayerAfterInputLayerWithoutShapeIsBuilt) {
  auto model = model_from_json(R"({"class_name": "Sequential", "config": {"layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 5]}},
    {"class_name": "Dense", "config": {"units": 3}},
    {"class_name": "Dense", "config": {"units": 2}}]}})");
  ASSERT_TRUE(model->layers()[0]->built());
  EXPECT_EQ(model->count_params(), 5 * 3 + 3 + 3 * 2 + 2);
}

}  // namespace
}  // namespace dtrain::nn
