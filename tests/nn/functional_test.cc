#include "dtrain/nn/functional.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "dtrain/autograd/array_ops.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/merging.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;
using testutil::expect_throws_with;
using testutil::random_tensor;

class FunctionalTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_session(); }
};

// x → dense → dense_1, and add = dense + dense_1 (a residual connection) → dense_2.
struct Residual {
  KerasTensor x = Input(Shape{8});
  std::shared_ptr<Dense> d0 = shared(Dense(4, {.activation = "relu"}));
  std::shared_ptr<Dense> d1 = shared(Dense(4));
  std::shared_ptr<Dense> d2 = shared(Dense(2));
  KerasTensor h = (*d0)(x);
  KerasTensor y = (*d1)(h);
  KerasTensor s = call(Add(), {h, y});
  KerasTensor out = (*d2)(s);
};

void expect_near(const Tensor& a, const Tensor& b, float tol = 1e-5f) {
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], tol) << "element " << i;
  }
}

std::vector<std::string> layer_names(const Model& m) {
  std::vector<std::string> out;
  for (const auto& l : m.layers()) out.push_back(l->name());
  return out;
}

TEST_F(FunctionalTest, ResidualGraphRunsInOrderAndMatchesTheLayersByHand) {
  Residual r;
  EXPECT_EQ(r.x.layer().name(), "input_1");
  EXPECT_EQ(r.s.shape(), (Shape{4}));
  Functional model({r.x}, {r.out}, {.name = "resnet"});
  EXPECT_EQ(model.class_name(), "Functional");
  EXPECT_TRUE(model.built());
  // Keras's order: by depth from the inputs.
  EXPECT_EQ(layer_names(model),
            (std::vector<std::string>{"input_1", "dense", "dense_1", "add", "dense_2"}));
  EXPECT_EQ(model.count_params(), 36 + 20 + 10);
  const Tensor x = random_tensor(Shape{5, 8}, 7);
  const Tensor h = (*r.d0)(x);
  const Tensor want = (*r.d2)(add(h, (*r.d1)(h)));
  expect_near(model(x), want);
}

TEST_F(FunctionalTest, GradientsFlowThroughBothBranches) {
  Residual r;
  Functional model({r.x}, {r.out});
  const Tensor x = random_tensor(Shape{3, 8}, 3);
  GradientTape tape;
  const Tensor loss = reduce_sum(model(x, true));
  const auto vars = model.trainable_variables();
  ASSERT_EQ(vars.size(), 6u);
  const auto grads = tape.gradient(loss, vars);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(grads[i].defined()) << vars[i]->name();
}

TEST_F(FunctionalTest, SharedLayerHasTwoNodesAndOneSetOfWeights) {
  KerasTensor x = Input(Shape{6});
  auto dense = shared(Dense(6, {.activation = "tanh"}));
  KerasTensor a = (*dense)(x);
  KerasTensor b = (*dense)(a);
  EXPECT_EQ(a.node_index(), 0);
  EXPECT_EQ(b.node_index(), 1);
  EXPECT_EQ(b.to_string(), "dense[1][0]");
  Functional model({x}, {b});
  EXPECT_EQ(layer_names(model), (std::vector<std::string>{"input_1", "dense"}));
  EXPECT_EQ(model.nodes().size(), 3u);
  EXPECT_EQ(model.weights().size(), 2u);
  const Tensor in = random_tensor(Shape{2, 6}, 11);
  expect_near(model(in), (*dense)((*dense)(in)));
  // The Keras 2 config lists both nodes and the output as the second one.
  const json j = json::parse(model.to_json());
  const json& layer = j["config"]["layers"][1];
  EXPECT_EQ(layer["inbound_nodes"],
            json::parse(R"([[["input_1", 0, 0, {}]], [["dense", 0, 0, {}]]])"));
  EXPECT_EQ(j["config"]["output_layers"], json::parse(R"([["dense", 1, 0]])"));
}

