// The caching allocator behind Tensor buffers. Freed buffers are kept in exact-size free lists
// and handed out again, so a training loop that allocates the same shapes every step reaches a
// steady state with no system allocation. Thread-safe (one mutex; uncontended in practice).
#pragma once

#include <atomic>
#include <cstddef>

namespace dtrain::detail {

// Lives in the first kHeaderBytes of every buffer; the data follows, 64-byte aligned.
struct StorageHeader {
  std::atomic<long> refcount{1};
  size_t capacity = 0;  // bytes of data after the header
};
inline constexpr size_t kHeaderBytes = 64;

inline void* storage_data(StorageHeader* h) { return reinterpret_cast<char*>(h) + kHeaderBytes; }

// Returns a header with refcount 1 and at least `nbytes` of data. A buffer of 64 KiB or more
// that comes fresh from the system has its pages made present at once unless `populate` is false
// (a caller that will advise huge pages first: populated pages would be 4 KiB ones). Throws
// ResourceExhaustedError when the system is out of memory.
StorageHeader* storage_allocate(size_t nbytes, bool populate = true);
// Called when the refcount drops to zero.
void storage_free(StorageHeader* h);

}  // namespace dtrain::detail
