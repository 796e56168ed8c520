// Merging layers: values, gradients (finite differences through call_list), shapes, configs,
// and the errors that name the layer.
#include "dtrain/nn/merging.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/functional.h"
#include "testutil/expect_throws.h"
#include "testutil/gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;

class MergingTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_session(); }
};

Tensor run(Layer& layer, const std::vector<Tensor>& xs) {
  std::vector<Tensor> out = layer.call_list(xs, false);
  EXPECT_EQ(out.size(), 1u);
  return out[0];
}

TEST_F(MergingTest, ElementwiseValues) {
  const Tensor a = Tensor::from_vector<float>({1, -2, 3, 4}, Shape{2, 2});
  const Tensor b = Tensor::from_vector<float>({2, 5, -1, 0}, Shape{2, 2});
  const Tensor c = Tensor::from_vector<float>({0, 1, 1, 2}, Shape{2, 2});
  struct Case {
    std::shared_ptr<Layer> layer;
    std::vector<float> want;
  };
  const std::vector<Case> cases = {
      {std::make_shared<Add>(), {3, 4, 3, 6}},
      {std::make_shared<Multiply>(), {0, -10, -3, 0}},
      {std::make_shared<Average>(), {1, 4.0f / 3, 1, 2}},
      {std::make_shared<Maximum>(), {2, 5, 3, 4}},
      {std::make_shared<Minimum>(), {0, -2, -1, 0}},
  };
  for (const Case& k : cases) {
    const Tensor y = run(*k.layer, {a, b, c});
    for (size_t i = 0; i < k.want.size(); ++i) {
      EXPECT_NEAR(y.data<float>()[i], k.want[i], 1e-6) << k.layer->class_name() << " " << i;
    }
  }
  Subtract sub;
  const Tensor d = run(sub, {a, b});
  EXPECT_EQ(d.data<float>()[1], -7.0f);
}

TEST_F(MergingTest, GradientsMatchFiniteDifferences) {
  const std::vector<std::shared_ptr<Layer>> layers = {
      std::make_shared<Add>(),     std::make_shared<Multiply>(), std::make_shared<Average>(),
      std::make_shared<Maximum>(), std::make_shared<Minimum>(),  std::make_shared<Concatenate>()};
  for (const auto& layer : layers) {
    const double err =
        gradcheck([&](const std::vector<Tensor>& xs) { return layer->call_list(xs, true)[0]; },
                  {random_tensor(Shape{2, 3}, 1), random_tensor(Shape{2, 3}, 2),
                   random_tensor(Shape{2, 3}, 3)});
    EXPECT_LT(err, 1e-2) << layer->class_name();
  }
  Subtract sub;
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& xs) { return sub.call_list(xs, true)[0]; },
                      {random_tensor(Shape{2, 3}, 4), random_tensor(Shape{2, 3}, 5)}),
            1e-2);
}

TEST_F(MergingTest, BroadcastsDimensionsOfOne) {
  Add add;
  const std::vector<Shape> shapes = {Shape{3, 1}, Shape{3, 4}};
  EXPECT_EQ(add.compute_output_shapes(shapes)[0], (Shape{3, 4}));
  const Tensor y = run(add, {Tensor::ones(Shape{2, 3, 1}), Tensor::ones(Shape{2, 3, 4})});
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(y.data<float>()[5], 2.0f);
}

TEST_F(MergingTest, ConcatenateAlongAnAxis) {
  Concatenate last;
  const std::vector<Shape> shapes = {Shape{3, 2}, Shape{3, 5}};
  EXPECT_EQ(last.compute_output_shapes(shapes)[0], (Shape{3, 7}));
  Concatenate middle({.axis = 1});
  const std::vector<Shape> rows = {Shape{3, 2}, Shape{1, 2}};
  EXPECT_EQ(middle.compute_output_shapes(rows)[0], (Shape{4, 2}));
  const Tensor y = run(middle, {Tensor::zeros(Shape{2, 3, 2}), Tensor::ones(Shape{2, 1, 2})});
  EXPECT_EQ(y.shape(), (Shape{2, 4, 2}));
  EXPECT_EQ(y.data<float>()[6], 1.0f);
  EXPECT_EQ(y.data<float>()[8], 0.0f);
}

