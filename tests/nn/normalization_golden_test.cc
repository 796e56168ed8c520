// Compares dtrain's activations (standalone and fused into Dense), batch norm (training and
// inference, with the moving-statistics update of the BatchNormalization layer) and layer norm,
// forward and backward, with golden values computed by PyTorch (tools/golden/gen_norm_golden.py
// writes tests/golden/norm_golden.json). Tolerance: 1e-5 relative plus 1e-6 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/autograd/activations.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/autograd/normalization.h"
#include "dtrain/nn/normalization.h"
#include "testutil/golden.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;

const json& golden() { return testutil::golden_file("norm_golden.json"); }
Tensor tensor_of(const json& t) { return testutil::golden_tensor(t); }
void expect_close(const Tensor& actual, const json& expected, const std::string& what) {
  testutil::expect_close_to_golden(actual, expected, what);
}

TEST(NormGoldenTest, FileHasEveryCase) {
  EXPECT_EQ(golden().at("activations").size(), 16u);
  EXPECT_EQ(golden().at("dense").size(), 5u);
  EXPECT_EQ(golden().at("batch_norm").size(), 3u);
  EXPECT_EQ(golden().at("layer_norm").size(), 3u);
}

TEST(NormGoldenTest, ActivationsForwardAndBackward) {
  for (const json& c : golden().at("activations")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    Tensor x = tensor_of(c.at("x"));
    const Tensor r = tensor_of(c.at("r"));
    GradientTape tape;
    tape.watch(x);
    const Tensor y = activation(x, ops::activation_from_name(name));
    expect_close(y, c.at("y"), name + " y");
    expect_close(tape.gradient(reduce_sum(multiply(y, r)), x), c.at("dx"), name + " dx");
  }
}

TEST(NormGoldenTest, DenseWithActivationsThatNeedTheirInput) {
  for (const json& c : golden().at("dense")) {
    const std::string name = c.at("activation").get<std::string>();
    SCOPED_TRACE(name);
    Tensor x = tensor_of(c.at("x"));
    Tensor w = tensor_of(c.at("kernel"));
    Tensor b = tensor_of(c.at("bias"));
    const Tensor r = tensor_of(c.at("r"));
    GradientTape tape;
    tape.watch(x);
    tape.watch(w);
    tape.watch(b);
    const Tensor y = dense(x, w, b, ops::activation_from_name(name));
    expect_close(y, c.at("y"), name + " y");
    const std::vector<Tensor> g = tape.gradient(reduce_sum(multiply(y, r)), {x, w, b});
    expect_close(g[0], c.at("dx"), name + " dx");
    expect_close(g[1], c.at("dkernel"), name + " dkernel");
    expect_close(g[2], c.at("dbias"), name + " dbias");
  }
}

TEST(NormGoldenTest, BatchNormTrainingInferenceAndMovingStatistics) {
  for (const json& c : golden().at("batch_norm")) {
    const int axis = c.at("axis").get<int>();
    const float eps = c.at("epsilon").get<float>();
    const std::string what = "batch_norm axis " + std::to_string(axis);
    SCOPED_TRACE(what);
    Tensor x = tensor_of(c.at("x"));
    Tensor gamma = tensor_of(c.at("gamma"));
    Tensor beta = tensor_of(c.at("beta"));
    const Tensor r = tensor_of(c.at("r"));
    {
      GradientTape tape;
      tape.watch(x);
      tape.watch(gamma);
      tape.watch(beta);
      const Tensor y = batch_norm_training(x, gamma, beta, axis, eps);
      expect_close(y, c.at("y"), what + " y");
      const std::vector<Tensor> g = tape.gradient(reduce_sum(multiply(y, r)), {x, gamma, beta});
      expect_close(g[0], c.at("dx"), what + " dx");
      expect_close(g[1], c.at("dgamma"), what + " dgamma");
      expect_close(g[2], c.at("dbeta"), what + " dbeta");
    }
    // The layer: one training call updates the moving statistics, inference then uses them.
    BatchNormalization bn(
        {.axis = axis, .momentum = c.at("momentum").get<float>(), .epsilon = eps});
    const Shape per_example = x.shape().without_first();
    bn.build(per_example);
    bn.gamma()->assign(gamma);
    bn.beta()->assign(beta);
    bn.moving_mean().assign(tensor_of(c.at("moving_mean")));
    bn.moving_variance().assign(tensor_of(c.at("moving_variance")));
    expect_close(bn(x, /*training=*/true), c.at("y"), what + " layer y");
    expect_close(bn.moving_mean().tensor(), c.at("new_moving_mean"), what + " moving_mean");
    expect_close(bn.moving_variance().tensor(), c.at("new_moving_variance"),
                 what + " moving_variance");
    Tensor xi = tensor_of(c.at("x_infer"));
    expect_close(bn(xi, /*training=*/false), c.at("y_infer"), what + " layer y_infer");
    {
      GradientTape tape;
      tape.watch(xi);
      tape.watch(gamma);
      tape.watch(beta);
      const Tensor y = batch_norm_inference(xi, gamma, beta, bn.moving_mean().tensor(),
                                            bn.moving_variance().tensor(), axis, eps);
      expect_close(y, c.at("y_infer"), what + " y_infer");
      const std::vector<Tensor> g = tape.gradient(reduce_sum(multiply(y, r)), {xi, gamma, beta});
      expect_close(g[0], c.at("dx_infer"), what + " dx_infer");
      expect_close(g[1], c.at("dgamma_infer"), what + " dgamma_infer");
      expect_close(g[2], c.at("dbeta_infer"), what + " dbeta_infer");
    }
  }
}

TEST(NormGoldenTest, LayerNormForwardAndBackward) {
  for (const json& c : golden().at("layer_norm")) {
    const std::vector<int> axes = c.at("axis").get<std::vector<int>>();
    const std::string what = "layer_norm " + c.at("axis").dump();
    SCOPED_TRACE(what);
    Tensor x = tensor_of(c.at("x"));
    Tensor gamma = tensor_of(c.at("gamma"));
    Tensor beta = tensor_of(c.at("beta"));
    const Tensor r = tensor_of(c.at("r"));
    GradientTape tape;
    tape.watch(x);
    tape.watch(gamma);
    tape.watch(beta);
    const Tensor y = layer_norm(x, gamma, beta, axes.front(), c.at("epsilon").get<float>());
    expect_close(y, c.at("y"), what + " y");
    const std::vector<Tensor> g = tape.gradient(reduce_sum(multiply(y, r)), {x, gamma, beta});
    expect_close(g[0], c.at("dx"), what + " dx");
    expect_close(g[1], c.at("dgamma"), what + " dgamma");
    expect_close(g[2], c.at("dbeta"), what + " dbeta");
    // The layer with the same weights.
    LayerNormalization ln({.axis = axes, .epsilon = c.at("epsilon").get<float>()});
    ln.build(x.shape().without_first());
    ln.gamma()->assign(gamma);
    ln.beta()->assign(beta);
    expect_close(ln(x), c.at("y"), what + " layer y");
  }
}

}  // namespace
}  // namespace dtrain::nn
