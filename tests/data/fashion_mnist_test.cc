// Reads the real Fashion-MNIST files from Debian's dataset-fashion-mnist package. The expected
// values below were checked independently with Python's gzip module on those files.
#include "dtrain/data/fashion_mnist.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

namespace dtrain::data {
namespace {

bool have_data() {
  return std::filesystem::exists(std::string(fashion_mnist::kDefaultDir) +
                                 "/train-images-idx3-ubyte.gz");
}

TEST(FashionMnist, LoadsKerasShapesAndValues) {
  if (!have_data()) GTEST_SKIP() << "apt-get install dataset-fashion-mnist";
  const FashionMnist d = fashion_mnist::load_data();
  EXPECT_EQ(d.x_train.dtype(), DType::kFloat32);
  EXPECT_EQ(d.x_train.shape(), (Shape{60000, 28, 28}));
  EXPECT_EQ(d.y_train.dtype(), DType::kUInt8);
  EXPECT_EQ(d.y_train.shape(), (Shape{60000}));
  EXPECT_EQ(d.x_test.shape(), (Shape{10000, 28, 28}));
  EXPECT_EQ(d.y_test.shape(), (Shape{10000}));

  // First labels: train 9 0 0 3 0 2 ..., test 9 2 1 1 6 ...
  const uint8_t* ytr = d.y_train.data<uint8_t>();
  const uint8_t* yte = d.y_test.data<uint8_t>();
  EXPECT_EQ(ytr[0], 9);
  EXPECT_EQ(ytr[3], 3);
  EXPECT_EQ(ytr[5], 2);
  EXPECT_EQ(yte[0], 9);
  EXPECT_EQ(yte[1], 2);
  EXPECT_EQ(yte[4], 6);
  int64_t counts[10] = {};
  for (int64_t i = 0; i < 60000; ++i) {
    ASSERT_LT(ytr[i], 10);
    ++counts[ytr[i]];
  }
  for (int64_t c : counts) EXPECT_EQ(c, 6000);  // Fashion-MNIST is balanced
  for (int64_t i = 0; i < 10000; ++i) ASSERT_LT(yte[i], 10);

  for (const Tensor* x : {&d.x_train, &d.x_test}) {
    const float* p = x->data<float>();
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < x->num_elements(); ++i) {
      lo = std::min(lo, p[i]);
      hi = std::max(hi, p[i]);
    }
    EXPECT_EQ(lo, 0.0f);
    EXPECT_EQ(hi, 1.0f);
  }
  // The first training image's pixels sum to 76247 (out of 255 each).
  double sum = 0;
  for (int64_t i = 0; i < 784; ++i) sum += d.x_train.data<float>()[i] * 255.0;
  EXPECT_NEAR(sum, 76247.0, 1e-2);
  // Every value is exactly float32(k / 255.0) for an integer k, as NumPy computes it.
  for (int64_t i = 0; i < 784; ++i) {
    const float v = d.x_train.data<float>()[i];
    const double k = std::round(static_cast<double>(v) * 255.0);
    EXPECT_EQ(v, static_cast<float>(k / 255.0));
  }
}

TEST(FashionMnist, MissingDirectoryExplainsHowToInstall) {
  try {
    fashion_mnist::load_data("/nonexistent/fashion");
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("/nonexistent/fashion/train-images-idx3-ubyte"), std::string::npos) << msg;
    EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace dtrain::data
