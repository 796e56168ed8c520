// LSTM, GRU, Bidirectional and TimeDistributed through the Layer API: Keras's weight names and
// shapes, finite-difference gradients, return_sequences / return_state / go_backwards, merge
// modes, configs and bad input. Values against PyTorch are in seq_golden_test.cc.
#include "dtrain/autograd/recurrent.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/recurrent.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"
#include "testutil/weights_gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;
using testutil::weights_gradcheck;
constexpr double kTol = 2e-2;

std::vector<std::string> names_of(Layer& l) {
  std::vector<std::string> out;
  for (Variable* v : l.weights()) out.push_back(v->name() + " " + v->shape().to_string());
  return out;
}

TEST(Recurrent, KerasWeightNamesShapesAndInitialValues) {
  LSTM lstm(4, {.seed = 1, .input_shape = Shape{5, 3}, .name = "lstm"});
  EXPECT_EQ(names_of(lstm), (std::vector<std::string>{"lstm/lstm_cell/kernel [3, 16]",
                                                      "lstm/lstm_cell/recurrent_kernel [4, 16]",
                                                      "lstm/lstm_cell/bias [16]"}));
  // unit_forget_bias: (0, 1, 0, 0) blocks.
  const Tensor& b = lstm.weights()[2]->tensor();
  for (int64_t j = 0; j < 16; ++j) EXPECT_EQ(b.data<float>()[j], j >= 4 && j < 8 ? 1.0f : 0.0f);
  // The orthogonal recurrent kernel [4, 16]: rows are orthonormal.
  const Tensor& u = lstm.weights()[1]->tensor();
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 4; ++s) {
      double dot = 0;
      for (int j = 0; j < 16; ++j) dot += u.data<float>()[r * 16 + j] * u.data<float>()[s * 16 + j];
      EXPECT_NEAR(dot, r == s ? 1.0 : 0.0, 1e-5);
    }
  GRU gru(3, {.input_shape = Shape{5, 2}, .name = "gru"});
  EXPECT_EQ(names_of(gru), (std::vector<std::string>{"gru/gru_cell/kernel [2, 9]",
                                                     "gru/gru_cell/recurrent_kernel [3, 9]",
                                                     "gru/gru_cell/bias [2, 9]"}));
  GRU gru_before(3, {.reset_after = false, .input_shape = Shape{5, 2}, .name = "gru_b"});
  EXPECT_EQ(gru_before.weights()[2]->shape(), (Shape{9}));
}

TEST(Recurrent, OutputsAndStates) {
  const Tensor x = random_tensor(Shape{2, 6, 3}, 2);
  LSTM seq(4, {.return_sequences = true, .return_state = true, .seed = 3});
  const Tensor xs[1] = {x};
  std::vector<Tensor> out = seq.call_list(std::span<const Tensor>(xs, 1), false);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 6, 4}));
  EXPECT_EQ(out[1].shape(), (Shape{2, 4}));
  EXPECT_EQ(out[2].shape(), (Shape{2, 4}));
  // The last step of the sequence is the final h.
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(out[0].data<float>()[(b * 6 + 5) * 4 + j], out[1].data<float>()[b * 4 + j]);
    }
  const Shape in[1] = {Shape{6, 3}};
  EXPECT_EQ(seq.compute_output_shapes(std::span<const Shape>(in, 1)),
            (std::vector<Shape>{Shape{6, 4}, Shape{4}, Shape{4}}));
  GRU last(5, {.seed = 4});
  EXPECT_EQ(last(x).shape(), (Shape{2, 5}));
  // go_backwards equals the forward layer on the reversed sequence.
  GRU fwd(3, {.return_sequences = true, .seed = 5});
  GRU bwd(3, {.return_sequences = true, .go_backwards = true, .seed = 5});
  const Tensor y = fwd(reverse_sequence(x));
  EXPECT_TRUE(y.equals(bwd(x)));
}

// Randomizes every weight of `l` (biases start at zero; check them in general position).
void randomize(Layer& l, uint64_t seed) {
  for (Variable* v : l.weights()) v->assign(random_tensor(v->shape(), seed++, -0.8f, 0.8f));
}

