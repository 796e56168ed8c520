// Replaces the global operator new/delete of the test executable that includes this header (in
// exactly one source file) with malloc-backed versions that count calls, so a test can assert
// that a steady-state loop does not touch the heap. dtrain::testutil::new_calls() returns the
// count so far.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

// GCC flags free() on memory from (our own, malloc-backed) operator new once it inlines both.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace dtrain::testutil {
inline std::atomic<long> g_new_calls{0};
inline long new_calls() { return g_new_calls.load(std::memory_order_relaxed); }
}  // namespace dtrain::testutil

void* operator new(std::size_t n) {
  dtrain::testutil::g_new_calls.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { operator delete(p); }