TEST_F(FunctionalTest, TwoInputsAndTwoOutputsRunThroughCallList) {
  KerasTensor a = Input(Shape{4}, {.name = "a"});
  KerasTensor b = Input(Shape{3}, {.name = "b"});
  auto head = shared(Dense(2, {.name = "head"}));
  auto side = shared(Dense(1, {.name = "side"}));
  KerasTensor c = call(Concatenate(), {a, b});
  EXPECT_EQ(c.shape(), (Shape{7}));
  Functional model({a, b}, {(*head)(c), (*side)(a)}, {.name = "two"});
  const Tensor ta = random_tensor(Shape{5, 4}, 1), tb = random_tensor(Shape{5, 3}, 2);
  const std::vector<Tensor> outs = model.call_list(std::vector<Tensor>{ta, tb}, false);
  ASSERT_EQ(outs.size(), 2u);
  expect_near(outs[0], (*head)(concat({ta, tb}, 1)));
  expect_near(outs[1], (*side)(ta));
  expect_throws_with<InvalidArgumentError>([&] { model(ta); }, {"two", "2 inputs", "call_list"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        model.call_list(std::vector<Tensor>{tb, ta}, false);
      },
      {"two", "input 0", "'a'"});
}

TEST_F(FunctionalTest, AModelIsALayerInsideAnotherModel) {
  KerasTensor x = Input(Shape{5});
  auto inner_dense = shared(Dense(3, {.name = "inner_dense"}));
  auto inner = std::make_shared<Functional>(std::vector<KerasTensor>{x},
                                            std::vector<KerasTensor>{(*inner_dense)(x)},
                                            FunctionalOptions{.name = "inner"});
  KerasTensor z = Input(Shape{5});
  auto top = shared(Dense(1, {.name = "top"}));
  Functional outer({z}, {(*top)((*inner)(z))}, {.name = "outer"});
  EXPECT_EQ(layer_names(outer), (std::vector<std::string>{"input_2", "inner", "top"}));
  EXPECT_EQ(outer.weights().size(), 4u);
  const Tensor in = random_tensor(Shape{2, 5}, 5);
  expect_near(outer(in), (*top)((*inner_dense)(in)));
  // Keras numbers a nested model's calls from 1 (its node 0 is its own graph).
  const json j = json::parse(outer.to_json());
  EXPECT_EQ(j["config"]["layers"][2]["inbound_nodes"], json::parse(R"([[["inner", 1, 0, {}]]])"));
  auto back = model_from_json(outer.to_json());
  EXPECT_EQ(layer_names(*back), layer_names(outer));
  EXPECT_EQ(back->to_json(), outer.to_json());
}

TEST_F(FunctionalTest, GraphErrorsNameTheModelAndTheTensor) {
  KerasTensor a = Input(Shape{4});
  KerasTensor b = Input(Shape{4});
  auto d = shared(Dense(2));
  KerasTensor from_b = (*d)(b);
  // The output needs input_2, which is not an input of the model.
  expect_throws_with<InvalidArgumentError>(
      [&] { Functional({a}, {from_b}, {.name = "m"}); },
      {"'m'", "graph disconnected", "input_2[0][0]", "layer 'dense'"});
  // An input that no output depends on.
  expect_throws_with<InvalidArgumentError>(
      [&] {
        Functional({a, b}, {from_b}, {.name = "m"});
      },
      {"'m'", "inputs[0]", "input_1", "not connected"});
  // An intermediate tensor as an input.
  expect_throws_with<InvalidArgumentError>([&] { Functional({from_b}, {from_b}, {.name = "m"}); },
                                           {"not an Input() tensor", "Dense 'dense'"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        Functional({b, b}, {from_b}, {.name = "m"});
      },
      {"listed twice"});
  // A layer not owned by a shared_ptr cannot join a graph.
  Dense on_stack(3);
  expect_throws_with<FailedPreconditionError>([&] { on_stack(a); }, {"shared_ptr", "dense_1"});
  // Shapes are checked when a layer is called symbolically.
  KerasTensor c = Input(Shape{3});
  expect_throws_with<InvalidArgumentError>([&] { (*d)(c); }, {"dense"});
  expect_throws_with<InvalidArgumentError>([&] { call(Add(), {a, c}); }, {"Add", "incompatible"});
}

