// Parameter servers (tf.distribute.experimental.ParameterServerStrategy's "ps" tasks): a gRPC
// server that holds a share of the model's variables and the optimizer state for them, answers
// pulls with current values, applies pushed gradients (asynchronously, or summed over the parts
// of one synchronous step), and writes or reads its shard of a checkpoint. `dtrain ps --port P`
// runs one; tests run them in-process. Also the placement of variables onto servers, which
// every process of a job computes identically.
//
//   distribute::ParameterServer ps({.address = "127.0.0.1:0"});   // serves until stop()
//
// ParameterServer is thread-safe: handlers run on gRPC threads; pulls share a lock, pushes,
// saves and restores take it exclusively. place_variables is a pure function.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/shape.h"

namespace dtrain::distribute {

// Version of the messages in proto/parameter_server.proto. A request with another version is
// refused with FailedPreconditionError naming both.
inline constexpr int kParameterServerProtocol = 1;

struct ParameterServerOptions {
  // host:port to listen on; port 0 picks a free one (see port()).
  std::string address = "127.0.0.1:0";
  // fsync checkpoint shards (false only for tests and benchmarks on scratch space).
  bool sync_to_disk = true;
};

// Statistics of one server since its variables were (re)registered.
struct ParameterServerStats {
  uint64_t incarnation = 0;  // random per process start: a restarted server has a new one
  bool initialized = false;  // the chief has registered variables
  int64_t version = 0;       // updates applied
  int64_t num_variables = 0;
  int64_t bytes = 0;          // bytes of variables (slots not counted)
  int64_t pushes = 0;         // gradient pushes applied (async) or parts received (sync)
  int64_t staleness_sum = 0;  // over pushes: version at push - version the worker pulled
  int64_t staleness_max = 0;
  int64_t duplicates = 0;  // pushes ignored because their closure was already applied
};

class ParameterServer {
 public:
  // Starts serving on options.address. Throws UnavailableError naming the address when it
  // cannot listen there, InvalidArgumentError when the address has no port.
  explicit ParameterServer(const ParameterServerOptions& options = {});
  // Calls stop().
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  int port() const;
  // host:port clients on this machine connect to.
  std::string address() const;
  // Blocks until stop() is called (from another thread or a signal handler's helper thread).
  void wait();
  // Stops serving; in-flight calls get at most two seconds. Idempotent.
  void stop();
  ParameterServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Splitting of large variables into shards along dimension 0, like
// tf.distribute.experimental.partitioners.FixedShardsPartitioner (shard i gets rows
// [i*n/k + min(i, n%k) ...] — np.array_split's rule: the first n % k shards get one extra row).
struct VariablePartitioner {
  int num_shards = 1;           // shards per partitioned variable; 1: never split
  int64_t min_bytes = 1 << 20;  // only variables of at least this many bytes are split
};

// One piece of a variable on one server.
struct VariableShard {
  int ps = 0;             // index of the server in the cluster's "ps" job
  std::string name;       // the variable's name, or "<name>/part_<i>" for shard i of several
  int64_t row_begin = 0;  // rows [row_begin, row_end) of dimension 0 (whole variable: 0, dim 0)
  int64_t row_end = 0;
  Shape shape;  // the shard's shape
};

// Where one variable lives.
struct VariablePlacement {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  std::vector<VariableShard> shards;  // one unless partitioned, in row order
};

// Places `vars` onto `num_ps` servers: variables (or their shards) in decreasing size, each onto
// the server with the fewest bytes so far (ties: the lower index), so servers end up balanced
// by size; equal inputs give equal placements in every process. Throws InvalidArgumentError for
// num_ps < 1, a null variable, duplicate names, or num_shards < 1.
std::vector<VariablePlacement> place_variables(std::span<Variable* const> vars, int num_ps,
                                               const VariablePartitioner& partitioner = {});

}  // namespace dtrain::distribute
