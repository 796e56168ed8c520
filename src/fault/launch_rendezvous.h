// The launcher's rendezvous: the coordination service (hosted here, or on node 0), the
// membership round that forms each generation, and what the nodes of a generation tell each
// other through the service (the first failure, who finished, who left). Private to src/fault.
// Single-threaded use; the coordination server and client run their own threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/distribute/coordination.h"
#include "dtrain/fault/launch_agent.h"
#include "fault/failure_classifier.h"

namespace dtrain::fault {

// One generation as this node sees it.
struct Generation {
  int64_t number = 1;
  std::vector<int> nodes;  // member node ids, in rank order
  int node_index = 0;      // this node's position (DTRAIN_NODE_RANK)
  int world_size = 0;
  int rank_offset = 0;
  std::vector<int> slots;  // this node's active slots
};

class LaunchRendezvous {
 public:
  // Starts the coordination service when this node hosts it (--rdzv coordinator, host:port on
  // node 0, or on every node of a multi-node job on etcd://, with the state in etcd) and
  // connects to it. Throws what CoordinationServer / CoordinationClient throw.
  explicit LaunchRendezvous(const LaunchOptions& options);

  // host:port the workers connect to; empty for several nodes on a file:// or redis:// store.
  const std::string& service() const { return service_; }
  // False for several nodes on a file:// or redis:// store (fixed membership, no restarts).
  bool connected() const { return client_ != nullptr; }
  // True when the other nodes depend on this node's service (node 0 on host:port); false when
  // every node serves the shared state in etcd.
  bool hosts_service() const { return server_ != nullptr && !shared_state_; }
  distribute::CoordinationClient& client() { return *client_; }

  // Joins the next membership round with this node's active `slots` and returns the
  // generation it formed. A node cut off from the service keeps trying (on a fresh connection)
  // until --rdzv-timeout. Throws FailedPreconditionError when too few nodes are left after
  // exclusions, DeadlineExceededError / UnavailableError when the round does not form in time.
  Generation next_generation(const std::vector<int>& slots);
  // The service stopped answering this generation: reconnect before the next round.
  void lost_service() { lost_service_ = true; }

  // The workers' newest steps this generation: "progress/<gen>/<rank>" → step.
  std::map<std::string, std::string> progress(const Generation& g);

  // Several nodes: claims the generation's first failure; false when another node's came first.
  bool claim_first_failure(const Generation& g);
  // Several nodes: marks this node excluded from the following rounds.
  void exclude_this_node(const Generation& g);
  // Several nodes: tells the others what the generation's first failure was.
  void publish_failure(const Generation& g, const Failure& f);
  // Another node's report of the generation's first failure, or nullopt when none yet.
  std::optional<Failure> read_failure(const Generation& g);
  // Several nodes: this node's workers all finished.
  void mark_done(const Generation& g);
  // Several nodes: every member's workers finished.
  bool all_done(const Generation& g);
  // Several nodes: tells the others this node leaves with `code`; the node hosting the service
  // waits (up to 10 s) for every member to say the same, so none loses the service before it
  // learned the outcome. Never throws (says what went wrong).
  void leave(const Generation& g, int code);

 private:
  bool multi_node() const { return o_.max_nodes > 1; }
  distribute::CoordinationClientOptions client_options(milliseconds connect_timeout) const;
  distribute::Membership join_round();
  std::string key(const Generation& g, const std::string& name) const {
    return str_cat(prefix_, "g", g.number, "/", name);
  }

  const LaunchOptions& o_;
  std::unique_ptr<distribute::CoordinationServer> server_;
  std::unique_ptr<distribute::CoordinationClient> client_;  // null: multi-node on file/redis
  bool shared_state_ = false;  // the service's state is in etcd, served by every node
  bool lost_service_ = false;  // calls to the service failed: reconnect before the next round
  std::string service_;        // host:port workers connect to
  std::string prefix_;         // "dtrain/<run>/launch/"
};

}  // namespace dtrain::fault