// TF-Keras 2's print_summary layout for a graph network: 98 columns, "Connected to", each
// layer row followed by a blank line, lists broken after "',".
TEST_F(FunctionalTest, SummaryPrintsKerasConnectedToColumn) {
  Residual r;
  Functional model({r.x}, {r.out}, {.name = "resnet"});
  std::ostringstream os;
  model.summary(os);
  auto row = [](const std::string& a, const std::string& b, const std::string& c,
                const std::string& d) {
    auto pad = [](std::string s, size_t n) { return s + std::string(n - s.size(), ' '); };
    return pad(" " + a, 32) + pad(b, 21) + pad(c, 12) + pad(d, 33) + "\n";
  };
  const std::string blank = std::string(98, ' ') + "\n";
  const std::string want =
      "Model: \"resnet\"\n" + std::string(98, '_') + "\n" +
      row("Layer (type)", "Output Shape", "Param #", "Connected to") + std::string(98, '=') + "\n" +
      row("input_1 (InputLayer)", "[(None, 8)]", "0", "[]") + blank +
      row("dense (Dense)", "(None, 4)", "36", "['input_1[0][0]']") + blank +
      row("dense_1 (Dense)", "(None, 4)", "20", "['dense[0][0]']") + blank +
      row("add (Add)", "(None, 4)", "0", "['dense[0][0]',") + row("", "", "", " 'dense_1[0][0]']") +
      blank + row("dense_2 (Dense)", "(None, 2)", "10", "['add[0][0]']") + blank +
      std::string(98, '=') + "\n" + "Total params: 66\nTrainable params: 66\n" +
      "Non-trainable params: 0\n" + std::string(98, '_') + "\n";
  EXPECT_EQ(os.str(), want);
}

TEST_F(FunctionalTest, SummaryOfAChainIsSequentialLike) {
  KerasTensor x = Input(Shape{3});
  Functional model({x}, {call(Dense(2), x)}, {.name = "chain"});
  std::ostringstream os;
  model.summary(os);
  auto row = [](const std::string& a, const std::string& b, const std::string& c) {
    auto pad = [](std::string s, size_t n) { return s + std::string(n - s.size(), ' '); };
    return pad(" " + a, 29) + pad(b, 26) + pad(c, 10) + "\n";
  };
  const std::string blank = std::string(65, ' ') + "\n";
  EXPECT_EQ(os.str(), "Model: \"chain\"\n" + std::string(65, '_') + "\n" +
                          row("Layer (type)", "Output Shape", "Param #") + std::string(65, '=') +
                          "\n" + row("input_1 (InputLayer)", "[(None, 3)]", "0") + blank +
                          row("dense (Dense)", "(None, 2)", "8") + blank + std::string(65, '=') +
                          "\nTotal params: 8\nTrainable params: 8\nNon-trainable params: 0\n" +
                          std::string(65, '_') + "\n");
}

