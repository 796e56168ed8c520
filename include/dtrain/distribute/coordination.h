// The coordination service: a small gRPC server (inside `dtrain launch`, or inside the chief when
// a job manager starts the processes) that workers use for rendezvous — a key-value store (the
// store behind Gloo contexts), named barriers, heartbeats and membership generations.
//
//   distribute::CoordinationServer server({.address = "127.0.0.1:0"});   // port 0: pick one
//   distribute::CoordinationClient client(server.address());
//   client.set("k", {1, 2});  client.get("k", 10s);  client.barrier("init", world, 60s);
//
// Both classes are thread-safe: one client may be shared by many threads, and blocking calls of
// one thread do not block the others. Every blocking call has a timeout. gRPC and protobuf stay
// inside src/distribute; nothing here exposes them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/key_value_store.h"

namespace dtrain::distribute {

// One completed membership round. Each round gets the next generation number; passed to
// rendezvous() (rendezvous.h) it gives the group a fresh key prefix, since Gloo contexts are not
// reusable after a failure and a restarted group must rendezvous again.
struct Membership {
  int64_t generation = 0;            // 1 for the first round; 0: no round completed yet
  std::vector<std::string> members;  // the members' ids, sorted (std::string order)
  // membership() only: the members waiting in the round being formed (sorted), so a running
  // group can see that someone wants in (elastic scale-up). Empty in join()'s answer.
  std::vector<std::string> joining = {};

  // Index of `member` in `members`, or -1.
  int index_of(const std::string& member) const;
};

// A membership round that may close with fewer than the most members (elastic jobs).
struct JoinOptions {
  int max_members = 1;  // the round closes as soon as this many members joined
  // 0: max_members (a fixed-size round). Otherwise the round also closes once at least this
  // many joined and nobody else arrived for `settle`.
  int min_members = 0;
  std::chrono::milliseconds settle = std::chrono::seconds(0);    // see min_members
  std::chrono::milliseconds timeout = std::chrono::seconds(60);  // how long join() waits
};

struct CoordinationServerOptions {
  // host:port to listen on. Port 0 picks a free port (see port()). Use 127.0.0.1 for one
  // machine, the host's name or address for several.
  std::string address = "127.0.0.1:0";
  // Where the service keeps its state. "": in this process (it dies with it). An etcd URL
  // ("etcd://host:2379[,host:2379...]", see open_store()): in that etcd cluster under
  // `state_prefix`, so several services started with the same store and prefix serve one shared
  // state (keys, counters, barriers, heartbeats, membership rounds) and any of them may stop or
  // die without losing it. Waiting calls then poll etcd (every 1-20 ms), and heartbeat ages are
  // measured on this host from when each heartbeat was first seen changed (no clock is
  // compared across hosts).
  std::string state_store = "";
  std::string state_prefix = "dtrain/coordination/";
};

// The service. Starts serving in the constructor and stops in stop() or the destructor.
class CoordinationServer {
 public:
  // Starts listening on options.address. Throws UnavailableError naming the address when it
  // cannot listen there (address in use, unknown host) or the state store cannot be reached,
  // InvalidArgumentError when the address has no port or the state store URL is malformed.
  explicit CoordinationServer(const CoordinationServerOptions& options = {});
  // Calls stop().
  ~CoordinationServer();
  CoordinationServer(const CoordinationServer&) = delete;
  CoordinationServer& operator=(const CoordinationServer&) = delete;

  // The port actually bound (the picked one when the options said 0).
  int port() const;
  // host:port that clients on this machine can connect to (the options' host, bound port).
  std::string address() const;

  // Stops serving: calls blocked in get / wait / barrier / join fail with UnavailableError,
  // then the server shuts down. Blocks up to about two seconds. Idempotent.
  void stop();