TEST(Recurrent, GradientsOfWeightsAndInputs) {
  const Tensor x = random_tensor(Shape{2, 4, 3}, 6);
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind == 0 ? "LSTM" : kind == 1 ? "GRU" : "GRU reset_after=false");
    for (bool seqs : {false, true}) {
      const RecurrentOptions o{.return_sequences = seqs, .reset_after = kind != 2, .seed = 7};
      std::unique_ptr<RecurrentLayer> l;
      if (kind == 0) {
        l = std::make_unique<LSTM>(3, o);
      } else {
        l = std::make_unique<GRU>(3, o);
      }
      (*l)(x);
      randomize(*l, 8);
      EXPECT_LT(weights_gradcheck([&] { return (*l)(x); }, l->trainable_weights()), kTol);
      EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return (*l)(v[0]); }, {x}), kTol);
    }
  }
  // The LSTM's final cell state.
  LSTM lstm(2, {.seed = 9});
  lstm(x);
  randomize(lstm, 10);
  EXPECT_LT(
      weights_gradcheck([&] { return lstm.call_with_states(x)[2]; }, lstm.trainable_weights()),
      kTol);
}

TEST(Bidirectional, NamesMergeModesAndGradients) {
  const Tensor x = random_tensor(Shape{2, 5, 3}, 11);
  Bidirectional bi(LSTM(4, {.return_sequences = true, .name = "lstm"}), {.name = "bidirectional"});
  const Tensor y = bi(x);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(names_of(bi), (std::vector<std::string>{
                              "bidirectional/forward_lstm/lstm_cell/kernel [3, 16]",
                              "bidirectional/forward_lstm/lstm_cell/recurrent_kernel [4, 16]",
                              "bidirectional/forward_lstm/lstm_cell/bias [16]",
                              "bidirectional/backward_lstm/lstm_cell/kernel [3, 16]",
                              "bidirectional/backward_lstm/lstm_cell/recurrent_kernel [4, 16]",
                              "bidirectional/backward_lstm/lstm_cell/bias [16]"}));
  // concat = [forward, backward re-reversed into time order].
  const Tensor f = bi.forward_layer()(x);
  const Tensor b = reverse_sequence(bi.backward_layer()(x));
  for (int64_t p = 0; p < 10; ++p)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(y.data<float>()[p * 8 + j], f.data<float>()[p * 4 + j]);
      EXPECT_EQ(y.data<float>()[p * 8 + 4 + j], b.data<float>()[p * 4 + j]);
    }
  randomize(bi, 12);
  EXPECT_LT(weights_gradcheck([&] { return bi(x); }, bi.trainable_weights()), kTol);
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return bi(v[0]); }, {x}), kTol);
  for (const char* mode : {"sum", "mul", "ave"}) {
    SCOPED_TRACE(mode);
    Bidirectional m(GRU(3, {.seed = 13}), {.merge_mode = mode});
    EXPECT_EQ(m(x).shape(), (Shape{2, 3}));
    randomize(m, 14);
    EXPECT_LT(weights_gradcheck([&] { return m(x); }, m.trainable_weights()), kTol);
  }
  expect_throws_with<InvalidArgumentError>(
      [] { Bidirectional(GRU(2), {.merge_mode = "max", .name = "bad_bi"}); },
      {"Bidirectional 'bad_bi'", "merge_mode", "'max'"});
}

TEST(TimeDistributed, AppliesTheLayerToEveryStep) {
  auto dense = std::make_shared<Dense>(3, DenseOptions{.seed = 15, .name = "td_dense"});
  TimeDistributed td(dense);
  const Tensor x = random_tensor(Shape{2, 4, 5}, 16);
  const Tensor y = td(x);
  EXPECT_EQ(y.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(td.compute_output_shape(Shape{4, 5}), (Shape{4, 3}));
  EXPECT_EQ(names_of(td),
            (std::vector<std::string>{"td_dense/kernel [5, 3]", "td_dense/bias [3]"}));
  randomize(td, 17);
  EXPECT_LT(weights_gradcheck([&] { return td(x); }, td.trainable_weights()), kTol);
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return td(v[0]); }, {x}), kTol);
}

