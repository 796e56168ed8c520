// ParameterServerStrategy: the clients of the parameter servers (registration, pull, push,
// statistics) and the Worker service loop a worker process serves. Checkpoints and recovery are
// in parameter_server_recovery.cc, ClusterCoordinator in parameter_server_coordinator.cc.
// Thread-safe as the header says: the stubs are thread-safe.
#include "dtrain/distribute/parameter_server_strategy.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "distribute/coordination_common.h"
#include "distribute/parameter_server_strategy_impl.h"

namespace dtrain::distribute {
namespace {

using namespace ps_detail;  // NOLINT

std::string hex64(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

// FNV-1a over the placement: equal models and clusters give equal signatures.
std::string signature_of(const std::vector<VariablePlacement>& placement, int num_ps) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(&num_ps, sizeof(num_ps));
  for (const VariablePlacement& v : placement) {
    for (const VariableShard& s : v.shards) {
      mix(s.name.data(), s.name.size());
      const int32_t dt = static_cast<int32_t>(v.dtype);
      mix(&dt, sizeof(dt));
      for (int64_t d : s.shape) mix(&d, sizeof(d));
      mix(&s.ps, sizeof(s.ps));
    }
  }
  return hex64(h);
}

void fill_spec(const VariableShard& s, DType dtype, pb::VariableSpecProto* out) {
  out->set_name(s.name);
  out->set_dtype(static_cast<int32_t>(dtype));
  for (int64_t d : s.shape) out->add_shape(d);
}

// Bytes of rows [b, e) of `t` (dimension 0); a scalar is all of it.
std::pair<char*, size_t> row_bytes(const Tensor& t, int64_t b, int64_t e) {
  char* base = static_cast<char*>(const_cast<void*>(t.raw_data()));
  if (t.rank() == 0) return {base, static_cast<size_t>(t.nbytes())};
  const size_t row = static_cast<size_t>(t.nbytes()) / static_cast<size_t>(t.dim(0));
  return {base + row * static_cast<size_t>(b), row * static_cast<size_t>(e - b)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ParameterServerStrategy

ParameterServerStrategy::ParameterServerStrategy(const ParameterServerStrategyOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  DTRAIN_CHECK(options.reconnect_grace.count() >= 0,
               "ParameterServerStrategy: reconnect_grace must be >= 0 ms, got ",
               options.reconnect_grace.count());
  impl_->reconnect_grace = options.reconnect_grace;
  cluster_ = options.cluster ? *options.cluster : resolve_cluster();
  auto job = [&](const char* name) -> std::vector<std::string> {
    const auto it = cluster_.jobs.find(name);
    return it == cluster_.jobs.end() ? std::vector<std::string>{} : it->second;
  };
  ps_addresses_ = job("ps");
  worker_addresses_ = job("worker");
  DTRAIN_CHECK(!ps_addresses_.empty(), "ParameterServerStrategy: the cluster (from ",
               cluster_.source,
               ") has no \"ps\" job; TF_CONFIG needs e.g. \"ps\": [\"host:port\"]");
  DTRAIN_CHECK(!worker_addresses_.empty(), "ParameterServerStrategy: the cluster (from ",
               cluster_.source, ") has no \"worker\" job");
  DTRAIN_CHECK(job("chief").size() == 1, "ParameterServerStrategy: the cluster (from ",
               cluster_.source, ") needs exactly one \"chief\" task, which coordinates");
  DTRAIN_CHECK(cluster_.task_type == "chief" || cluster_.task_type == "worker",
               "ParameterServerStrategy: this task is \"", cluster_.task_type,
               "\"; a ps task runs `dtrain ps --port P` (distribute::ParameterServer), not the "
               "strategy");
  for (size_t i = 0; i < ps_addresses_.size(); ++i) {
    const std::string& a = ps_addresses_[i];
    parse_host_port(a, str_cat("ps task ", i, " address"));
    impl_->channels.push_back(ps_channel(a));
    impl_->ps.push_back(pb::ParameterServer::NewStub(impl_->channels.back()));
    impl_->ps_names.push_back(str_cat("parameter server /job:ps/task:", i, " at ", a));
  }
  for (size_t i = 0; i < worker_addresses_.size(); ++i) {
    parse_host_port(worker_addresses_[i], str_cat("worker task ", i, " address"));
  }
}

ParameterServerStrategy::~ParameterServerStrategy() = default;

int64_t ParameterServerStrategy::current_closure_id() { return t_closure_id; }

void ParameterServerStrategy::attach_variables(std::span<Variable* const> vars) {
  for (Variable* v : vars) {
    DTRAIN_CHECK(v != nullptr && v->dtype() == DType::kFloat32,
                 "ParameterServerStrategy: variables must be float32; '",
                 v ? v->name() : std::string("null"), "' is not");
  }
  placement_ = place_variables(vars, num_ps(), options_.partitioner);
  impl_->signature = signature_of(placement_, num_ps());
}

void ParameterServerStrategy::create_variables(std::span<Variable* const> vars,
                                               const optim::OptimizerConfig& optimizer) {
  attach_variables(vars);
  impl_->optimizer = optimizer;
  optim::optimizer_from_config(optimizer);  // validates here, with the chief's message
  // Each server updates its own variables: a global norm over all of them, and exclusion names
  // (not in the wire format), are not available there.
  if (const double* c = optimizer.find("global_clipnorm"); c != nullptr && *c > 0.0) {
    throw UnimplementedError(
        "ParameterServerStrategy: global_clipnorm needs the norm of every gradient, but each "
        "parameter server updates only its own variables; use clipnorm or clipvalue");
  }
  if (!optimizer.exclude_from_weight_decay.empty()) {
    throw UnimplementedError(
        "ParameterServerStrategy: exclude_from_weight_decay is not carried to the parameter "
        "servers");
  }
  register_variables(vars, Clock::now() + options_.connect_timeout);
}

std::vector<uint64_t> ParameterServerStrategy::register_variables(std::span<Variable* const> vars,
                                                                  Clock::time_point deadline) {
  DTRAIN_CHECK(vars.size() == placement_.size(), "ParameterServerStrategy: got ", vars.size(),
               " variables, the placement has ", placement_.size());
  // Wait for every server first: a clear error naming the one that is not there.
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::StatusRequest req;
    pb::StatusResponse resp;
    const auto left = std::max(milliseconds(1),
                               std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    try {
      impl_->call(
          i, "status", left,
          [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
            return s->Status(c, req, &resp);
          },
          /*wait_for_ready=*/true);
    } catch (const DeadlineExceededError&) {
      throw UnavailableError(str_cat(impl_->ps_names[i], " did not answer within ",
                                     options_.connect_timeout.count(),
                                     " ms (is `dtrain ps` running there?)"));
    }
  }
  std::vector<pb::RegisterRequest> reqs(impl_->ps.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].set_protocol(kParameterServerProtocol);
    to_proto(impl_->optimizer, reqs[i].mutable_optimizer());
    reqs[i].set_write_iteration(i == 0);
    reqs[i].set_signature(impl_->signature);
  }
  for (size_t v = 0; v < placement_.size(); ++v) {
    for (const VariableShard& s : placement_[v].shards) {
      pb::RegisterRequest& r = reqs[static_cast<size_t>(s.ps)];
      fill_spec(s, placement_[v].dtype, r.add_specs());
      pb::TensorProto* t = r.add_values();
      t->set_name(s.name);
      t->set_dtype(static_cast<int32_t>(placement_[v].dtype));
      for (int64_t d : s.shape) t->add_shape(d);
      const auto [p, n] = row_bytes(vars[v]->tensor(), s.row_begin, s.row_end);
      t->set_data(p, n);
    }
  }
  std::vector<uint64_t> incarnations(reqs.size(), 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    pb::RegisterResponse resp;
    impl_->call(i, "register", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Register(c, reqs[i], &resp);
                });
    incarnations[i] = resp.incarnation();
  }
  return incarnations;
}

PullToken ParameterServerStrategy::pull(std::span<Variable* const> vars) {
  DTRAIN_CHECK(vars.size() == placement_.size(), "ParameterServerStrategy::pull: got ", vars.size(),
               " variables, the placement has ", placement_.size(),
               " (call create_variables / attach_variables with the same list)");
  PullToken token;
  token.versions.assign(impl_->ps.size(), 0);
  token.incarnations.assign(impl_->ps.size(), 0);
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::PullRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_signature(impl_->signature);
    std::vector<std::pair<size_t, const VariableShard*>> wanted;
    for (size_t v = 0; v < placement_.size(); ++v) {
      for (const VariableShard& s : placement_[v].shards) {
        if (static_cast<size_t>(s.ps) != i) continue;
        fill_spec(s, placement_[v].dtype, req.add_specs());
        wanted.emplace_back(v, &s);
      }
    }
    if (wanted.empty()) continue;
    pb::PullResponse resp;
    impl_->call(i, "pull", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Pull(c, req, &resp);
                });
    DTRAIN_CHECK(resp.values_size() == static_cast<int>(wanted.size()), impl_->ps_names[i],
                 " answered a pull of ", wanted.size(), " tensors with ", resp.values_size());
    for (size_t k = 0; k < wanted.size(); ++k) {
      const auto [v, s] = wanted[k];
      DTRAIN_CHECK(vars[v] != nullptr && vars[v]->name() == placement_[v].name &&
                       vars[v]->shape() == placement_[v].shape,
                   "ParameterServerStrategy::pull: variable ", v, " is not '", placement_[v].name,
                   "' ", placement_[v].shape.to_string());
      const auto [p, n] = row_bytes(vars[v]->tensor(), s->row_begin, s->row_end);
      const std::string& data = resp.values(static_cast<int>(k)).data();
      DTRAIN_CHECK(data.size() == n, impl_->ps_names[i], ": '", s->name, "' came with ",
                   data.size(), " bytes, expected ", n);
      std::memcpy(p, data.data(), n);
    }
    token.versions[i] = resp.version();
    token.incarnations[i] = resp.incarnation();
  }
  return token;
}

