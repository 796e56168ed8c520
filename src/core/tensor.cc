// Tensor handles over reference-counted buffers from the caching allocator.
#include "dtrain/core/tensor.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "allocator.h"

namespace dtrain {

namespace {

// Throws unless a buffer of `shape` and `dtype` can be allocated at all: its byte count fits in
// 64 bits and in this machine's memory (a wrong size from a corrupt file or an absurd argument
// is a clear error, not an out-of-memory kill once the pages are touched).
void check_allocatable(DType dtype, const Shape& shape) {
  DTRAIN_CHECK(dtype != DType::kString && dtype != DType::kInvalid,
               "Tensor: cannot allocate a tensor of dtype ", dtype_name(dtype));
  const int64_t elements = shape.num_elements();  // throws past 64 bits
  int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(dtype_size(dtype)), &bytes)) {
    throw InvalidArgumentError(str_cat("Tensor: shape ", shape.to_string(), " of ",
                                       dtype_name(dtype), " has more than 2^63 bytes"));
  }
  static const int64_t memory = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
  }();
  if (bytes > memory) {
    throw ResourceExhaustedError(
        str_cat("Tensor: shape ", shape.to_string(), " of ", dtype_name(dtype), " needs ", bytes,
                " bytes, more than this machine's memory (", memory, " bytes)"));
  }
}

}  // namespace

Tensor::Tensor(DType dtype, const Shape& shape) : shape_(shape), dtype_(dtype) {
  check_allocatable(dtype, shape);
  header_ = detail::storage_allocate(nbytes());
  data_ = detail::storage_data(header_);
}

Tensor Tensor::with_huge_pages(DType dtype, const Shape& shape) {
  check_allocatable(dtype, shape);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  // Not populated: its pages come at first touch, as huge pages once advised below.
  t.header_ = detail::storage_allocate(t.nbytes(), /*populate=*/false);
  t.data_ = detail::storage_data(t.header_);
  constexpr uintptr_t kPage = 4096;
  if (t.nbytes() >= (size_t{4} << 20)) {
    // The whole pages inside the buffer; the advice is only a hint, so its failure (a kernel
    // without transparent huge pages) changes nothing but the page size.
    const auto begin = (reinterpret_cast<uintptr_t>(t.data_) + kPage - 1) & ~(kPage - 1);
    const auto end = (reinterpret_cast<uintptr_t>(t.data_) + t.nbytes()) & ~(kPage - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
  return t;
}

Tensor::Tensor(const Tensor& other)
    : header_(other.header_),
      data_(other.data_),
      shape_(other.shape_),
      dtype_(other.dtype_),
      tape_ref_(other.tape_ref_) {
  if (header_) header_->refcount.fetch_add(1, std::memory_order_relaxed);
}

Tensor::Tensor(Tensor&& other) noexcept
    : header_(other.header_),
      data_(other.data_),
      shape_(other.shape_),
      dtype_(other.dtype_),
      tape_ref_(other.tape_ref_) {
  other.header_ = nullptr;
  other.data_ = nullptr;
  other.tape_ref_ = {};
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) {
    if (other.header_) other.header_->refcount.fetch_add(1, std::memory_order_relaxed);
    release();
    header_ = other.header_;
    data_ = other.data_;
    shape_ = other.shape_;
    dtype_ = other.dtype_;
    tape_ref_ = other.tape_ref_;
  }
  return *this;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    header_ = other.header_;
    data_ = other.data_;
    shape_ = other.shape_;
    dtype_ = other.dtype_;
    tape_ref_ = other.tape_ref_;
    other.header_ = nullptr;
    other.data_ = nullptr;
    other.tape_ref_ = {};
  }
  return *this;
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
  if (header_ && header_->refcount.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    detail::storage_free(header_);
  }
  header_ = nullptr;
  data_ = nullptr;
}

long Tensor::use_count() const {
  return header_ ? header_->refcount.load(std::memory_order_relaxed) : 0;
}

void Tensor::check_dtype(DType expected) const {
  DTRAIN_CHECK(defined(), "Tensor: access to an undefined tensor");
  DTRAIN_CHECK(dtype_ == expected, "Tensor: element type is ", dtype_name(dtype_), ", accessed as ",
               dtype_name(expected));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t(dtype, shape);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }

Tensor Tensor::scalar(float value) { return full(Shape{}, value); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t(dtype, shape);
  t.fill(value);
  return t;
}

namespace {
template <class F>
void dispatch_numeric(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      f(float{});
      break;
    case DType::kFloat64:
      f(double{});
      break;
    case DType::kInt32:
      f(int32_t{});
      break;
    case DType::kInt64:
      f(int64_t{});
      break;
    case DType::kUInt8:
      f(uint8_t{});
      break;
    case DType::kInt8:
      f(int8_t{});
      break;
    case DType::kInt16:
      f(int16_t{});
      break;
    case DType::kUInt16:
      f(uint16_t{});
      break;
    case DType::kUInt32:
      f(uint32_t{});
      break;
    case DType::kUInt64:
      f(uint64_t{});
      break;
    case DType::kBool:
      f(bool{});
      break;
    default:
      throw InvalidArgumentError(str_cat("Tensor: no numeric access to dtype ", dtype_name(dtype)));
  }
}
}  // namespace

