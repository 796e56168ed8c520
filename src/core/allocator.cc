// Caching allocator: exact-size free lists, bounded total cache.
#include "allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/tensor.h"

namespace dtrain::detail {
namespace {

// Buffers larger than this go straight back to the system; so does anything that would push
// the cache past kMaxCachedBytes.
constexpr size_t kMaxCachedBuffer = size_t{256} << 20;
constexpr size_t kMaxCachedBytes = size_t{1} << 30;

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<StorageHeader*>> free_lists;  // by capacity
  AllocatorStats stats;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors may outlive static destructors
  return *c;
}

size_t round_capacity(size_t nbytes) { return (nbytes + 63) & ~size_t{63}; }

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// A fresh buffer this large has its pages made present at once: one madvise(2) instead of a
// page fault per 4 KiB on first touch, which on a VM with shadow page tables costs about 11 us
// each (a 1.2 MB tensor: 3 ms). Pages already present (reused heap) cost nothing; a kernel
// without MADV_POPULATE_WRITE says EINVAL and the pages fault in as before. Not for a buffer that
// will be advised huge pages (Tensor::with_huge_pages): it would get 4 KiB pages, and a spare
// forked from the fork server would then take a fault per 4 KiB of its data set, not per 2 MB.
constexpr size_t kPopulateBytes = size_t{64} << 10;

void make_present(void* p, size_t bytes) {
  constexpr uintptr_t kPage = 4096;
  const uintptr_t first = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kPage - 1);
  if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE);
}

}  // namespace

StorageHeader* storage_allocate(size_t nbytes, bool populate) {
  const size_t capacity = round_capacity(nbytes == 0 ? 1 : nbytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.stats.allocations;
    c.stats.bytes_in_use += capacity;
    if (c.stats.bytes_in_use > c.stats.peak_bytes_in_use) {
      c.stats.peak_bytes_in_use = c.stats.bytes_in_use;
    }
    auto it = c.free_lists.find(capacity);
    if (it != c.free_lists.end() && !it->second.empty()) {
      StorageHeader* h = it->second.back();
      it->second.pop_back();
      c.stats.bytes_cached -= capacity;
      h->refcount.store(1, std::memory_order_relaxed);
      return h;
    }
    ++c.stats.system_allocations;
  }
  void* p = std::aligned_alloc(64, kHeaderBytes + capacity);
  if (p == nullptr) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.stats.bytes_in_use -= capacity;
    throw ResourceExhaustedError(
        str_cat("out of memory allocating a tensor of ", nbytes, " bytes"));
  }
  if (populate && capacity >= kPopulateBytes) make_present(p, kHeaderBytes + capacity);
  auto* h = new (p) StorageHeader;
  h->capacity = capacity;
  return h;
}

void storage_free(StorageHeader* h) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.stats.bytes_in_use -= h->capacity;
    if (h->capacity <= kMaxCachedBuffer && c.stats.bytes_cached + h->capacity <= kMaxCachedBytes) {
      std::vector<StorageHeader*>& list = c.free_lists[h->capacity];
      // Room for the buffers several replica threads free in a step, so that the interleaving
      // of their frees does not grow the list (an operator new) now and then for many steps.
      if (list.capacity() == 0) list.reserve(64);
      list.push_back(h);
      c.stats.bytes_cached += h->capacity;
      return;
    }
  }
  h->~StorageHeader();
  std::free(h);
}

}  // namespace dtrain::detail

namespace dtrain {

AllocatorStats allocator_stats() {
  auto& c = detail::cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

void allocator_release_cached() {
  auto& c = detail::cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [cap, list] : c.free_lists) {
    for (detail::StorageHeader* h : list) {
      h->~StorageHeader();
      std::free(h);
    }
    list.clear();
  }
  c.stats.bytes_cached = 0;
}

}  // namespace dtrain
