// Where the coordination service keeps its state: the operations behind every RPC of
// proto/coordination.proto, with the blocking semantics documented on CoordinationClient
// (include/dtrain/distribute/coordination.h). Two implementations: CoordinationState (in this
// process's memory; the state dies with the process that serves it) and EtcdCoordinationState
// (in an etcd cluster, so several services, one per launcher, share one state and any of them
// may die). Private to src/distribute. Implementations are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtrain/distribute/coordination.h"

namespace dtrain::distribute {

class CoordinationBackend {
 public:
  virtual ~CoordinationBackend() = default;

  virtual void set(const std::string& key, std::string value) = 0;
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual void barrier(const std::string& name, int count, std::chrono::milliseconds timeout) = 0;
  virtual int64_t heartbeat(const std::string& task) = 0;
  virtual std::map<std::string, std::chrono::milliseconds> heartbeat_ages() const = 0;
  virtual Membership join(const std::string& member, const JoinOptions& options) = 0;
  virtual Membership membership() const = 0;
  virtual std::map<std::string, std::string> get_prefix(const std::string& prefix) const = 0;
  // Wakes every waiter with UnavailableError and refuses further calls. Idempotent.
  virtual void stop() = 0;
};

}  // namespace dtrain::distribute