PushResult ParameterServerStrategy::push(const PullToken& token, std::span<const Tensor> grads,
                                         const PushOptions& options) {
  DTRAIN_CHECK(grads.size() == placement_.size(), "ParameterServerStrategy::push: got ",
               grads.size(), " gradients for ", placement_.size(), " variables");
  DTRAIN_CHECK(token.versions.size() == impl_->ps.size(),
               "ParameterServerStrategy::push: the token does not come from pull()");
  const auto start = Clock::now();
  const int64_t closure = options.closure_id >= 0 ? options.closure_id : t_closure_id;
  PushResult result;
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::PushRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_signature(impl_->signature);
    req.set_pulled_version(token.versions[i]);
    req.set_incarnation(token.incarnations[i]);
    req.set_closure_id(closure);
    if (options_.synchronous) {
      req.set_num_parts(options.num_parts);
      req.set_part(options.part);
      req.set_step(options.step);
    }
    for (size_t v = 0; v < placement_.size(); ++v) {
      const Tensor& g = grads[v];
      if (!g.defined()) continue;
      DTRAIN_CHECK(g.shape() == placement_[v].shape && g.dtype() == placement_[v].dtype,
                   "ParameterServerStrategy::push: gradient of '", placement_[v].name, "' is ",
                   g.shape().to_string(), ", the variable is ", placement_[v].shape.to_string());
      for (const VariableShard& s : placement_[v].shards) {
        if (static_cast<size_t>(s.ps) != i) continue;
        pb::TensorProto* t = req.add_gradients();
        t->set_name(s.name);
        t->set_dtype(static_cast<int32_t>(g.dtype()));
        for (int64_t d : s.shape) t->add_shape(d);
        const auto [p, n] = row_bytes(g, s.row_begin, s.row_end);
        t->set_data(p, n);
      }
    }
    if (req.gradients_size() == 0 && !options_.synchronous) continue;
    pb::PushResponse resp;
    impl_->call(i, "push", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Push(c, req, &resp);
                });
    result.staleness = std::max(result.staleness, resp.staleness());
  }
  result.push_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return result;
}

