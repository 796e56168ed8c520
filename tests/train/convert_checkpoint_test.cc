// train::convert_checkpoint on the Keras 2.12 MNIST fixture: .h5 → TF checkpoint → .h5 keeps every
// weight and the optimizer state bit for bit, a checkpoint without an optimizer converts to an
// .h5 without optimizer state, and an existing destination is refused unless overwrite is set.
#include "dtrain/train/convert_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;
using testutil::expect_throws_with;

const std::string kMnistH5 = "../shared/fixtures/keras_h5/mnist_mlp_keras212/mnist_model.h5";

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

class ConvertCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_convert_checkpoint_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ConvertCheckpointTest, H5ToCheckpointAndBackKeepsEveryWeight) {
  const ConvertCheckpointResult a = convert_checkpoint(kMnistH5, dir_ + "/mnist");
  EXPECT_EQ(a.source, kMnistH5);
  EXPECT_TRUE(a.optimizer);
  EXPECT_EQ(a.tensors, 13u);  // 4 weights, 8 slots, iter (write() saves no save_counter)
  EXPECT_TRUE(a.warnings.empty());
  // The .index names the prefix as well.
  const ConvertCheckpointResult b =
      convert_checkpoint(dir_ + "/mnist.index", dir_ + "/back.h5", {.model = kMnistH5});
  EXPECT_EQ(b.source, dir_ + "/mnist");
  EXPECT_TRUE(b.optimizer);
  EXPECT_EQ(b.restored, 13u);
  const checkpoint::KerasH5Contents before = checkpoint::read_keras_h5(kMnistH5);
  const checkpoint::KerasH5Contents after = checkpoint::read_keras_h5(dir_ + "/back.h5");
  ASSERT_EQ(after.layers.size(), before.layers.size());
  for (size_t l = 0; l < before.layers.size(); ++l) {
    ASSERT_EQ(after.layers[l].weights.size(), before.layers[l].weights.size());
    for (size_t w = 0; w < before.layers[l].weights.size(); ++w) {
      EXPECT_TRUE(after.layers[l].weights[w].value.equals(before.layers[l].weights[w].value))
          << before.layers[l].weights[w].name;
    }
  }
  ASSERT_EQ(after.optimizer_weights.size(), before.optimizer_weights.size());
  for (size_t i = 0; i < before.optimizer_weights.size(); ++i) {
    EXPECT_TRUE(after.optimizer_weights[i].value.equals(before.optimizer_weights[i].value))
        << before.optimizer_weights[i].name;
  }
}

TEST_F(ConvertCheckpointTest, WithoutAnOptimizerNodeTheH5HasNoOptimizerState) {
  convert_checkpoint(kMnistH5, dir_ + "/weights", {.skip_optimizer = true});
  // No optimizer node: the .h5 is written without optimizer state, silently.
  const ConvertCheckpointResult r =
      convert_checkpoint(dir_ + "/weights", dir_ + "/w.h5", {.model = kMnistH5});
  EXPECT_FALSE(r.optimizer);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_TRUE(checkpoint::read_keras_h5(dir_ + "/w.h5").optimizer_weights.empty());
  expect_throws_with<InvalidArgumentError>(
      [&] { convert_checkpoint(dir_ + "/weights", dir_ + "/x.h5"); }, {"pass --model"});
  EXPECT_FALSE(fs::exists(dir_ + "/x.h5"));
}

TEST_F(ConvertCheckpointTest, AnExistingDestinationIsRefusedUnlessOverwrite) {
  convert_checkpoint(kMnistH5, dir_ + "/ckpt");
  const std::string index = read_bytes(checkpoint::index_filename(dir_ + "/ckpt"));
  expect_throws_with<FailedPreconditionError>(
      [&] { convert_checkpoint(kMnistH5, dir_ + "/ckpt", {.skip_optimizer = true}); },
      {dir_ + "/ckpt", "existing checkpoint", "--overwrite"});
  EXPECT_TRUE(read_bytes(checkpoint::index_filename(dir_ + "/ckpt")) == index);
  const ConvertCheckpointResult o =
      convert_checkpoint(kMnistH5, dir_ + "/ckpt", {.skip_optimizer = true, .overwrite = true});
  EXPECT_FALSE(o.optimizer);
  EXPECT_FALSE(checkpoint::BundleReader(dir_ + "/ckpt")
                   .contains("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"));

  const std::string h5 = dir_ + "/m.h5";
  std::ofstream(h5) << "not mine to replace";
  expect_throws_with<FailedPreconditionError>(
      [&] { convert_checkpoint(dir_ + "/ckpt", h5, {.model = kMnistH5}); },
      {h5, "already exists", "--overwrite"});
  EXPECT_EQ(read_bytes(h5), "not mine to replace");
  convert_checkpoint(dir_ + "/ckpt", h5, {.model = kMnistH5, .overwrite = true});
  EXPECT_EQ(checkpoint::read_keras_h5(h5).layers.size(),
            checkpoint::read_keras_h5(kMnistH5).layers.size());
}

}  // namespace
}  // namespace dtrain::train
