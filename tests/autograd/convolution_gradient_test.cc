// Finite-difference checks of the differentiable convolutions and pools
// (dtrain/autograd/convolution.h): every padding, strides, dilations, groups, both layouts; and
// forward and backward against PyTorch goldens (tools/golden/gen_conv_golden.py writes
// tests/golden/conv_golden.json; 1e-5 relative plus 1e-6 absolute).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "dtrain/autograd/convolution.h"
#include "testutil/golden.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using ops::Activation;
using ops::Padding;
using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;
constexpr double kTol = 2e-2;

ConvAttrsPtr attrs(Padding p, int64_t sh, int64_t sw, int64_t dh = 1, int64_t dw = 1,
                   int64_t groups = 1) {
  return std::make_shared<ops::Conv2DAttrs>(
      ops::Conv2DAttrs{.strides = {sh, sw}, .dilation = {dh, dw}, .padding = p, .groups = groups});
}

PoolAttrsPtr pool(Padding p, int64_t ph, int64_t pw, int64_t sh, int64_t sw) {
  return std::make_shared<ops::Pool2DAttrs>(
      ops::Pool2DAttrs{.pool = {ph, pw}, .strides = {sh, sw}, .padding = p});
}

// Moves values away from 0 so that relu is differentiable at every perturbed point.
Tensor away_from_zero(Tensor t) {
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    float& v = t.data<float>()[i];
    if (std::fabs(v) < 0.1f) v = v < 0 ? -0.3f : 0.3f;
  }
  return t;
}

TEST(ConvGradCheck, Conv2DPaddingsStridesDilations) {
  struct Case {
    Padding p;
    int64_t sh, sw, dh, dw, kh, kw, h, w;
  };
  const Case cases[] = {
      {Padding::kValid, 1, 1, 1, 1, 3, 3, 5, 6}, {Padding::kSame, 1, 1, 1, 1, 3, 3, 5, 6},
      {Padding::kValid, 2, 2, 1, 1, 3, 3, 7, 6}, {Padding::kSame, 2, 2, 1, 1, 3, 3, 7, 6},
      {Padding::kSame, 2, 1, 1, 1, 2, 2, 5, 4},  {Padding::kValid, 1, 1, 2, 2, 2, 3, 6, 7},
      {Padding::kSame, 1, 1, 2, 1, 3, 2, 5, 5},  {Padding::kSame, 3, 2, 1, 1, 4, 3, 7, 5},
      {Padding::kValid, 1, 1, 1, 1, 1, 1, 3, 3},
  };
  int seed = 1;
  for (const Case& c : cases) {
    const Tensor x = random_tensor(Shape{2, c.h, c.w, 3}, seed++);
    const Tensor k = random_tensor(Shape{c.kh, c.kw, 3, 4}, seed++);
    const Tensor b = random_tensor(Shape{4}, seed++);
    const ConvAttrsPtr a = attrs(c.p, c.sh, c.sw, c.dh, c.dw);
    EXPECT_LT(gradcheck([&](const Inputs& v) { return conv2d(v[0], v[1], v[2], a); }, {x, k, b}),
              kTol)
        << ops::padding_name(c.p) << " strides " << c.sh << "x" << c.sw << " dilation " << c.dh
        << "x" << c.dw << " kernel " << c.kh << "x" << c.kw;
  }
}

TEST(ConvGradCheck, Conv2DGroupsAndFusedRelu) {
  const Tensor x = random_tensor(Shape{2, 5, 5, 4}, 31);
  const Tensor k = random_tensor(Shape{3, 3, 2, 6}, 32);
  const Tensor b = random_tensor(Shape{6}, 33);
  for (Padding p : {Padding::kValid, Padding::kSame}) {
    const ConvAttrsPtr a = attrs(p, 1, 2, 1, 1, 2);
    EXPECT_LT(gradcheck([&](const Inputs& v) { return conv2d(v[0], v[1], v[2], a); }, {x, k, b}),
              kTol);
  }
  // relu fused: compare against points where it is differentiable (the output away from 0 is
  // not guaranteed, so check linear-equivalent tanh instead, which is smooth).
  const ConvAttrsPtr a = attrs(Padding::kSame, 1, 1);
  const Tensor k2 = random_tensor(Shape{3, 3, 4, 3}, 34);
  const Tensor b2 = random_tensor(Shape{3}, 35);
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return conv2d(v[0], v[1], v[2], a, Activation::kTanh); },
                {x, k2, b2}),
      kTol);
}