TEST_F(MergingTest, ErrorsNameTheLayer) {
  Add add({.name = "sum"});
  const std::vector<Shape> one = {Shape{3}};
  expect_throws_with<InvalidArgumentError>([&] { add.build_list(one); },
                                           {"Add 'sum'", "at least 2 inputs"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        add(Tensor::zeros(Shape{2, 3}));
      },
      {"Add 'sum'", "list"});
  const std::vector<Shape> mismatched = {Shape{3}, Shape{4}};
  expect_throws_with<InvalidArgumentError>([&] { add.build_list(mismatched); },
                                           {"Add 'sum'", "incompatible", "[3]", "[4]"});
  Subtract sub;
  const std::vector<Shape> three = {Shape{3}, Shape{3}, Shape{3}};
  expect_throws_with<InvalidArgumentError>([&] { sub.build_list(three); },
                                           {"Subtract 'subtract'", "exactly 2"});
  Concatenate cat({.axis = 3, .name = "cat"});
  const std::vector<Shape> pair = {Shape{3, 2}, Shape{3, 2}};
  expect_throws_with<InvalidArgumentError>([&] { cat.build_list(pair); },
                                           {"Concatenate 'cat'", "axis 3", "out of range"});
  Concatenate batch({.axis = 0, .name = "b"});
  expect_throws_with<InvalidArgumentError>([&] { batch.build_list(pair); },
                                           {"Concatenate 'b'", "batch"});
  Concatenate c2({.name = "c2"});
  const std::vector<Shape> differ = {Shape{3, 2}, Shape{4, 2}};
  expect_throws_with<InvalidArgumentError>([&] { c2.build_list(differ); },
                                           {"Concatenate 'c2'", "[3, 2]", "[4, 2]"});
}

TEST_F(MergingTest, ConfigsAreKeras) {
  Concatenate cat({.axis = 1, .name = "cat"});
  const auto c = nlohmann::json::parse(cat.config_json());
  EXPECT_EQ(c["axis"], 1);
  EXPECT_EQ(c["name"], "cat");
  EXPECT_EQ(c["dtype"], "float32");
  Maximum m;
  EXPECT_EQ(nlohmann::json::parse(m.config_json())["name"], "maximum");
}

// --- Dot ---------------------------------------------------------------------------------------

TEST_F(MergingTest, DotValuesAndShapes) {
  // [1, 2]·[3, 4] = 11; [B, K]·[B, K] → [B, 1].
  Dot dot;
  const Tensor y = run(dot, {Tensor::from_vector(std::vector<float>{1, 2}, Shape{1, 2}),
                             Tensor::from_vector(std::vector<float>{3, 4}, Shape{1, 2})});
  EXPECT_EQ(y.shape(), (Shape{1, 1}));
  EXPECT_FLOAT_EQ(y.data<float>()[0], 11.0f);
  // normalize: the cosine, 11 / (√5 · 5).
  Dot cos({.normalize = true});
  EXPECT_NEAR(run(cos, {Tensor::from_vector(std::vector<float>{1, 2}, Shape{1, 2}),
                        Tensor::from_vector(std::vector<float>{3, 4}, Shape{1, 2})})
                  .data<float>()[0],
              11.0 / (std::sqrt(5.0) * 5.0), 1e-6);
  Dot pair({.axes = {2, 2}});
  const std::vector<Shape> s = {Shape{4, 3}, Shape{6, 3}};
  EXPECT_EQ(pair.compute_output_shapes(s)[0], (Shape{4, 6}));
  Dot mixed({.axes = {1, 2}});
  const std::vector<Shape> m = {Shape{5, 2, 3}, Shape{4, 5}};
  EXPECT_EQ(mixed.compute_output_shapes(m)[0], (Shape{2, 3, 4}));
}

TEST_F(MergingTest, DotGradientsMatchFiniteDifferences) {
  struct Case {
    int a, b;
    bool normalize;
    Shape x, y;
  };
  const std::vector<Case> cases = {
      {1, 1, false, Shape{3, 4}, Shape{3, 4}},
      {2, 2, false, Shape{2, 3, 4}, Shape{2, 5, 4}},
      {1, 2, true, Shape{2, 4, 3}, Shape{2, 2, 4}},
      {-1, 1, true, Shape{2, 3, 2, 4}, Shape{2, 4, 3}},
  };
  for (const Case& c : cases) {
    Dot dot({.axes = {c.a, c.b}, .normalize = c.normalize});
    const double err =
        gradcheck([&](const std::vector<Tensor>& xs) { return dot.call_list(xs, true)[0]; },
                  {random_tensor(c.x, 7), random_tensor(c.y, 8)}, 1e-3f);
    EXPECT_LT(err, 1e-2) << dot.config_json() << " " << c.x.to_string() << " " << c.y.to_string();
  }
}

