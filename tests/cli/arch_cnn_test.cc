// dtrain fit|evaluate --arch cnn, run as a user would: the built-in CNN trains on Fashion-MNIST
// (images get their channel axis), saves to .h5, and the saved CNN evaluates; images too small
// for it fail with an error naming the layer.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "testutil/idx_files.h"
#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

using dtrain::testutil::contains;
using dtrain::testutil::run_dtrain;

TEST(ArchCnn, FitsSavesAndEvaluates) {
  dtrain::testutil::TempDir dir("arch_cnn");
  const std::string h5 = dir.path() + "/cnn.h5";
  const auto fit = run_dtrain(
      "fit --arch cnn --epochs 1 --steps-per-epoch 4 --batch-size 64 --seed 1 --verbose 1 --save " +
      h5);
  ASSERT_EQ(fit.code, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "conv2d_1 (Conv2D)")) << fit.output;
  EXPECT_TRUE(contains(fit.output, "(None, 5, 5, 64)")) << fit.output;
  ASSERT_TRUE(std::filesystem::exists(h5));
  const auto eval = run_dtrain("evaluate --model " + h5 + " --batch-size 500");
  ASSERT_EQ(eval.code, 0) << eval.output;
  EXPECT_TRUE(contains(eval.output, "test_accuracy")) << eval.output;
}

TEST(ArchCnn, ImagesTooSmallNameTheLayer) {
  dtrain::testutil::TempDir dir("arch_cnn_small");
  dtrain::testutil::write_small_idx(dir.path(), 8);  // 4x4 images: conv2d_1 does not fit
  const auto r = run_dtrain("fit --arch cnn --epochs 1 --train-images " + dir.path() +
                            "/x.idx --train-labels " + dir.path() + "/y.idx");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "Conv2D 'conv2d_1'")) << r.output;
  EXPECT_TRUE(contains(r.output, "larger than the input")) << r.output;
}

}  // namespace