  // Time since each task's last heartbeat, as seen by the server (for failure detection).
  std::map<std::string, std::chrono::milliseconds> heartbeat_ages() const;
  // The last completed membership round (generation 0 before the first).
  Membership membership() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CoordinationClientOptions {
  // How long the constructor waits for the server to accept a connection.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // Deadline of calls that do not wait for others (set, add, heartbeat, membership); calls that
  // wait (get, wait, barrier, join) get their own timeout plus min(this, 5 s).
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(30);
  // Non-empty: a background thread sends heartbeat(heartbeat_task) every heartbeat_interval.
  std::string heartbeat_task = "";
  // Interval of the background heartbeats.
  std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(1);
  // When heartbeats have failed for this long, on_heartbeat_failure is called (once) and the
  // heartbeat thread stops.
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(10);
  // Called on the heartbeat thread with the last error (UnavailableError when the service is
  // lost); it must not destroy the client. Empty: failures are only recorded (heartbeat_failed).
  std::function<void(const Error&)> on_heartbeat_failure = nullptr;
};

// A connection to the service; also the KeyValueStore behind rendezvous. Errors: the service
// unreachable or lost → UnavailableError naming host:port; a timeout → DeadlineExceededError;
// inconsistent use (barrier counts that differ, add on a non-integer value) →
// InvalidArgumentError.
class CoordinationClient final : public KeyValueStore {
 public:
  // Connects to the service at `address` ("host:port"). Blocks until connected, up to
  // options.connect_timeout (the server may start later than the client); throws
  // UnavailableError naming the address after that. With a heartbeat_task, sends the first
  // heartbeat before returning and starts the heartbeat thread.
  explicit CoordinationClient(const std::string& address,
                              const CoordinationClientOptions& options = {});
  // Stops the heartbeat thread (waits for an in-flight heartbeat, at most rpc_timeout).
  ~CoordinationClient() override;
  CoordinationClient(const CoordinationClient&) = delete;
  CoordinationClient& operator=(const CoordinationClient&) = delete;

  const std::string& address() const;

  // KeyValueStore. Values are any bytes; counters made by add() are stored as ASCII decimal (so
  // get() of a counter returns e.g. "3"). get() and wait() wait on the server, not by polling.
  void set(const std::string& key, std::string_view value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(std::span<const std::string> keys) override;
  // Every key that starts with `prefix` and its value, now (does not wait; one RPC, so a
  // launcher can read all workers' progress keys at once). Blocks up to rpc_timeout.
  std::map<std::string, std::string> get_prefix(const std::string& prefix);
  void wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) override;
  // The service's address, "host:port" (the form DTRAIN_RDZV takes).
  std::string describe() const override;

  // Returns once `count` callers (from any processes) have called barrier(name, count, ...)
  // in this round; the name can be reused for later rounds. Blocks up to `timeout`, then throws
  // DeadlineExceededError saying how many arrived, and leaves the barrier. Throws
  // InvalidArgumentError when callers disagree on `count`.
  void barrier(const std::string& name, int count, std::chrono::milliseconds timeout);

  // Records that `task` is alive now; returns the service's current membership generation (a
  // change tells a worker that its group is being re-formed). Blocks up to rpc_timeout.
  int64_t heartbeat(const std::string& task);
  // Time since each task's last heartbeat, as seen by the server.
  std::map<std::string, std::chrono::milliseconds> heartbeat_ages();
  // True once the background heartbeats have failed for heartbeat_timeout.
  bool heartbeat_failed() const;

  // Joins the next membership round as `member` and returns when `count` members have joined
  // it: every member of the round gets the same Membership, with the next generation number.
  // Joining again after a round completed starts a new round (how a group re-forms). Blocks up
  // to `timeout`, then throws DeadlineExceededError naming who joined, and leaves the round.
  // Throws InvalidArgumentError when members disagree on `count`.
  Membership join(const std::string& member, int count, std::chrono::milliseconds timeout);
  // The same with an elastic round: returns when the round closed (options.max_members joined,
  // or at least options.min_members and nobody else for options.settle). Every member of the
  // round gets the same Membership. Blocks up to options.timeout, then throws
  // DeadlineExceededError naming who joined. Throws InvalidArgumentError when members disagree
  // on the counts, or min_members > max_members.
  Membership join(const std::string& member, const JoinOptions& options);
  // The last completed round (generation 0 before the first), with `joining` filled in; does not
  // block beyond rpc_timeout.
  Membership membership();
  // membership().generation.
  int64_t generation();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::distribute
