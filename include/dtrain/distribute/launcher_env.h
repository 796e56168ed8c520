// The environment `dtrain launch` gives each worker process (like torchrun's RANK, WORLD_SIZE,
// MASTER_ADDR): variable names, the parsed form, and the parser the cluster resolver uses.
// docs/launch.md describes the same contract for users. Values are immutable; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::distribute {

// Global rank of this worker, 0 .. DTRAIN_WORLD_SIZE-1. Rank 0 is the chief.
inline constexpr const char* kEnvRank = "DTRAIN_RANK";
// Number of worker processes in the job, over all nodes.
inline constexpr const char* kEnvWorldSize = "DTRAIN_WORLD_SIZE";
// Rank of this worker among the workers of its node, 0 .. DTRAIN_LOCAL_WORLD_SIZE-1.
inline constexpr const char* kEnvLocalRank = "DTRAIN_LOCAL_RANK";
// Number of workers on this node (--nproc-per-node).
inline constexpr const char* kEnvLocalWorldSize = "DTRAIN_LOCAL_WORLD_SIZE";
// Index of this node, 0 .. DTRAIN_NNODES-1 (--node-rank), and the number of nodes (--nnodes).
inline constexpr const char* kEnvNodeRank = "DTRAIN_NODE_RANK";
inline constexpr const char* kEnvNnodes = "DTRAIN_NNODES";
// Where workers rendezvous (the store behind their Gloo contexts): "host:port" of the
// coordination service, or "file:///shared/dir", or "redis://host:port".
inline constexpr const char* kEnvRdzv = "DTRAIN_RDZV";
// Membership generation of this worker group (1 for the first start; a restarted group gets a
// higher one). Pass it to rendezvous() (RendezvousOptions::generation) so that each generation
// rendezvouses under fresh keys.
inline constexpr const char* kEnvRdzvGeneration = "DTRAIN_RDZV_GENERATION";
// Host and port of the coordination service (barriers, heartbeats, key-value store). Set
// whenever the job has one; absent only for multi-node jobs on file:// or redis:// rendezvous.
inline constexpr const char* kEnvMasterAddr = "DTRAIN_MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "DTRAIN_MASTER_PORT";
// Job identifier (--run-id; RendezvousOptions::run_id), so jobs can share a Redis or a directory.
inline constexpr const char* kEnvRunId = "DTRAIN_RUN_ID";

// "host:port"; IPv6 hosts are written in brackets ("[::1]:29500") and stored without them.
struct HostPort {
  std::string host;
  int port = 0;

  // "host:port", bracketing an IPv6 host.
  std::string to_string() const;
};

// Parses "host:port" or "[v6]:port" (port 0 .. 65535). Throws InvalidArgumentError naming
// `what` and the text when it is not one.
HostPort parse_host_port(const std::string& text, const std::string& what);

struct LauncherEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string rdzv = "";                          // DTRAIN_RDZV as given
  int64_t generation = 1;                         // DTRAIN_RDZV_GENERATION
  std::optional<HostPort> master = std::nullopt;  // DTRAIN_MASTER_ADDR/_PORT, if a service
  std::string run_id = "default";                 // DTRAIN_RUN_ID

  // True when DTRAIN_RDZV names a coordination service (no "scheme://").
  bool rdzv_is_coordinator() const;
  // The variables that describe this worker, as (name, value) pairs (what the launcher sets).
  std::vector<std::pair<std::string, std::string>> to_variables() const;

  // True when this process was started by `dtrain launch` (DTRAIN_RANK is set).
  static bool present();
  // Reads the contract from the process environment. Throws InvalidArgumentError naming the
  // variable and its value when one is missing, not a number, out of range, or inconsistent with
  // the others (rank >= world size, local rank >= local world size, ...).
  static LauncherEnv from_environment();
  // The same, reading variables through `lookup` (returns null for unset); for tests.
  static LauncherEnv from_lookup(const std::function<const char*(const char*)>& lookup);
};

}  // namespace dtrain::distribute
