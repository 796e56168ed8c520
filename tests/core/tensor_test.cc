#include "dtrain/core/tensor.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace dtrain {
namespace {

TEST(Tensor, ShapeAndData) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.num_elements(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.data<float>()[4], 5.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_THROW(t.data<int32_t>(), InvalidArgumentError);
}

TEST(Tensor, CopiesShareClonesDoNot) {
  Tensor a = Tensor::zeros(Shape{4});
  Tensor b = a;
  EXPECT_TRUE(a.shares_buffer_with(b));
  EXPECT_EQ(a.use_count(), 2);
  Tensor c = a.clone();
  EXPECT_FALSE(c.shares_buffer_with(a));
  b.data<float>()[0] = 7;
  EXPECT_EQ(a.data<float>()[0], 7);
  EXPECT_EQ(c.data<float>()[0], 0);
}

TEST(Tensor, ViewsSliceAndReshape) {
  Tensor t = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5}, Shape{3, 2});
  Tensor row = t[1];
  EXPECT_EQ(row.shape(), Shape{2});
  EXPECT_EQ(row.data<int32_t>()[0], 2);
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.data<int32_t>()[3], 5);
  EXPECT_EQ(t.reshape(Shape{6}).data<int32_t>()[5], 5);
  EXPECT_THROW(t.reshape(Shape{4}), InvalidArgumentError);
  EXPECT_THROW(t.slice(2, 4), InvalidArgumentError);
  EXPECT_THROW(t[3], InvalidArgumentError);
}

TEST(Tensor, ItemAndEquals) {
  EXPECT_EQ(Tensor::scalar(2.5f).item(), 2.5);
  EXPECT_THROW(Tensor::zeros(Shape{2}).item(), InvalidArgumentError);
  EXPECT_TRUE(Tensor::ones(Shape{3}).equals(Tensor::full(Shape{3}, 1.0)));
  EXPECT_FALSE(Tensor::ones(Shape{3}).equals(Tensor::zeros(Shape{3})));
}

// Sizes from a corrupt file or an absurd argument are errors before anything is allocated.
TEST(Tensor, ImpossibleSizesAreClearErrors) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THROW((void)Shape({big, big}).num_elements(), InvalidArgumentError);
  EXPECT_THROW(Tensor(Shape{big, big}), InvalidArgumentError);
  EXPECT_THROW(Tensor(Shape{int64_t{1} << 62}), InvalidArgumentError);  // 2^64 bytes
  try {
    Tensor t(Shape{big, 1024});  // 4 PiB
    FAIL() << "allocated " << t.nbytes() << " bytes";
  } catch (const ResourceExhaustedError& e) {
    EXPECT_NE(std::string(e.what()).find("[1099511627776, 1024]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::with_huge_pages(DType::kFloat32, Shape{big, 1024}), ResourceExhaustedError);
}

TEST(Allocator, ReusesFreedBuffersOfTheSameSize) {
  { Tensor warm(Shape{1000, 3}); }
  const auto before = allocator_stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t(Shape{1000, 3});
    t.fill(i);
  }
  const auto after = allocator_stats();
  EXPECT_EQ(after.allocations - before.allocations, 100u);
  EXPECT_EQ(after.system_allocations, before.system_allocations);
}

// Whether the kernel populates pages on request (MADV_POPULATE_WRITE, Linux 5.14).
bool kernel_populates() {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = madvise(p, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
  munmap(p, 4096);
  return ok;
}

TEST(Allocator, AFreshLargeBufferIsPresentBeforeItsFirstTouch) {
  if (!kernel_populates()) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE";
  // An odd size no other test allocates, so the buffer is new (glibc maps it with mmap).
  const size_t bytes = (size_t{3} << 20) + 3 * 4096 + 64;
  detail::StorageHeader* h = detail::storage_allocate(bytes);
  const auto begin =
      (reinterpret_cast<uintptr_t>(detail::storage_data(h)) + 4095) & ~uintptr_t{4095};
  const auto end =
      (reinterpret_cast<uintptr_t>(detail::storage_data(h)) + bytes) & ~uintptr_t{4095};
  std::vector<unsigned char> present((end - begin) / 4096);
  ASSERT_EQ(mincore(reinterpret_cast<void*>(begin), end - begin, present.data()), 0);
  const auto missing =
      std::count_if(present.begin(), present.end(), [](unsigned char v) { return (v & 1) == 0; });
  EXPECT_EQ(missing, 0) << "of " << present.size() << " pages";
  detail::storage_free(h);
}

// Whether the mapping of /proc/self/smaps that holds `p` carries the huge-page advice ("hg" in
// its VmFlags); fails the test when no mapping holds `p`.
bool advised_huge(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = at >= lo && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      std::istringstream words(line);
      for (std::string w; words >> w;) {
        if (w == "hg") return true;
      }
      return false;
    }
  }
  ADD_FAILURE() << "no mapping holds " << p;
  return false;
}

// How many of the whole pages in [p, p + bytes) are present (mincore).
int64_t present_pages(const void* p, size_t bytes) {
  const auto begin = (reinterpret_cast<uintptr_t>(p) + 4095) & ~uintptr_t{4095};
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t{4095};
  std::vector<unsigned char> present((end - begin) / 4096);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(begin), end - begin, present.data()), 0);
  return std::count_if(present.begin(), present.end(), [](unsigned char v) { return v & 1; });
}

TEST(Tensor, WithHugePagesAdvisesLargeBuffersOnly) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  // 64 MiB: a fresh mapping from the system; its whole pages carry the advice.
  Tensor big = Tensor::with_huge_pages(DType::kFloat32, Shape{16, 1 << 20});
  float* data = big.data<float>();
  // Not made present at allocation (the allocator does that for other fresh buffers): pages
  // populated before the advice would be 4 KiB ones.
  EXPECT_EQ(present_pages(data + big.num_elements() / 4, 16 << 20), 0);
  for (int64_t i = 0; i < big.num_elements(); i += 1024) data[i] = static_cast<float>(i);
  EXPECT_EQ(data[1024 * 5], 5120.0f);
  EXPECT_TRUE(advised_huge(data + big.num_elements() / 2));
  // A small one stays on ordinary pages: the heap around it is not advised.
  Tensor small = Tensor::with_huge_pages(DType::kFloat32, Shape{1000});
  EXPECT_FALSE(advised_huge(small.data<float>()));
}

}  // namespace
}  // namespace dtrain