void Tensor::fill(double value) {
  dispatch_numeric(dtype_, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(static_cast<T*>(data_), num_elements(), static_cast<T>(value));
  });
}

double Tensor::item() const {
  DTRAIN_CHECK(defined() && num_elements() == 1, "Tensor::item: tensor of shape ",
               shape_.to_string(), " has ", defined() ? num_elements() : 0,
               " elements, expected exactly 1");
  double v = 0;
  dispatch_numeric(dtype_, [&](auto zero) {
    using T = decltype(zero);
    v = static_cast<double>(*static_cast<const T*>(data_));
  });
  return v;
}

template <class T>
Tensor Tensor::from_vector(std::span<const T> values, const Shape& shape) {
  DTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape.num_elements(),
               "Tensor::from_vector: ", values.size(), " values do not fill shape ",
               shape.to_string());
  Tensor t(dtype_of<T>, shape);
  if constexpr (std::is_same_v<T, bool>) {
    std::copy(values.begin(), values.end(), t.data<bool>());
  } else {
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

template Tensor Tensor::from_vector<float>(std::span<const float>, const Shape&);
template Tensor Tensor::from_vector<double>(std::span<const double>, const Shape&);
template Tensor Tensor::from_vector<int32_t>(std::span<const int32_t>, const Shape&);
template Tensor Tensor::from_vector<int64_t>(std::span<const int64_t>, const Shape&);
template Tensor Tensor::from_vector<uint8_t>(std::span<const uint8_t>, const Shape&);
template Tensor Tensor::from_vector<int8_t>(std::span<const int8_t>, const Shape&);
template Tensor Tensor::from_vector<int16_t>(std::span<const int16_t>, const Shape&);
template Tensor Tensor::from_vector<uint16_t>(std::span<const uint16_t>, const Shape&);
template Tensor Tensor::from_vector<uint32_t>(std::span<const uint32_t>, const Shape&);
template Tensor Tensor::from_vector<uint64_t>(std::span<const uint64_t>, const Shape&);
template Tensor Tensor::from_vector<bool>(std::span<const bool>, const Shape&);

Tensor Tensor::reshape(const Shape& shape) const {
  DTRAIN_CHECK(defined(), "Tensor::reshape: undefined tensor");
  DTRAIN_CHECK(shape.num_elements() == num_elements(), "Tensor::reshape: cannot reshape ",
               shape_.to_string(), " (", num_elements(), " elements) to ", shape.to_string());
  Tensor t(*this);
  t.shape_ = shape;
  t.tape_ref_ = {};
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  DTRAIN_CHECK(defined() && rank() >= 1, "Tensor::slice: needs a tensor of rank >= 1");
  DTRAIN_CHECK(0 <= begin && begin <= end && end <= shape_[0], "Tensor::slice: rows [", begin, ", ",
               end, ") out of range for shape ", shape_.to_string());
  Tensor t(*this);
  const int64_t row = num_elements() / std::max<int64_t>(shape_[0], 1);
  t.data_ = static_cast<char*>(data_) + begin * row * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  t.tape_ref_ = {};
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  DTRAIN_CHECK(defined() && rank() >= 1, "Tensor::operator[]: needs a tensor of rank >= 1");
  DTRAIN_CHECK(0 <= i && i < shape_[0], "Tensor::operator[]: index ", i, " out of range for shape ",
               shape_.to_string());
  Tensor t = slice(i, i + 1);
  t.shape_ = shape_.without_first();
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor t(dtype_, shape_);
  std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  DTRAIN_CHECK(defined() && src.defined(), "Tensor::copy_from: undefined tensor");
  DTRAIN_CHECK(dtype_ == src.dtype_ && num_elements() == src.num_elements(),
               "Tensor::copy_from: cannot copy ", dtype_name(src.dtype_), src.shape_.to_string(),
               " into ", dtype_name(dtype_), shape_.to_string());
  if (data_ != src.data_) std::memmove(data_, src.data_, nbytes());
}

bool Tensor::equals(const Tensor& other) const {
  if (defined() != other.defined()) return false;
  if (!defined()) return true;
  return dtype_ == other.dtype_ && shape_ == other.shape_ &&
         std::memcmp(data_, other.data_, nbytes()) == 0;
}

std::string Tensor::to_string(int64_t max_values) const {
  if (!defined()) return "Tensor<undefined>";
  std::ostringstream os;
  os << "Tensor<" << dtype_name(dtype_) << " " << shape_.to_string() << ">";
  if (num_elements() <= max_values && dtype_ != DType::kString) {
    os << " {";
    dispatch_numeric(dtype_, [&](auto zero) {
      using T = decltype(zero);
      const T* p = static_cast<const T*>(data_);
      for (int64_t i = 0; i < num_elements(); ++i) {
        if (i) os << ", ";
        if constexpr (sizeof(T) == 1) {
          os << static_cast<int>(p[i]);
        } else {
          os << p[i];
        }
      }
    });
    os << "}";
  }
  return os.str();
}

}  // namespace dtrain