std::vector<ParameterServerStats> ParameterServerStrategy::server_stats() {
  std::vector<ParameterServerStats> out;
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::StatusRequest req;
    pb::StatusResponse r;
    impl_->call(i, "status", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Status(c, req, &r);
                });
    out.push_back({.incarnation = r.incarnation(),
                   .initialized = r.initialized(),
                   .version = r.version(),
                   .num_variables = r.num_variables(),
                   .bytes = r.bytes(),
                   .pushes = r.pushes(),
                   .staleness_sum = r.staleness_sum(),
                   .staleness_max = r.staleness_max(),
                   .duplicates = r.duplicates()});
  }
  return out;
}

void ParameterServerStrategy::register_function(const std::string& name, ClosureFunction fn) {
  DTRAIN_CHECK(fn != nullptr, "register_function: '", name, "' is empty");
  std::lock_guard lock(impl_->worker.mu);
  impl_->worker.functions[name] = std::move(fn);
}

void ParameterServerStrategy::serve() {
  if (cluster_.task_type != "worker") {
    throw FailedPreconditionError(str_cat("ParameterServerStrategy::serve: this task is \"",
                                          cluster_.task_type, "\"; only workers serve"));
  }
  const std::string& address = worker_addresses_.at(static_cast<size_t>(cluster_.task_index));
  WorkerService& w = impl_->worker;
  {
    std::lock_guard lock(w.mu);
    w.shutdown = false;
    w.last_activity = Clock::now();
  }
  grpc::ServerBuilder builder;
  int bound = 0;
  configure_server(builder, address, &bound);
  builder.RegisterService(&w);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    throw UnavailableError(
        str_cat("worker /job:worker/task:", cluster_.task_index, ": cannot listen on ", address));
  }
  bool idle = false;
  {
    std::unique_lock lock(w.mu);
    while (!w.shutdown) {
      w.cv.wait_for(lock, milliseconds(200));
      if (options_.worker_idle_timeout.count() > 0 &&
          Clock::now() - w.last_activity > options_.worker_idle_timeout) {
        idle = true;
        break;
      }
    }
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  if (idle) {
    throw DeadlineExceededError(str_cat("worker /job:worker/task:", cluster_.task_index,
                                        ": nothing from the chief for ",
                                        options_.worker_idle_timeout.count(), " ms"));
  }
}

}  // namespace dtrain::distribute
