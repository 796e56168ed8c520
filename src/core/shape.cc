// Shape: inline dimension storage.
#include "dtrain/core/shape.h"

#include "dtrain/core/error.h"

namespace dtrain {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  DTRAIN_CHECK(dims.size() <= static_cast<size_t>(kMaxRank), "Shape: rank ", dims.size(),
               " exceeds the maximum of ", kMaxRank);
  for (int64_t d : dims) {
    DTRAIN_CHECK(d >= 0, "Shape: negative dimension ", d);
    dims_[rank_++] = d;
  }
}

int64_t Shape::dim(int i) const {
  int j = i < 0 ? i + rank_ : i;
  DTRAIN_CHECK(j >= 0 && j < rank_, "Shape: dimension ", i, " out of range for shape ",
               to_string());
  return dims_[j];
}

int64_t Shape::num_elements() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    // A product past int64 (a corrupt or absurd config's dimensions) would size a buffer wrongly.
    if (__builtin_mul_overflow(n, dims_[i], &n)) {
      throw InvalidArgumentError(
          str_cat("Shape ", to_string(), ": the number of elements does not fit in 64 bits"));
    }
  }
  return n;
}

void Shape::push_back(int64_t d) {
  DTRAIN_CHECK(rank_ < kMaxRank, "Shape: rank exceeds the maximum of ", kMaxRank);
  DTRAIN_CHECK(d >= 0, "Shape: negative dimension ", d);
  dims_[rank_++] = d;
}

Shape Shape::without_first() const {
  DTRAIN_CHECK(rank_ > 0, "Shape: a scalar has no first dimension");
  return Shape(std::span<const int64_t>(dims_ + 1, rank_ - 1));
}

Shape Shape::with_first(int64_t n) const {
  Shape s;
  s.push_back(n);
  for (int i = 0; i < rank_; ++i) s.push_back(dims_[i]);
  return s;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[i] != o.dims_[i]) return false;
  }
  return true;
}

}  // namespace dtrain