// Every smooth fused activation, including those whose derivative needs the pre-activation
// (gelu, swish: the convolution then keeps it), on conv2d, depthwise_conv2d, conv2d_transpose.
TEST(ConvGradCheck, FusedActivationsOfEveryKind) {
  const Tensor x = random_tensor(Shape{2, 4, 4, 2}, 61);
  const Tensor k = random_tensor(Shape{2, 2, 2, 3}, 62);
  const Tensor kd = random_tensor(Shape{2, 2, 2, 2}, 64);
  const Tensor kt = random_tensor(Shape{2, 2, 3, 2}, 65);
  const Tensor b = random_tensor(Shape{3}, 63);
  const Tensor bd = random_tensor(Shape{4}, 66);
  const ConvAttrsPtr a = attrs(Padding::kSame, 1, 1);
  const ConvAttrsPtr depthwise = attrs(Padding::kSame, 1, 1, 1, 1, 2);
  for (Activation act : {Activation::kSigmoid, Activation::kTanh, Activation::kSoftmax,
                         Activation::kGelu, Activation::kGeluTanh, Activation::kSwish,
                         Activation::kSoftplus, Activation::kSoftsign, Activation::kLogSoftmax}) {
    const std::string name = ops::activation_name(act);
    EXPECT_LT(
        gradcheck([&](const Inputs& v) { return conv2d(v[0], v[1], v[2], a, act); }, {x, k, b}),
        kTol)
        << "conv2d " << name;
    EXPECT_LT(
        gradcheck(
            [&](const Inputs& v) { return depthwise_conv2d(v[0], v[1], v[2], depthwise, act); },
            {x, kd, bd}),
        kTol)
        << "depthwise_conv2d " << name;
    EXPECT_LT(gradcheck([&](const Inputs& v) { return conv2d_transpose(v[0], v[1], v[2], a, act); },
                        {x, kt, b}),
              kTol)
        << "conv2d_transpose " << name;
  }
}

TEST(ConvGradCheck, Conv2DWithoutBias) {
  const Tensor x = random_tensor(Shape{1, 4, 4, 2}, 41);
  const Tensor k = random_tensor(Shape{2, 2, 2, 3}, 42);
  const ConvAttrsPtr a = attrs(Padding::kSame, 1, 1);
  EXPECT_LT(gradcheck([&](const Inputs& v) { return conv2d(v[0], v[1], Tensor(), a); }, {x, k}),
            kTol);
}

TEST(ConvGradCheck, Conv1DPaddingsStridesDilationsGroups) {
  const Tensor x = random_tensor(Shape{2, 9, 4}, 51);
  for (Padding p : {Padding::kValid, Padding::kSame, Padding::kCausal}) {
    for (int64_t s : {1, 2}) {
      for (int64_t d : {1, 2}) {
        for (int64_t g : {1, 2}) {
          const Tensor k = random_tensor(Shape{3, 4 / g, 4}, 52 + s + d + g);
          const Tensor b = random_tensor(Shape{4}, 53);
          const ConvAttrsPtr a = attrs(p, 1, s, 1, d, g);
          EXPECT_LT(
              gradcheck([&](const Inputs& v) { return conv1d(v[0], v[1], v[2], a); }, {x, k, b}),
              kTol)
              << ops::padding_name(p) << " stride " << s << " dilation " << d << " groups " << g;
        }
      }
    }
  }
}

