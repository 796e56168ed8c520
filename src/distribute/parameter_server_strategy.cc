// ParameterServerStrategy (the clients of the parameter servers, checkpoint save/merge/restore,
// the Worker service a worker process serves) and ClusterCoordinator (one dispatcher thread per
// worker task over a shared closure queue). gRPC statuses become dtrain errors naming host:port
// here. Thread-safe as the header says: the stubs are thread-safe, the coordinator's queue is
// guarded by one mutex.
#include "dtrain/distribute/parameter_server_strategy.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "distribute/coordination_common.h"
#include "distribute/grpc_settings.h"
#include "distribute/parameter_server_common.h"
#include "dtrain/checkpoint/merge_bundles.h"
#include "dtrain/core/file.h"

namespace dtrain::distribute {
namespace {

using namespace ps_detail;  // NOLINT
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

thread_local int64_t t_closure_id = -1;

std::exception_ptr make_error(ErrorCode code, const std::string& message) {
  try {
    dtrain::throw_error(code, message);
  } catch (...) {
    return std::current_exception();
  }
}

// Workers and the chief reconnect to a restarted server within half a second.
std::shared_ptr<grpc::Channel> ps_channel(const std::string& address) {
  return make_channel(address, 500);
}

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
// Worker service

namespace {

class WorkerService final : public pb::Worker::Service {
 public:
  std::mutex mu;
  std::condition_variable cv;
  bool shutdown = false;
  Clock::time_point last_activity = Clock::now();
  std::map<std::string, ClosureFunction> functions;
  std::mutex run_mu;  // one closure at a time: the worker's model is not thread-safe

  void touch() {
    std::lock_guard lock(mu);
    last_activity = Clock::now();
  }

  grpc::Status Run(grpc::ServerContext*, const pb::RunRequest* req,
                   pb::RunResponse* resp) override {
    touch();
    std::lock_guard run_lock(run_mu);
    try {
      check_protocol(req->protocol(), kParameterServerProtocol, "worker");
      ClosureFunction fn;
      {
        std::lock_guard lock(mu);
        const auto it = functions.find(req->function());
        if (it == functions.end()) {
          throw NotFoundError(str_cat("worker: no function '", req->function(),
                                      "' is registered (register_function before serve)"));
        }
        fn = it->second;
      }
      t_closure_id = req->closure_id();
      const std::vector<int64_t> args(req->args().begin(), req->args().end());
      const std::vector<double> results = fn(args);
      t_closure_id = -1;
      for (double r : results) resp->add_results(r);
    } catch (const Error& e) {
      t_closure_id = -1;
      resp->set_error_code(static_cast<int32_t>(e.code()));
      resp->set_error_message(e.what());
      resp->set_ps_failure(e.code() == ErrorCode::kUnavailable ||
                           e.code() == ErrorCode::kDeadlineExceeded);
    } catch (const std::exception& e) {
      t_closure_id = -1;
      resp->set_error_code(static_cast<int32_t>(ErrorCode::kInternal));
      resp->set_error_message(e.what());
    }
    touch();
    return grpc::Status::OK;
  }

