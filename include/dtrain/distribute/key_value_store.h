// KeyValueStore: the small key-value interface that rendezvous runs on (set, blocking get, atomic
// add, wait), and the building blocks over it: an in-memory store for tests (ranks as threads in
// one process, like Gloo's test/base_test.h) and a prefixing view for rendezvous generations.
// The coordination-service client, the file store and the Redis store implement it too
// (rendezvous.h). Every implementation here is thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::distribute {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Stores `value` (any bytes) under `key`, replacing an existing value. Throws
  // UnavailableError when the backend cannot be reached.
  virtual void set(const std::string& key, std::string_view value) = 0;
  // Returns the value of `key`, waiting up to `timeout` for it to be set. Throws
  // DeadlineExceededError naming the key when it is still absent after `timeout`,
  // UnavailableError when the backend cannot be reached.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (an absent key counts as 0) and
  // returns the new value. The value is stored as decimal text, so get() reads it as "3".
  // Throws InvalidArgumentError when the key holds something that is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key in `keys` is set; does not block.
  virtual bool check(std::span<const std::string> keys) = 0;
  // Blocks until every key in `keys` is set. Throws DeadlineExceededError naming the missing
  // keys after `timeout`.
  virtual void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout);
  // A short description for error messages, e.g. "redis://10.0.0.1:6379".
  virtual std::string describe() const = 0;
};

// A store in this process's memory: threads that share it can rendezvous as ranks. Blocking
// calls wait on a condition variable, not by polling.
class InMemoryKeyValueStore final : public KeyValueStore {
 public:
  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(std::span<const std::string> keys) override;
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override;
  std::string describe() const override { return "memory://"; }
  // Number of keys stored (for tests).
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;  // guarded by mu_
};

// A view of `base` in which every key is stored as prefix + key. Gives each rendezvous
// generation a fresh namespace, since Gloo's rendezvous keys cannot be reused.
class PrefixKeyValueStore final : public KeyValueStore {
 public:
  PrefixKeyValueStore(std::shared_ptr<KeyValueStore> base, std::string prefix);
  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(std::span<const std::string> keys) override;
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override;
  std::string describe() const override;
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(std::span<const std::string> keys) const;

  std::shared_ptr<KeyValueStore> base_;
  std::string prefix_;
};

}  // namespace dtrain::distribute
