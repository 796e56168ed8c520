// `dtrain fit|evaluate|predict --model x.keras`, `fit --save x.keras` and `dtrain ckpt
// inspect|verify|convert` with Keras 3 archives, run as a user would on Fashion-MNIST (the Debian
// package's files).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "testutil/run_dtrain.h"

namespace {

using dtrain::testutil::contains;
using dtrain::testutil::run_dtrain;

class Keras3Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dtrain_keras3_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The "test_accuracy: ... - test_loss: ..." line of an output.
  static std::string test_line(const std::string& out) {
    const size_t at = out.rfind("test_accuracy:");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  }
  std::string dir_;
};

TEST_F(Keras3Cli, FitSavesDotKerasThatEvaluatePredictAndFitLoad) {
  const auto fit =
      run_dtrain("fit --epochs 1 --steps-per-epoch 40 --verbose 0 --save " + path("m.keras"));
  ASSERT_EQ(fit.code, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "saved " + path("m.keras"))) << fit.output;
  std::ifstream in(path("m.keras"), std::ios::binary);
  char sig[2] = {};
  in.read(sig, 2);
  EXPECT_EQ(std::string(sig, 2), "PK");  // a zip, as Keras 3 writes .keras

  const auto eval = run_dtrain("evaluate --model " + path("m.keras"));
  ASSERT_EQ(eval.code, 0) << eval.output;
  ASSERT_FALSE(test_line(fit.output).empty()) << fit.output;
  EXPECT_EQ(test_line(eval.output), test_line(fit.output));

  const auto predict = run_dtrain("predict --count 3 --model " + path("m.keras"));
  ASSERT_EQ(predict.code, 0) << predict.output;
  EXPECT_TRUE(contains(predict.output, "2: predicted")) << predict.output;

  // Fit continues from the saved optimizer state and saves again.
  const auto more = run_dtrain("fit --epochs 1 --steps-per-epoch 40 --verbose 0 --model " +
                               path("m.keras") + " --save " + path("m2.keras"));
  ASSERT_EQ(more.code, 0) << more.output;
  const auto inspect = run_dtrain("ckpt inspect " + path("m2.keras"));
  ASSERT_EQ(inspect.code, 0) << inspect.output;
  EXPECT_TRUE(contains(inspect.output, "layers/dense/vars/0")) << inspect.output;
  EXPECT_TRUE(contains(inspect.output, "optimizer/vars/0       int64")) << inspect.output;
  const auto verify = run_dtrain("ckpt verify " + path("m2.keras"));
  EXPECT_EQ(verify.code, 0) << verify.output;
}

TEST_F(Keras3Cli, ConvertRoundTripsADotKerasThroughACheckpoint) {
  ASSERT_EQ(
      run_dtrain("fit --epochs 1 --steps-per-epoch 20 --verbose 0 --save " + path("a.keras")).code,
      0);
  const auto to_ckpt = run_dtrain("ckpt convert " + path("a.keras") + " " + path("ckpt/a"));
  ASSERT_EQ(to_ckpt.code, 0) << to_ckpt.output;
  EXPECT_TRUE(contains(to_ckpt.output, "model and optimizer")) << to_ckpt.output;
  const auto back = run_dtrain("ckpt convert " + path("ckpt/a") + " " + path("b.keras") +
                               " --model " + path("a.keras"));
  ASSERT_EQ(back.code, 0) << back.output;
  const auto ea = run_dtrain("evaluate --model " + path("a.keras"));
  const auto eb = run_dtrain("evaluate --model " + path("b.keras"));
  ASSERT_EQ(eb.code, 0) << eb.output;
  EXPECT_FALSE(test_line(ea.output).empty()) << ea.output;
  EXPECT_EQ(test_line(ea.output), test_line(eb.output));
}

TEST_F(Keras3Cli, ABrokenDotKerasIsAClearError) {
  {
    std::ofstream out(path("bad.keras"));
    out << "PK\x03\x04 truncated";
  }
  const auto r = run_dtrain("evaluate --model " + path("bad.keras"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "DATA_LOSS")) << r.output;
  EXPECT_TRUE(contains(r.output, "bad.keras")) << r.output;
  const auto v = run_dtrain("ckpt verify " + path("bad.keras"));
  EXPECT_NE(v.code, 0);
  EXPECT_TRUE(contains(v.output, "bad.keras")) << v.output;
}

}  // namespace