  grpc::Status Ping(grpc::ServerContext*, const pb::PingRequest*, pb::PingResponse* resp) override {
    touch();
    resp->set_protocol(kParameterServerProtocol);
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext*, const pb::ShutdownRequest*,
                        pb::ShutdownResponse*) override {
    {
      std::lock_guard lock(mu);
      shutdown = true;
    }
    cv.notify_all();
    return grpc::Status::OK;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ParameterServerStrategy

struct ParameterServerStrategy::Impl {
  std::vector<std::unique_ptr<pb::ParameterServer::Stub>> ps;
  std::vector<std::string> ps_names;  // "/job:ps/replica:0/task:i at host:port"
  std::string signature;
  bool write_iteration_on_0 = true;
  optim::OptimizerConfig optimizer;
  WorkerService worker;

  template <class Rpc>
  void call(size_t i, const char* what, milliseconds within, Rpc&& rpc,
            bool wait_for_ready = false) {
    grpc::ClientContext ctx;
    const auto deadline = std::chrono::system_clock::now() + within;
    ctx.set_deadline(deadline);
    ctx.set_wait_for_ready(wait_for_ready);
    const grpc::Status status = rpc(&ctx, ps[i].get());
    if (status.ok()) return;
    const auto code = static_cast<ErrorCode>(status.error_code());
    if (code == ErrorCode::kUnavailable || code == ErrorCode::kCancelled) {
      throw UnavailableError(
          str_cat(ps_names[i], " unavailable (", what, "): ", status.error_message()));
    }
    if (code == ErrorCode::kDeadlineExceeded && std::chrono::system_clock::now() >= deadline) {
      throw DeadlineExceededError(
          str_cat(ps_names[i], ": no answer to ", what, " within ", within.count(), " ms"));
    }
    dtrain::throw_error(code, status.error_message());
  }
};

ParameterServerStrategy::ParameterServerStrategy(const ParameterServerStrategyOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {
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
    impl_->ps.push_back(pb::ParameterServer::NewStub(ps_channel(a)));
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
  // Wait for every server first: a clear error naming the one that is not there.
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::StatusRequest req;
    pb::StatusResponse resp;
    try {
      impl_->call(
          i, "status", options_.connect_timeout,
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
    to_proto(optimizer, reqs[i].mutable_optimizer());
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
  for (size_t i = 0; i < reqs.size(); ++i) {
    pb::RegisterResponse resp;
    impl_->call(i, "register", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Register(c, reqs[i], &resp);
                });
  }
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

void ParameterServerStrategy::save(const std::string& prefix) {
  DTRAIN_CHECK(!prefix.empty(), "ParameterServerStrategy::save: empty prefix");
  const std::string temp = prefix + "_temp";
  std::vector<std::string> parts;
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    parts.push_back(str_cat(temp, "/part-", i));
    pb::SaveRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_prefix(parts.back());
    pb::SaveResponse resp;
    impl_->call(i, "save", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Save(c, req, &resp);
                });
  }
  checkpoint::merge_bundles(parts, prefix);
  std::error_code ec;
  std::filesystem::remove_all(temp, ec);
  // The state file names the merged checkpoint, as tf.train.CheckpointManager writes it.
  const std::filesystem::path p(prefix);
  const std::string base = p.filename().string();
  write_file_atomically((p.parent_path() / "checkpoint").string(),
                        str_cat("model_checkpoint_path: \"", base,
                                "\"\nall_model_checkpoint_paths: \"", base, "\"\n"));
}

void ParameterServerStrategy::restore(const std::string& prefix) {
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::RestoreRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_prefix(prefix);
    pb::RestoreResponse resp;
    impl_->call(i, "restore", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Restore(c, req, &resp);
                });
  }
}

void ParameterServerStrategy::recover(std::span<Variable* const> vars, const std::string& prefix) {
  create_variables(vars, impl_->optimizer);  // waits for every server, up to connect_timeout
  if (!prefix.empty()) restore(prefix);
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

// ---------------------------------------------------------------------------------------------
// RemoteValue and ClusterCoordinator

struct RemoteValue::State {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  std::vector<double> results;
  std::exception_ptr error;

  void finish(std::vector<double> r, std::exception_ptr e) {
    {
      std::lock_guard lock(mu);
      if (done) return;
      done = true;
      results = std::move(r);
      error = std::move(e);
    }
    cv.notify_all();
  }
};

std::vector<double> RemoteValue::fetch() const {
  DTRAIN_CHECK(state_ != nullptr, "RemoteValue::fetch: not from schedule()");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->results;
}

bool RemoteValue::ready() const {
  if (state_ == nullptr) return false;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

struct ClusterCoordinator::Impl {
  struct Closure {
    int64_t id;
    std::string function;
    std::vector<int64_t> args;
    std::shared_ptr<RemoteValue::State> value;
  };

  ParameterServerStrategy& strategy;
  ClusterCoordinatorOptions options;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<pb::Worker::Stub>> stubs;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Closure> queue;
  int in_flight = 0;
  std::exception_ptr error;       // the first closure error since the last join
  std::exception_ptr ps_failure;  // set until reset_error()
  bool stopping = false;
  std::vector<bool> up;
  Clock::time_point last_up = Clock::now();
  int64_t next_id = 1;
  CoordinatorStats stats;
  std::vector<std::thread> threads;

  Impl(ParameterServerStrategy& s, const ClusterCoordinatorOptions& o)
      : strategy(s), options(o), addresses(s.worker_addresses()) {
    for (const std::string& a : addresses) stubs.push_back(pb::Worker::NewStub(ps_channel(a)));
    up.assign(addresses.size(), false);
    stats.per_worker.assign(addresses.size(), 0);
  }

  // Fails every queued closure with `e` (lock held).
  void cancel_queue(const std::exception_ptr& e) {
    for (Closure& c : queue) c.value->finish({}, e);
    queue.clear();
  }

  bool probe(size_t w) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ctx.set_wait_for_ready(true);
    pb::PingRequest req;
    pb::PingResponse resp;
    return stubs[w]->Ping(&ctx, req, &resp).ok() && resp.protocol() == kParameterServerProtocol;
  }

  void dispatch(size_t w) {
    for (;;) {
      bool is_up;
      {
        std::lock_guard lock(mu);
        if (stopping) return;
        is_up = up[w];
      }
      if (!is_up) {
        if (probe(w)) {
          std::lock_guard lock(mu);
          up[w] = true;
          last_up = Clock::now();
          cv.notify_all();
        } else {
          std::unique_lock lock(mu);
          cv.wait_for(lock, options.probe_interval, [&] { return stopping; });
        }
        continue;
      }
      Closure closure;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || (!queue.empty() && !ps_failure); });
        if (stopping) return;
        closure = std::move(queue.front());
        queue.pop_front();
        ++in_flight;
      }
      pb::RunRequest req;
      req.set_protocol(kParameterServerProtocol);
      req.set_function(closure.function);
      for (int64_t a : closure.args) req.add_args(a);
      req.set_closure_id(closure.id);
      pb::RunResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + options.closure_timeout);
      const grpc::Status status = stubs[w]->Run(&ctx, req, &resp);
      std::lock_guard lock(mu);
      --in_flight;
      if (!status.ok()) {
        // The worker is lost (or hung past the deadline): the closure goes back to the front of
        // the queue for another worker; this one is probed until it answers again.
        up[w] = false;
        ++stats.worker_failures;
        ++stats.reassigned;
        if (stopping || ps_failure) {
          closure.value->finish(
              {}, ps_failure ? ps_failure
                             : make_error(ErrorCode::kUnavailable, "cluster coordinator stopped"));
        } else {
          queue.push_front(std::move(closure));
        }
        std::fprintf(stderr,
                     "ClusterCoordinator: worker /job:worker/task:%zu at %s lost (%s); "
                     "its closure is rescheduled\n",
                     w, addresses[w].c_str(), status.error_message().c_str());
        cv.notify_all();
        continue;
      }
      last_up = Clock::now();
      if (resp.error_code() != 0) {
        const auto code = static_cast<ErrorCode>(resp.error_code());
        std::exception_ptr e = make_error(code, str_cat(resp.error_message(), " [closure '",
                                                        closure.function, "' on worker ", w, "]"));
        if (resp.ps_failure() && !ps_failure) ps_failure = e;
        if (!error) error = e;
        closure.value->finish({}, e);
        cancel_queue(e);
      } else {
        closure.value->finish({resp.results().begin(), resp.results().end()}, nullptr);
        ++stats.completed;
        ++stats.per_worker[w];
      }
      cv.notify_all();
    }
  }
};

ClusterCoordinator::ClusterCoordinator(ParameterServerStrategy& strategy,
                                       const ClusterCoordinatorOptions& options) {
  if (!strategy.is_chief()) {
    throw FailedPreconditionError(
        "ClusterCoordinator: only the chief coordinates; workers call strategy.serve()");
  }
  impl_ = std::make_unique<Impl>(strategy, options);
  for (size_t w = 0; w < impl_->addresses.size(); ++w) {
    impl_->threads.emplace_back([impl = impl_.get(), w] { impl->dispatch(w); });
  }
}

ClusterCoordinator::~ClusterCoordinator() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
    impl_->cancel_queue(make_error(ErrorCode::kUnavailable, "cluster coordinator destroyed"));
  }
  impl_->cv.notify_all();
  for (std::thread& t : impl_->threads) t.join();
}

