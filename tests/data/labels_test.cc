// data::check_class_labels: integer class indices of every dtype pass and give the class count;
// fractional, NaN, negative and absurdly large labels are errors naming the source and the row.
#include "dtrain/data/labels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dtrain/core/error.h"

namespace dtrain::data {
namespace {

std::string error_of(const Tensor& labels) {
  try {
    check_class_labels(labels, "train.csv");
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ClassLabels, IntegerLabelsOfEveryDtypeGiveTheClassCount) {
  EXPECT_EQ(check_class_labels(Tensor::from_vector<uint8_t>({0, 9, 3}, {3}), "x"), 10);
  EXPECT_EQ(check_class_labels(Tensor::from_vector<int64_t>({4, 0}, {2}), "x"), 5);
  EXPECT_EQ(check_class_labels(Tensor::from_vector<int32_t>({1}, {1}), "x"), 2);
  // Integral floats are class indices too (Keras casts them).
  EXPECT_EQ(check_class_labels(Tensor::from_vector<float>({2.0f, 1.0f}, {2}), "x"), 3);
  EXPECT_EQ(check_class_labels(Tensor::from_vector<double>({6.0}, {1}), "x"), 7);
  EXPECT_EQ(check_class_labels(Tensor::from_vector<float>({}, {0}), "x"), 0);
}

TEST(ClassLabels, NonIntegerLabelsNameTheSourceAndTheRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(error_of(Tensor::from_vector<float>({1, 2.5f}, {2})),
            "train.csv: row 2: label 2.5 is not an integer class index");
  EXPECT_EQ(error_of(Tensor::from_vector<float>({nan}, {1})),
            "train.csv: row 1: label nan is not an integer class index");
  EXPECT_EQ(error_of(Tensor::from_vector<double>({0, 0, inf}, {3})),
            "train.csv: row 3: label inf is not an integer class index");
  EXPECT_EQ(error_of(Tensor::from_vector<float>({-1}, {1})),
            "train.csv: row 1: label -1 is negative: class indices start at 0");
  EXPECT_EQ(error_of(Tensor::from_vector<int8_t>({3, -4}, {2})),
            "train.csv: row 2: label -4 is negative: class indices start at 0");
}

TEST(ClassLabels, AHugeLabelIsNotAClassCount) {
  EXPECT_EQ(error_of(Tensor::from_vector<float>({1, 3e9f}, {2})),
            "train.csv: row 2: label 3000000000 implies more than 65536 classes (the most "
            "dtrain accepts)");
  EXPECT_EQ(error_of(Tensor::from_vector<int64_t>({int64_t{1} << 40}, {1})),
            "train.csv: row 1: label 1099511627776 implies more than 65536 classes (the most "
            "dtrain accepts)");
  EXPECT_EQ(check_class_labels(Tensor::from_vector<int64_t>({65535}, {1}), "x"), 65536);
}

TEST(ClassLabels, StringLabelsAreRejected) {
  EXPECT_THROW(check_class_labels(Tensor(DType::kBool, Shape{2}), "y.idx"), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::data
