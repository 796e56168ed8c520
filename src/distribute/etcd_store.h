// A KeyValueStore on an etcd cluster (etcd's v3 gRPC API, proto/etcd_kv.proto): what
// "etcd://host:2379[,host2:2379,...]" names in open_store(). Set is a Put, get and wait poll
// Range (1 ms backing off to 20 ms), add is a compare-and-swap Txn on the key's mod revision, so
// counters are atomic across every client of the cluster. Calls go to one endpoint and fail over
// to the next when it is unreachable (UNAVAILABLE, or no answer within the call's deadline).
// Private to src/distribute (gRPC stays out of include/). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/distribute/key_value_store.h"
#include "dtrain/distribute/launcher_env.h"

namespace dtrain::distribute {

struct EtcdStoreOptions {
  // How long the constructor tries the endpoints before it gives up (UnavailableError).
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(5);
  // Deadline of one RPC on one endpoint.
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(5);
  // How long a call keeps failing over between unreachable endpoints before it gives up.
  std::chrono::milliseconds retry_window = std::chrono::seconds(10);
};

class EtcdKeyValueStore final : public KeyValueStore {
 public:
  // Connects to the first endpoint that answers (a Range of one key), trying them in turn for
  // up to options.connect_timeout. Throws UnavailableError naming every endpoint when none does.
  EtcdKeyValueStore(std::vector<HostPort> endpoints, const EtcdStoreOptions& options = {});
  ~EtcdKeyValueStore() override;

  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(std::span<const std::string> keys) override;
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override;
  // "etcd://host:port[,host:port...]".
  std::string describe() const override { return url_; }

  // The value of `key` now, or nullopt when it is absent (does not wait).
  std::optional<std::string> try_get(const std::string& key);
  // Every key that starts with `prefix` and its value, now (one Range).
  std::map<std::string, std::string> get_prefix(const std::string& prefix);

  // A value with the revision of its last change (etcd's mod_revision; 0: the key is absent).
  struct Versioned {
    std::string value;
    int64_t mod_revision = 0;
  };
  // `key` now; an absent key reads as {"", 0}.
  Versioned read(const std::string& key);
  // Atomically (one Txn): when every key in `expected` still has the given mod revision (0:
  // still absent), stores every pair of `puts` and returns true; otherwise changes nothing and
  // returns false.
  bool commit_if(const std::vector<std::pair<std::string, int64_t>>& expected,
                 const std::vector<std::pair<std::string, std::string>>& puts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string url_;
};

// The endpoints of "etcd://host[:port][,host[:port]...][/]" (port 2379 by default). Throws
// InvalidArgumentError naming the URL when it is malformed or not an etcd URL. (In
// rendezvous.cc, with the parsing of the other store URLs.)
std::vector<HostPort> parse_etcd_url(const std::string& url);

}  // namespace dtrain::distribute
