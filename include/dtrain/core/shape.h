// Tensor shapes with inline storage (no heap allocation), up to kMaxRank dimensions.
// A value type; thread-compatible.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace dtrain {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims) : Shape(std::span<const int64_t>(dims)) {}

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  // Dimension i, where a negative i counts from the end (-1 is the last); throws if out of range.
  int64_t dim(int i) const;
  // Product of the dimensions; 1 for a scalar.
  int64_t num_elements() const;
  // Throws InvalidArgumentError past kMaxRank.
  void push_back(int64_t d);
  const int64_t* begin() const { return dims_; }
  const int64_t* end() const { return dims_ + rank_; }
  std::vector<int64_t> to_vector() const { return std::vector<int64_t>(begin(), end()); }
  // The shape without its first dimension (the shape of one element of a batch).
  Shape without_first() const;
  // [n] + this.
  Shape with_first(int64_t n) const;
  // "[64, 784]"; a scalar prints "[]".
  std::string to_string() const;

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }

 private:
  int64_t dims_[kMaxRank] = {};
  int rank_ = 0;
};

}  // namespace dtrain
