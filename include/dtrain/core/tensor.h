// Tensor: a dtype, a shape and a reference-counted, 64-byte aligned, contiguous buffer.
// Copying a Tensor shares the buffer (like tf.Tensor / torch.Tensor handles); clone() copies
// the data. Buffers come from a caching allocator, so steady-state training allocates no heap
// memory. A Tensor handle is thread-compatible; distinct handles to one buffer may be used
// from different threads as long as writes are synchronized by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "dtrain/core/dtype.h"
#include "dtrain/core/error.h"
#include "dtrain/core/shape.h"

namespace dtrain {

namespace detail {
struct StorageHeader;  // refcount + capacity, lives just before the data (src/core/allocator.cc)
}

// Which gradient tape recorded the op that produced a tensor, and at which node. Opaque to
// everything but the autograd layer; a default value means "not recorded".
struct TapeRef {
  uint64_t tape = 0;
  int32_t node = -1;
};

class Tensor {
 public:
  // An undefined tensor: no buffer; defined() is false.
  Tensor() = default;
  // An uninitialized tensor of the given dtype and shape. Throws for kString.
  Tensor(DType dtype, const Shape& shape);
  explicit Tensor(const Shape& shape) : Tensor(DType::kFloat32, shape) {}

  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  // An uninitialized tensor for a large buffer that lives long and that processes forked from
  // this one read (a data set): its pages are transparent huge pages where the kernel allows
  // them (madvise(MADV_HUGEPAGE) before the first write; a buffer under 4 MiB is left as it is).
  // Its first write, and a forked process's first reads of it, then fault once per 2 MiB instead
  // of once per 4 KiB. Otherwise as Tensor(dtype, shape).
  static Tensor with_huge_pages(DType dtype, const Shape& shape);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32);
  static Tensor ones(const Shape& shape, DType dtype = DType::kFloat32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32);
  static Tensor scalar(float value);
  // Copies `values` into a tensor of `shape`; throws if the element counts differ.
  template <class T>
  static Tensor from_vector(std::span<const T> values, const Shape& shape);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
    return from_vector<T>(std::span<const T>(values), shape);
  }
  template <class T>
  static Tensor from_vector(std::initializer_list<T> values, const Shape& shape) {
    return from_vector<T>(std::span<const T>(values.begin(), values.size()), shape);
  }

  bool defined() const { return header_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  // Dimension i; negative i counts from the end.
  int64_t dim(int i) const { return shape_.dim(i); }
  int64_t num_elements() const { return shape_.num_elements(); }
  size_t nbytes() const { return static_cast<size_t>(num_elements()) * dtype_size(dtype_); }

  // Typed access; throws InvalidArgumentError if T does not match dtype().
  template <class T>
  T* data() {
    check_dtype(dtype_of<T>);
    return static_cast<T*>(raw_data());
  }
  template <class T>
  const T* data() const {
    check_dtype(dtype_of<T>);
    return static_cast<const T*>(raw_data());
  }
  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }

  // The value of a one-element tensor, converted to double.
  double item() const;
  // A copy of the elements as a vector (T must match dtype()).
  template <class T>
  std::vector<T> to_vector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + num_elements());
  }

  // A view with a new shape of the same element count (shares the buffer).
  Tensor reshape(const Shape& shape) const;
  // A view of rows [begin, end) along the first dimension (shares the buffer).
  Tensor slice(int64_t begin, int64_t end) const;
  // A view of row i along the first dimension, of shape shape().without_first().
  Tensor operator[](int64_t i) const;
  // A deep copy in a fresh buffer.
  Tensor clone() const;
  // Copies the elements of `src` (same dtype and element count) into this tensor's buffer.
  void copy_from(const Tensor& src);
  // Sets every element to `value`.
  void fill(double value);
  // True when both tensors refer to the same buffer.
  bool shares_buffer_with(const Tensor& other) const { return header_ && header_ == other.header_; }
  // Number of Tensor handles sharing this buffer (views included).
  long use_count() const;

  // Bitwise equality of dtype, shape and bytes.
  bool equals(const Tensor& other) const;
  // "Tensor<float32 [2, 3]>"; with values for small tensors.
  std::string to_string(int64_t max_values = 16) const;

  // Autograd bookkeeping (see autograd/gradient_tape.h); not for general use.
  const TapeRef& tape_ref() const { return tape_ref_; }
  void set_tape_ref(TapeRef ref) { tape_ref_ = ref; }

 private:
  void check_dtype(DType expected) const;
  void release();

  detail::StorageHeader* header_ = nullptr;
  void* data_ = nullptr;  // header_'s buffer plus the view's offset
  Shape shape_;
  DType dtype_ = DType::kInvalid;
  TapeRef tape_ref_;
};

// Statistics of the caching allocator behind every Tensor buffer, for tests and benchmarks.
struct AllocatorStats {
  uint64_t allocations = 0;         // buffers handed out
  uint64_t system_allocations = 0;  // of which came from the system (cache misses)
  uint64_t bytes_in_use = 0;
  uint64_t bytes_cached = 0;
  uint64_t peak_bytes_in_use = 0;
};
AllocatorStats allocator_stats();
// Returns every cached (free) buffer to the system.
void allocator_release_cached();

}  // namespace dtrain