// Written by hand from tf_keras/engine/functional.py (get_network_config) and engine/node.py
// (Node.serialize): the Keras 2 config of Input(8) → Dense(4, relu) → Dense(4), Add of both,
// → Dense(2). Layer configs abbreviated to the keys Keras 2.12 writes for Dense.
constexpr const char* kKeras2Residual = R"({"class_name": "Functional", "config": {
  "name": "model", "trainable": true, "layers": [
  {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8], "dtype": "float32",
   "sparse": false, "ragged": false, "name": "input_1"}, "name": "input_1", "inbound_nodes": []},
  {"class_name": "Dense", "config": {"name": "dense", "trainable": true, "dtype": "float32",
   "units": 4, "activation": "relu", "use_bias": true,
   "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": null}},
   "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": null,
   "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null,
   "bias_constraint": null}, "name": "dense", "inbound_nodes": [[["input_1", 0, 0, {}]]]},
  {"class_name": "Dense", "config": {"name": "dense_1", "trainable": true, "dtype": "float32",
   "units": 4, "activation": "linear", "use_bias": true}, "name": "dense_1",
   "inbound_nodes": [[["dense", 0, 0, {}]]]},
  {"class_name": "Add", "config": {"name": "add", "trainable": true, "dtype": "float32"},
   "name": "add", "inbound_nodes": [[["dense", 0, 0, {}], ["dense_1", 0, 0, {}]]]},
  {"class_name": "Dense", "config": {"name": "dense_2", "trainable": true, "dtype": "float32",
   "units": 2, "activation": "linear", "use_bias": true}, "name": "dense_2",
   "inbound_nodes": [[["add", 0, 0, {}]]]}],
  "input_layers": [["input_1", 0, 0]], "output_layers": [["dense_2", 0, 0]]},
  "keras_version": "2.12.0", "backend": "tensorflow"})";

// Written by hand from keras/src/models/functional.py (get_config), keras/src/ops/node.py and
// keras/src/saving/serialization_lib.py (__keras_tensor__): the same model as Keras 3 writes it
// (module / registered_name keys, batch_shape, DTypePolicy dtypes, the Add's inputs as one list
// argument).
constexpr const char* kKeras3Residual = R"({"module": "keras", "class_name": "Functional",
 "config": {"name": "functional", "trainable": true, "layers": [
  {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 8],
   "dtype": "float32", "sparse": false, "name": "input_layer"}, "registered_name": null,
   "name": "input_layer", "inbound_nodes": []},
  {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense",
   "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
   "config": {"name": "float32"}, "registered_name": null}, "units": 4, "activation": "relu",
   "use_bias": true, "kernel_initializer": {"module": "keras.initializers",
   "class_name": "GlorotUniform", "config": {"seed": null}, "registered_name": null},
   "bias_initializer": {"module": "keras.initializers", "class_name": "Zeros", "config": {},
   "registered_name": null}, "kernel_regularizer": null, "bias_regularizer": null,
   "kernel_constraint": null, "bias_constraint": null}, "registered_name": null,
   "build_config": {"input_shape": [null, 8]}, "name": "dense", "inbound_nodes": [
   {"args": [{"class_name": "__keras_tensor__", "config": {"shape": [null, 8],
    "dtype": "float32", "keras_history": ["input_layer", 0, 0]}}], "kwargs": {}}]},
  {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense_1",
   "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
   "config": {"name": "float32"}, "registered_name": null}, "units": 4, "activation": "linear",
   "use_bias": true}, "registered_name": null, "build_config": {"input_shape": [null, 4]},
   "name": "dense_1", "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__",
    "config": {"shape": [null, 4], "dtype": "float32", "keras_history": ["dense", 0, 0]}}],
    "kwargs": {}}]},
  {"module": "keras.layers", "class_name": "Add", "config": {"name": "add", "trainable": true,
   "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
   "registered_name": null}}, "registered_name": null,
   "build_config": {"input_shape": [[null, 4], [null, 4]]}, "name": "add", "inbound_nodes": [
   {"args": [[{"class_name": "__keras_tensor__", "config": {"shape": [null, 4],
     "dtype": "float32", "keras_history": ["dense", 0, 0]}},
    {"class_name": "__keras_tensor__", "config": {"shape": [null, 4], "dtype": "float32",
     "keras_history": ["dense_1", 0, 0]}}]], "kwargs": {}}]},
  {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense_2",
   "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
   "config": {"name": "float32"}, "registered_name": null}, "units": 2, "activation": "linear",
   "use_bias": true}, "registered_name": null, "build_config": {"input_shape": [null, 4]},
   "name": "dense_2", "inbound_nodes": [{"args": [{"class_name": "__keras_tensor__",
    "config": {"shape": [null, 4], "dtype": "float32", "keras_history": ["add", 0, 0]}}],
    "kwargs": {}}]}],
  "input_layers": [["input_layer", 0, 0]], "output_layers": [["dense_2", 0, 0]]},
 "registered_name": "Functional", "build_config": {"input_shape": null}})";