// Forward and backward against PyTorch (tools/golden/gen_dot_golden.py), 1e-5 relative.
TEST_F(MergingTest, DotMatchesTorch) {
  std::ifstream in(DTRAIN_SOURCE_DIR "/tests/golden/dot_golden.json");
  ASSERT_TRUE(in) << "tests/golden/dot_golden.json";
  const nlohmann::json doc = nlohmann::json::parse(in);
  auto tensor = [](const nlohmann::json& t) {
    return Tensor::from_vector(t.at("data").get<std::vector<float>>(),
                               Shape(t.at("shape").get<std::vector<int64_t>>()));
  };
  auto expect_close = [](const Tensor& a, const nlohmann::json& e, const std::string& what) {
    ASSERT_EQ(a.shape(), Shape(e.at("shape").get<std::vector<int64_t>>())) << what;
    const std::vector<double> want = e.at("data").get<std::vector<double>>();
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(a.data<float>()[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-6) << what << i;
    }
  };
  ASSERT_EQ(doc.at("dot").size(), 6u);
  for (const nlohmann::json& c : doc.at("dot")) {
    Dot dot({.axes = {c["axes"][0].get<int>(), c["axes"][1].get<int>()},
             .normalize = c["normalize"].get<bool>()});
    const std::string what = dot.config_json();
    Tensor x = tensor(c["x"]), y = tensor(c["y"]);
    std::vector<Tensor> grads;
    Tensor out;
    {
      GradientTape tape;
      tape.watch(x);
      tape.watch(y);
      out = dot.call_list(std::vector<Tensor>{x, y}, true)[0];
      grads = tape.gradient(reduce_sum(multiply(out, tensor(c["w"]))), std::vector<Tensor>{x, y});
    }
    expect_close(out, c["out"], what + " out");
    expect_close(grads[0], c["dx"], what + " dx");
    expect_close(grads[1], c["dy"], what + " dy");
  }
}

TEST_F(MergingTest, DotErrorsNameTheLayerAndConfigsRoundTrip) {
  Dot dot({.axes = {1, 1}, .name = "d"});
  const std::vector<Shape> differ = {Shape{3}, Shape{4}};
  expect_throws_with<InvalidArgumentError>([&] { dot.build_list(differ); },
                                           {"Dot 'd'", "differ in size", "[3]", "[4]"});
  Dot batch({.axes = {0, 0}, .name = "b"});
  const std::vector<Shape> pair = {Shape{3}, Shape{3}};
  expect_throws_with<InvalidArgumentError>([&] { batch.build_list(pair); },
                                           {"Dot 'b'", "batch axis"});
  const std::vector<Shape> three = {Shape{3}, Shape{3}, Shape{3}};
  expect_throws_with<InvalidArgumentError>([&] { dot.build_list(three); },
                                           {"Dot 'd'", "exactly 2"});
  Dot two({.axes = {2, 1}, .normalize = true, .name = "t"});
  const auto c = nlohmann::json::parse(two.config_json());
  EXPECT_EQ(c["axes"], nlohmann::json({2, 1}));
  EXPECT_EQ(c["normalize"], true);
  EXPECT_EQ(nlohmann::json::parse(dot.config_json())["axes"], 1);
  // Through a model config and back (the layer registry).
  KerasTensor a = Input(Shape{3, 4}), b = Input(Shape{4, 5});
  Functional model({a, b}, {call(Dot({.axes = {2, 1}, .normalize = true, .name = "t"}), {a, b})});
  auto again = model_from_json(model.to_json());
  Dot* d = nullptr;
  for (const auto& l : again->layers()) {
    if (auto* p = dynamic_cast<Dot*>(l.get())) d = p;
  }
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->options().axes, (std::array<int, 2>{2, 1}));
  EXPECT_TRUE(d->options().normalize);
  EXPECT_EQ(d->name(), "t");
}

}  // namespace
}  // namespace dtrain::nn