RemoteValue ClusterCoordinator::schedule(const std::string& function, std::vector<int64_t> args) {
  std::lock_guard lock(impl_->mu);
  if (impl_->ps_failure) std::rethrow_exception(impl_->ps_failure);
  RemoteValue rv;
  rv.state_ = std::make_shared<RemoteValue::State>();
  impl_->queue.push_back({impl_->next_id++, function, std::move(args), rv.state_});
  ++impl_->stats.scheduled;
  impl_->cv.notify_all();
  return rv;
}

void ClusterCoordinator::join() {
  std::unique_lock lock(impl_->mu);
  for (;;) {
    if (impl_->queue.empty() && impl_->in_flight == 0) break;
    impl_->cv.wait_for(lock, milliseconds(100));
    const bool any_up = std::find(impl_->up.begin(), impl_->up.end(), true) != impl_->up.end();
    if (!any_up && !impl_->queue.empty() &&
        Clock::now() - impl_->last_up > impl_->options.no_worker_timeout) {
      std::string list;
      for (const std::string& a : impl_->addresses) list += (list.empty() ? "" : ", ") + a;
      auto e = make_error(ErrorCode::kUnavailable,
                          str_cat("ClusterCoordinator: no worker reachable for ",
                                  impl_->options.no_worker_timeout.count(), " ms (", list, ")"));
      if (!impl_->error) impl_->error = e;
      impl_->cancel_queue(e);
    }
  }
  if (impl_->error) {
    std::exception_ptr e = impl_->error;
    impl_->error = nullptr;
    std::rethrow_exception(e);
  }
}

bool ClusterCoordinator::done() {
  std::lock_guard lock(impl_->mu);
  return impl_->queue.empty() && impl_->in_flight == 0;
}

void ClusterCoordinator::reset_error() {
  std::lock_guard lock(impl_->mu);
  impl_->ps_failure = nullptr;
  impl_->error = nullptr;
  impl_->cv.notify_all();
}

void ClusterCoordinator::shutdown_workers() {
  for (auto& stub : impl_->stubs) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    ctx.set_wait_for_ready(true);  // a channel in reconnect backoff would fail at once
    pb::ShutdownRequest req;
    pb::ShutdownResponse resp;
    stub->Shutdown(&ctx, req, &resp);  // best effort: a lost worker needs no shutdown
  }
}

CoordinatorStats ClusterCoordinator::stats() {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace dtrain::distribute
