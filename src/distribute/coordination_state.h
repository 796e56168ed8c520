// The coordination service's state in this process's memory and its blocking semantics, without
// any RPC (a CoordinationBackend): the gRPC
// service (coordination_server.cc) is a thin translation layer over this. Thread-safe: one mutex
// guards everything, and waiters sleep on one condition variable that every change notifies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "distribute/coordination_backend.h"
#include "dtrain/distribute/coordination.h"

namespace dtrain::distribute {

class CoordinationState final : public CoordinationBackend {
 public:
  using Clock = std::chrono::steady_clock;

  // Stores `value` under `key`. Throws UnavailableError once stopped.
  void set(const std::string& key, std::string value) override;
  // Returns the value of `key`, waiting up to `timeout` for it. Throws DeadlineExceededError
  // after the timeout, UnavailableError when stopped while waiting.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  // Adds `delta` to the ASCII-decimal counter under `key` (missing: 0); returns the new value.
  // Throws InvalidArgumentError when the value there is not a decimal integer.
  int64_t add(const std::string& key, int64_t delta) override;
  // Waits up to `timeout` until every key exists; DeadlineExceededError names a missing one.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // Waits until `count` callers arrived at barrier `name` (see CoordinationClient::barrier).
  void barrier(const std::string& name, int count, std::chrono::milliseconds timeout) override;
  // Records a heartbeat of `task`; returns the current generation.
  int64_t heartbeat(const std::string& task) override;
  std::map<std::string, std::chrono::milliseconds> heartbeat_ages() const override;
  // Joins the next membership round (see CoordinationClient::join).
  Membership join(const std::string& member, const JoinOptions& options) override;
  // The last completed round, with `joining` = the members of the round being formed.
  Membership membership() const override;
  // Every key starting with `prefix`, and its value.
  std::map<std::string, std::string> get_prefix(const std::string& prefix) const override;

  // Wakes every waiter with UnavailableError and refuses further calls. Idempotent.
  void stop() override;

 private:
  struct BarrierState {
    int count = 0;       // expected callers of the current round
    int arrived = 0;     // callers waiting in the current round
    uint64_t round = 0;  // completed rounds
  };

  // Deadline `timeout` from now, clamped so that huge timeouts cannot overflow.
  static Clock::time_point deadline_after(std::chrono::milliseconds timeout);
  void check_running() const;  // requires mu_

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopped_ = false;
  std::map<std::string, std::string> values_;
  std::map<std::string, BarrierState> barriers_;
  std::map<std::string, Clock::time_point> heartbeats_;
  // Membership: completed rounds by generation (the latest few), and the round being formed.
  std::map<int64_t, Membership> rounds_;
  int64_t generation_ = 0;
  std::set<std::string> pending_;
  int pending_count_ = 0;             // max members of the round being formed
  int pending_min_ = 0;               // min members of the round being formed
  Clock::duration pending_settle_{};  // settle time of the round being formed
  Clock::time_point last_arrival_{};  // when the latest member joined it
};

}  // namespace dtrain::distribute
