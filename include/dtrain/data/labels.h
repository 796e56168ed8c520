// Checks on the class labels that sparse categorical losses read: every label must be an
// integer class index, and the classes a data set implies must be a number a model can have.
// Labels come from untrusted files (CSV columns, IDX files), so errors name where they came
// from and the row. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

// The most classes a data set may imply (largest label + 1); more is a corrupt label, not a
// model anyone trains on a CPU (ImageNet-21k has 21,841 classes).
inline constexpr int64_t kMaxClasses = int64_t{1} << 16;

// Checks that every element of `labels` (any integer or float dtype, any shape, read row-major)
// is an integer in [0, max_classes) and returns the number of classes they imply (the largest
// label + 1; 0 for no labels). Throws InvalidArgumentError "<source>: row R: label 2.5 is not
// an integer class index" (R counts from 1) for a fractional, NaN, infinite, negative or too
// large label, and for a dtype that cannot hold labels (string, bool).
int64_t check_class_labels(const Tensor& labels, const std::string& source,
                           int64_t max_classes = kMaxClasses);

}  // namespace dtrain::data
