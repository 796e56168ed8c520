// Threads as ranks: runs fn(rank, collectives) for every rank of a `size`-worker job on its own
// thread, all connected through one in-memory store (real Gloo pairs on loopback); rethrows the
// first rank's failure after every thread has ended.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/key_value_store.h"

namespace dtrain::testutil {

inline void run_ranks(int size, const std::function<void(int, distribute::Collectives&)>& fn,
                      distribute::CollectiveOptions base = {}) {
  auto store = std::make_shared<distribute::InMemoryKeyValueStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        distribute::CollectiveOptions o = base;
        o.rank = r;
        o.world_size = size;
        auto c = distribute::Collectives::connect(store, o);
        fn(r, *c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dtrain::testutil