TEST(Recurrent, ConfigsRoundTripThroughModelJson) {
  Sequential model({LSTM(4, {.return_sequences = true, .input_shape = Shape{6, 3}, .name = "l"}),
                    Bidirectional(GRU(2, {.reset_after = false, .name = "g"}), {.name = "bi"}),
                    Dense(1, {.name = "d"})});
  const std::string text = model.to_json();
  const nlohmann::json j = nlohmann::json::parse(text);
  const nlohmann::json& layers = j["config"]["layers"];
  const nlohmann::json& bi = layers[layers.size() - 2];
  EXPECT_EQ(bi["class_name"], "Bidirectional");
  EXPECT_EQ(bi["config"]["layer"]["class_name"], "GRU");
  EXPECT_EQ(bi["config"]["layer"]["config"]["name"], "g");
  EXPECT_EQ(bi["config"]["layer"]["config"]["reset_after"], false);
  std::unique_ptr<Model> back = model_from_json(text);
  std::vector<std::string> a, b;
  for (Variable* v : model.weights()) a.push_back(v->name() + v->shape().to_string());
  for (Variable* v : back->weights()) b.push_back(v->name() + v->shape().to_string());
  EXPECT_EQ(a, b);
  EXPECT_EQ((*back)(Tensor::zeros(Shape{2, 6, 3})).shape(), (Shape{2, 1}));
}

TEST(Bidirectional, ReadsKeras3ConfigsWithTheBackwardCopy) {
  // Keras 3 writes the forward copy as "layer" and its mirror as "backward_layer".
  std::unique_ptr<Model> m = model_from_json(R"({"class_name": "Sequential", "config": {
    "name": "s", "layers": [
      {"class_name": "InputLayer", "config": {"name": "in", "batch_shape": [null, 4, 3]}},
      {"class_name": "Bidirectional", "config": {"name": "bi", "merge_mode": "sum",
        "layer": {"class_name": "GRU", "config": {"name": "forward_gru", "units": 2}},
        "backward_layer": {"class_name": "GRU", "config": {"name": "backward_gru", "units": 2,
                                                           "go_backwards": true}}}}]}})");
  std::vector<std::string> names;
  for (Variable* v : m->weights()) names.push_back(v->name());
  ASSERT_EQ(names.size(), 6u);
  EXPECT_EQ(names[0], "bi/forward_gru/gru_cell/kernel");
  EXPECT_EQ(names[3], "bi/backward_gru/gru_cell/kernel");
  expect_throws_with<InvalidArgumentError>(
      [] {
        model_from_json(R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
          {"class_name": "Bidirectional", "config": {"name": "bi",
           "layer": {"class_name": "GRU", "config": {"name": "g", "units": 2}},
           "backward_layer": {"class_name": "LSTM", "config": {"name": "l", "units": 2,
                                                               "go_backwards": true}}}}]}})");
      },
      {"backward_layer", "mirror"});
}

TEST(Recurrent, BadInputNamesTheLayer) {
  LSTM lstm(3, {.name = "enc"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        lstm(Tensor::zeros(Shape{2, 3}));
      },
      {"LSTM 'enc'", "[batch, time, features]"});
  GRU gru(2, {.input_shape = Shape{4, 3}, .name = "dec"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        gru(Tensor::zeros(Shape{2, 4, 5}));
      },
      {"GRU 'dec'", "[2, 4, 5]"});
  expect_throws_with<InvalidArgumentError>([] { LSTM(2, {.activation = "softmax", .name = "sm"}); },
                                           {"LSTM 'sm'", "softmax"});
  expect_throws_with<InvalidArgumentError>(
      [] {
        model_from_json(R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
          {"class_name": "LSTM", "config": {"name": "l", "units": 2, "dropout": 0.5,
           "batch_input_shape": [null, 3, 2]}}]}})");
      },
      {"dropout", "not supported"});
}

}  // namespace
}  // namespace dtrain::nn