TEST(ConvGradCheck, DepthwiseConv2D) {
  const Tensor x = random_tensor(Shape{2, 6, 5, 3}, 61);
  const Tensor k = random_tensor(Shape{3, 3, 3, 2}, 62);
  const Tensor b = random_tensor(Shape{6}, 63);
  for (Padding p : {Padding::kValid, Padding::kSame}) {
    for (int64_t s : {1, 2}) {
      const ConvAttrsPtr a = attrs(p, s, s, 1, 1, 3);
      EXPECT_LT(gradcheck([&](const Inputs& v) { return depthwise_conv2d(v[0], v[1], v[2], a); },
                          {x, k, b}),
                kTol)
          << ops::padding_name(p) << " stride " << s;
    }
  }
  const ConvAttrsPtr dil = attrs(Padding::kSame, 1, 1, 2, 2, 3);
  EXPECT_LT(gradcheck([&](const Inputs& v) { return depthwise_conv2d(v[0], v[1], v[2], dil); },
                      {x, k, b}),
            kTol);
}

TEST(ConvGradCheck, Conv2DTranspose) {
  const Tensor x = random_tensor(Shape{2, 3, 4, 3}, 71);
  const Tensor k = random_tensor(Shape{3, 3, 2, 3}, 72);  // [kh, kw, filters, in]
  const Tensor b = random_tensor(Shape{2}, 73);
  for (Padding p : {Padding::kValid, Padding::kSame}) {
    for (int64_t s : {1, 2}) {
      for (int64_t d : {1, 2}) {
        if (s > 1 && d > 1) continue;  // Keras refuses strides > 1 with dilation > 1
        const ConvAttrsPtr a = attrs(p, s, s, d, d);
        EXPECT_LT(gradcheck([&](const Inputs& v) { return conv2d_transpose(v[0], v[1], v[2], a); },
                            {x, k, b}),
                  kTol)
            << ops::padding_name(p) << " stride " << s << " dilation " << d;
      }
    }
  }
}

TEST(ConvGradCheck, Pooling) {
  // Distinct values, spaced wider than the finite-difference step, so max has no near-ties.
  Tensor x(Shape{2, 5, 7, 3});
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    x.data<float>()[i] = static_cast<float>((i * 37) % x.num_elements()) * 0.05f;
  }
  for (Padding p : {Padding::kValid, Padding::kSame}) {
    for (auto [ph, pw, sh, sw] :
         {std::array<int64_t, 4>{2, 2, 2, 2}, {3, 3, 2, 2}, {2, 3, 1, 2}, {3, 2, 3, 1}}) {
      const PoolAttrsPtr a = pool(p, ph, pw, sh, sw);
      EXPECT_LT(gradcheck([&](const Inputs& v) { return max_pool2d(v[0], a); }, {x}), kTol)
          << "max " << ops::padding_name(p) << " pool " << ph << "x" << pw;
      EXPECT_LT(gradcheck([&](const Inputs& v) { return avg_pool2d(v[0], a); }, {x}), kTol)
          << "avg " << ops::padding_name(p) << " pool " << ph << "x" << pw;
    }
  }
  EXPECT_LT(gradcheck([](const Inputs& v) { return global_max_pool(v[0]); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return global_avg_pool(v[0]); }, {x}), kTol);
  const Tensor x3 = random_tensor(Shape{2, 6, 3}, 81);
  EXPECT_LT(gradcheck([](const Inputs& v) { return global_avg_pool(v[0]); }, {x3}), kTol);
}

TEST(ConvGradCheck, ChannelsFirstRoundTrip) {
  const Tensor x = random_tensor(Shape{2, 3, 4, 5}, 91);  // NCHW
  const Tensor k = random_tensor(Shape{3, 3, 3, 2}, 92);
  const ConvAttrsPtr a = attrs(Padding::kSame, 2, 1);
  EXPECT_LT(gradcheck(
                [&](const Inputs& v) {
                  return to_channels_first(conv2d(to_channels_last(v[0]), v[1], Tensor(), a));
                },
                {x, k}),
            kTol);
  const Tensor back = ops::to_channels_first(ops::to_channels_last(x));
  EXPECT_TRUE(back.equals(x));
  EXPECT_EQ(ops::to_channels_last(x).shape(), (Shape{2, 4, 5, 3}));
}

