// Compares dtrain's fused dense op, activations and losses, forward and backward, with golden
// values computed by PyTorch autograd (tools/golden/gen_nn_golden.py writes
// tests/golden/nn_golden.json). Tolerance: 1e-5 relative plus 1e-6 absolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/losses.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;

// Largest |dtrain − torch| / (kRtol·|torch| + kAtol) seen so far (≤ 1 passes), for the log.
double worst_ratio = 0;

const json& golden() {
  static const json doc = [] {
    const std::string path = DTRAIN_SOURCE_DIR "/tests/golden/nn_golden.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return json::parse(in);
  }();
  return doc;
}

Shape shape_of(const json& t) { return Shape(t.at("shape").get<std::vector<int64_t>>()); }

// A tensor from {"shape": [...], "dtype": "...", "data": [...]}.
Tensor tensor_of(const json& t) {
  const std::string dtype = t.at("dtype").get<std::string>();
  const Shape shape = shape_of(t);
  if (dtype == "float32") return Tensor::from_vector(t.at("data").get<std::vector<float>>(), shape);
  if (dtype == "int32") {
    return Tensor::from_vector(t.at("data").get<std::vector<int32_t>>(), shape);
  }
  if (dtype == "int64") {
    return Tensor::from_vector(t.at("data").get<std::vector<int64_t>>(), shape);
  }
  if (dtype == "uint8") {
    return Tensor::from_vector(t.at("data").get<std::vector<uint8_t>>(), shape);
  }
  throw std::runtime_error("golden: unknown dtype " + dtype);
}

// Expects `actual` to match the golden tensor `expected` elementwise.
void expect_close(const Tensor& actual, const json& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(actual.shape(), shape_of(expected)) << what;
  const std::vector<double> e = expected.at("data").get<std::vector<double>>();
  const float* a = actual.data<float>();
  int failures = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const double tol = kRtol * std::fabs(e[i]) + kAtol;
    worst_ratio = std::max(worst_ratio, std::fabs(a[i] - e[i]) / tol);
    if (std::fabs(a[i] - e[i]) > tol && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: dtrain " << a[i] << ", torch " << e[i] << " (|diff| "
                    << std::fabs(a[i] - e[i]) << " > " << tol << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << e.size() << " elements differ";
}

void expect_close(double actual, double expected, const std::string& what) {
  worst_ratio =
      std::max(worst_ratio, std::fabs(actual - expected) / (kRtol * std::fabs(expected) + kAtol));
  EXPECT_NEAR(actual, expected, kRtol * std::fabs(expected) + kAtol) << what;
}

TEST(NnGoldenTest, FileHasEveryCase) {
  EXPECT_EQ(golden().at("dense").size(), 6u);
  EXPECT_EQ(golden().at("activations").size(), 6u);
  EXPECT_GE(golden().at("losses").size(), 14u);
}

TEST(NnGoldenTest, DenseForwardAndBackward) {
  worst_ratio = 0;
  for (const json& c : golden().at("dense")) {
    const std::string act_name = c.at("activation").get<std::string>();
    const std::string what = "dense " + act_name + (c.at("bias").is_null() ? " (no bias)" : "");
    SCOPED_TRACE(what);
    Tensor x = tensor_of(c.at("x"));
    Tensor kernel = tensor_of(c.at("kernel"));
    Tensor bias = c.at("bias").is_null() ? Tensor() : tensor_of(c.at("bias"));
    const Tensor r = tensor_of(c.at("r"));
    GradientTape tape;
    tape.watch(x);
    tape.watch(kernel);
    if (bias.defined()) tape.watch(bias);
    const Tensor out = dense(x, kernel, bias, ops::activation_from_name(act_name));
    const Tensor loss = reduce_sum(multiply(out, r));
    expect_close(out, c.at("out"), what + " out");
    // The watched handles carry the tape references, so gradients are asked for them.
    std::vector<Tensor> watched = {x, kernel};
    if (bias.defined()) watched.push_back(bias);
    const std::vector<Tensor> grads = tape.gradient(loss, watched);
    expect_close(grads[0], c.at("grad_x"), what + " grad_x");
    expect_close(grads[1], c.at("grad_kernel"), what + " grad_kernel");
    if (bias.defined()) expect_close(grads[2], c.at("grad_bias"), what + " grad_bias");
  }
  std::printf("dense: worst error %.3f of tolerance\n", worst_ratio);
}

TEST(NnGoldenTest, ActivationsForwardAndBackward) {
  worst_ratio = 0;
  for (const json& c : golden().at("activations")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    Tensor x = tensor_of(c.at("x"));
    const Tensor r = tensor_of(c.at("r"));
    GradientTape tape;
    tape.watch(x);
    const Tensor out =
        name == "log_softmax" ? log_softmax(x) : activation(x, ops::activation_from_name(name));
    const Tensor loss = reduce_sum(multiply(out, r));
    expect_close(out, c.at("out"), name + " out");
    expect_close(tape.gradient(loss, x), c.at("grad_x"), name + " grad_x");
  }
  std::printf("activations: worst error %.3f of tolerance\n", worst_ratio);
}

std::shared_ptr<Loss> loss_of(const json& c) {
  return loss_from_config({.class_name = c.at("class").get<std::string>(),
                           .from_logits = c.value("from_logits", false),
                           .label_smoothing = c.value("label_smoothing", 0.0f)});
}

TEST(NnGoldenTest, LossesForwardAndBackward) {
  worst_ratio = 0;
  for (const json& c : golden().at("losses")) {
    const std::shared_ptr<Loss> loss_fn = loss_of(c);
    const std::string what = loss_fn->config_json() + " " + c.value("note", "");
    SCOPED_TRACE(what);
    const Tensor y_true = tensor_of(c.at("y_true"));
    Tensor y_pred = tensor_of(c.at("y_pred"));
    GradientTape tape;
    tape.watch(y_pred);
    const Tensor loss = (*loss_fn)(y_true, y_pred);
    ASSERT_EQ(loss.rank(), 0) << what;
    expect_close(loss.item(), c.at("loss").get<double>(), what + " loss");
    expect_close(tape.gradient(loss, y_pred), c.at("grad_y_pred"), what + " grad_y_pred");
  }
  std::printf("losses: worst error %.3f of tolerance\n", worst_ratio);
}

}  // namespace
}  // namespace dtrain::nn