void expect_residual_structure(Model& m, const std::string& input_name) {
  auto* f = dynamic_cast<Functional*>(&m);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(layer_names(m),
            (std::vector<std::string>{input_name, "dense", "dense_1", "add", "dense_2"}));
  EXPECT_EQ(m.count_params(), 66);
  EXPECT_EQ(m.get_layer("add").class_name(), "Add");
  // The result is the residual computation with the model's own weights.
  auto& d0 = dynamic_cast<Dense&>(m.get_layer("dense"));
  auto& d1 = dynamic_cast<Dense&>(m.get_layer("dense_1"));
  auto& d2 = dynamic_cast<Dense&>(m.get_layer("dense_2"));
  EXPECT_EQ(d0.activation(), ops::Activation::kRelu);
  const Tensor x = random_tensor(Shape{3, 8}, 9);
  const Tensor h = d0(x);
  expect_near(m(x), d2(add(h, d1(h))));
}

TEST_F(FunctionalTest, LoadsKeras2Config) {
  auto m = model_from_json(kKeras2Residual);
  EXPECT_EQ(m->name(), "model");
  expect_residual_structure(*m, "input_1");
  // Keras before TF 2.4 wrote "Model" for the same config.
  json old = json::parse(kKeras2Residual);
  old["class_name"] = "Model";
  expect_residual_structure(*model_from_json(old.dump()), "input_1");
}

TEST_F(FunctionalTest, LoadsKeras3Config) {
  auto m = model_from_json(kKeras3Residual);
  EXPECT_EQ(m->name(), "functional");
  expect_residual_structure(*m, "input_layer");
}

TEST_F(FunctionalTest, Keras2JsonRoundTrips) {
  Residual r;
  Functional model({r.x}, {r.out}, {.name = "resnet"});
  const json j = json::parse(model.to_json());
  EXPECT_EQ(j["class_name"], "Functional");
  EXPECT_EQ(j["config"]["input_layers"], json::parse(R"([["input_1", 0, 0]])"));
  EXPECT_EQ(j["config"]["output_layers"], json::parse(R"([["dense_2", 0, 0]])"));
  const json& add_entry = j["config"]["layers"][3];
  EXPECT_EQ(add_entry["class_name"], "Add");
  EXPECT_EQ(add_entry["name"], "add");
  EXPECT_EQ(add_entry["inbound_nodes"],
            json::parse(R"([[["dense", 0, 0, {}], ["dense_1", 0, 0, {}]]])"));
  EXPECT_EQ(j["config"]["layers"][0]["inbound_nodes"], json::array());
  auto back = model_from_json(model.to_json());
  EXPECT_EQ(back->to_json(), model.to_json());
  expect_residual_structure(*back, "input_1");
}

TEST_F(FunctionalTest, Keras3JsonRoundTrips) {
  Residual r;
  Functional model({r.x}, {r.out}, {.name = "resnet"});
  const json j = json::parse(model.to_json_keras3());
  EXPECT_EQ(j["module"], "keras");
  EXPECT_EQ(j["registered_name"], "Functional");
  const json& layers = j["config"]["layers"];
  EXPECT_EQ(layers[0]["config"]["batch_shape"], json::parse("[null, 8]"));
  EXPECT_FALSE(layers[0]["config"].contains("batch_input_shape"));
  EXPECT_EQ(layers[1]["config"]["dtype"]["class_name"], "DTypePolicy");
  const json& add_args = layers[3]["inbound_nodes"][0]["args"];
  ASSERT_TRUE(add_args.is_array() && add_args.size() == 1 && add_args[0].is_array());
  EXPECT_EQ(add_args[0][1]["class_name"], "__keras_tensor__");
  EXPECT_EQ(add_args[0][1]["config"]["keras_history"], json::parse(R"(["dense_1", 0, 0])"));
  EXPECT_EQ(add_args[0][1]["config"]["shape"], json::parse("[null, 4]"));
  auto back = model_from_json(model.to_json_keras3());
  EXPECT_EQ(back->to_json(), model.to_json());
}