TEST(ConvGradCheck, FusedReluAwayFromKinks) {
  // A 1×1 kernel of ones on inputs away from 0: relu's kink is never crossed by the step.
  const Tensor x = away_from_zero(random_tensor(Shape{1, 3, 3, 1}, 101));
  Tensor k = Tensor::ones(Shape{1, 1, 1, 2});
  const ConvAttrsPtr a = attrs(Padding::kValid, 1, 1);
  EXPECT_LT(
      gradcheck([&](const Inputs& v) { return conv2d(v[0], k, Tensor(), a, Activation::kRelu); },
                {x}),
      kTol);
}

// ---------------------------------------------------------------------------------------------
// PyTorch goldens.

using nlohmann::json;

const json& golden() { return testutil::golden_file("conv_golden.json"); }
Tensor tensor_of(const json& t) { return testutil::golden_tensor(t); }
void expect_close(const Tensor& actual, const json& expected, const std::string& what) {
  testutil::expect_close_to_golden(actual, expected, what);
}

std::vector<int64_t> ints(const json& c, const char* key) {
  return c.at(key).get<std::vector<int64_t>>();
}

TEST(ConvGolden, ForwardAndBackwardMatchPyTorch) {
  const json& cases = golden().at("cases");
  ASSERT_GE(cases.size(), 40u);
  int index = 0;
  for (const json& c : cases) {
    const std::string op = c.at("op").get<std::string>();
    const std::string what = op + " #" + std::to_string(index++) + " " + c.value("padding", "");
    std::vector<Tensor> in{tensor_of(c.at("x"))};
    const bool has_w = c.contains("w"), has_b = c.contains("b");
    if (has_w) in.push_back(tensor_of(c.at("w")));
    if (has_b) in.push_back(tensor_of(c.at("b")));
    std::function<Tensor(const std::vector<Tensor>&)> f;
    if (has_w) {
      const auto s = ints(c, "strides"), d = ints(c, "dilation");
      const ConvAttrsPtr a = std::make_shared<ops::Conv2DAttrs>(ops::Conv2DAttrs{
          .strides = {s[0], s[1]},
          .dilation = {d[0], d[1]},
          .padding = ops::padding_from_name(c.at("padding").get<std::string>(), what),
          .groups = c.at("groups").get<int64_t>()});
      f = [op, a, has_b](const std::vector<Tensor>& v) {
        const Tensor b = has_b ? v[2] : Tensor();
        if (op == "conv2d") return conv2d(v[0], v[1], b, a);
        if (op == "conv1d") return conv1d(v[0], v[1], b, a);
        if (op == "depthwise_conv2d") return depthwise_conv2d(v[0], v[1], b, a);
        return conv2d_transpose(v[0], v[1], b, a);
      };
    } else if (op == "max_pool2d" || op == "avg_pool2d") {
      const auto p = ints(c, "pool"), s = ints(c, "strides");
      const PoolAttrsPtr a = std::make_shared<ops::Pool2DAttrs>(ops::Pool2DAttrs{
          .pool = {p[0], p[1]},
          .strides = {s[0], s[1]},
          .padding = ops::padding_from_name(c.at("padding").get<std::string>(), what)});
      f = [op, a](const std::vector<Tensor>& v) {
        return op == "max_pool2d" ? max_pool2d(v[0], a) : avg_pool2d(v[0], a);
      };
    } else {
      f = [op](const std::vector<Tensor>& v) {
        return op == "global_max_pool" ? global_max_pool(v[0]) : global_avg_pool(v[0]);
      };
    }
    GradientTape tape;
    for (auto& x : in) tape.watch(x);
    const Tensor y = f(in);
    expect_close(y, c.at("y"), what + " y");
    const Tensor loss = reduce_sum(multiply(y, tensor_of(c.at("r"))));
    const std::vector<Tensor> grads = tape.gradient(loss, in);
    expect_close(grads[0], c.at("dx"), what + " dx");
    if (has_w) expect_close(grads[1], c.at("dw"), what + " dw");
    if (has_b) expect_close(grads[2], c.at("db"), what + " db");
  }
}

}  // namespace
}  // namespace dtrain
