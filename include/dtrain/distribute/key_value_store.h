// KeyValueStore: the minimal key-value interface behind rendezvous (Gloo contexts are built from
// one through a gloo::rendezvous::Store adapter). Implemented by the coordination-service client
// and by file / Redis stores. Implementations are thread-safe unless they say otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::distribute {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Stores `value` under `key`, replacing any previous value. Throws UnavailableError when the
  // store cannot be reached.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;

  // Returns the value of `key`, waiting until some process sets it. Blocks up to `timeout`;
  // throws DeadlineExceededError when the key is still missing then, UnavailableError when the
  // store cannot be reached.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the integer counter under `key` (a missing key counts as 0) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Waits until every key in `keys` exists. Blocks up to `timeout`; throws DeadlineExceededError
  // naming a missing key after it.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

}  // namespace dtrain::distribute