// Written by hand from keras/src/models/sequential.py (get_config, build_config): a Keras 3
// Sequential whose input shape is only in build_config.
TEST_F(FunctionalTest, LoadsKeras3Sequential) {
  const char* text = R"({"module": "keras", "class_name": "Sequential", "config": {
    "name": "sequential", "trainable": true, "dtype": {"module": "keras",
    "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null},
    "layers": [{"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense",
    "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
    "config": {"name": "float32"}, "registered_name": null}, "units": 3,
    "activation": "relu", "use_bias": true}, "registered_name": null,
    "build_config": {"input_shape": [null, 5]}}]}, "registered_name": null,
    "build_config": {"input_shape": [null, 5]}})";
  auto m = model_from_json(text);
  EXPECT_EQ(m->class_name(), "Sequential");
  EXPECT_TRUE(m->built());
  EXPECT_EQ(m->count_params(), 18);
  EXPECT_EQ((*m)(Tensor::zeros(Shape{2, 5})).shape(), (Shape{2, 3}));
  // Keras 3 also writes the shape as config.build_input_shape (the .keras and .h5 files in
  // ../shared/fixtures/keras3 have both).
  json j = json::parse(text);
  j.erase("build_config");
  j["config"]["build_input_shape"] = json::parse("[null, 5]");
  auto again = model_from_json(j.dump());
  EXPECT_TRUE(again->built());
  EXPECT_EQ(again->count_params(), 18);
}

TEST_F(FunctionalTest, BadConfigsNameThePath) {
  json j = json::parse(kKeras2Residual);
  j["config"]["layers"][3]["inbound_nodes"][0][1][0] = "nope";
  expect_throws_with<InvalidArgumentError>([&] { model_from_json(j.dump()); },
                                           {"layers[3]", "nope", "not produced"});
  j = json::parse(kKeras2Residual);
  j["config"]["output_layers"] = json::parse(R"([["dense_9", 0, 0]])");
  expect_throws_with<InvalidArgumentError>([&] { model_from_json(j.dump()); },
                                           {"output_layers[0]", "dense_9"});
  j = json::parse(kKeras2Residual);
  j["config"]["layers"][2]["config"]["units"] = 5;  // the Add's inputs no longer agree
  expect_throws_with<InvalidArgumentError>([&] { model_from_json(j.dump()); },
                                           {"layers[3]", "Add", "incompatible"});
  // A cycle (dense takes dense_1's output, which takes dense's): neither node can be made. In
  // C++ a cycle cannot be built at all, since a node's inputs exist before it.
  j = json::parse(kKeras2Residual);
  j["config"]["layers"][1]["inbound_nodes"] = json::parse(R"([[["dense_1", 0, 0, {}]]])");
  expect_throws_with<InvalidArgumentError>(
      [&] { model_from_json(j.dump()); },
      {"layers[1].inbound_nodes[0]", "dense_1", "not produced"});
  j = json::parse(kKeras3Residual);
  j["config"]["layers"][1]["inbound_nodes"][0]["args"][0] = 3;
  expect_throws_with<InvalidArgumentError>(
      [&] { model_from_json(j.dump()); },
      {"layers[1].inbound_nodes[0].args[0]", "__keras_tensor__"});
}

}  // namespace
}  // namespace dtrain::nn
