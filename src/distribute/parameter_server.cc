// ParameterServer: the gRPC service of a "ps" task over the variables the chief registered, the
// optimizer that updates them, and their checkpoint shard; and place_variables. Handlers run on
// gRPC's synchronous-server threads; one shared_mutex guards the state (pulls shared; pushes,
// saves, restores and registration exclusive). Thread-safe.
#include "dtrain/distribute/parameter_server.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <unordered_set>

#include "distribute/coordination_common.h"
#include "distribute/grpc_settings.h"
#include "distribute/parameter_server_common.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::distribute {
namespace {

using namespace ps_detail;  // NOLINT: pb, to_proto, from_proto, serve_call

constexpr const char* kIterationKey = "iteration";

struct State {
  mutable std::shared_mutex mu;
  std::string address;  // for messages
  uint64_t incarnation = 0;
  bool sync_to_disk = true;
  bool initialized = false;
  std::string signature;
  std::map<std::string, std::unique_ptr<Variable>> vars;  // by name
  std::vector<Variable*> order;                           // registration order
  std::unique_ptr<optim::Optimizer> optimizer;
  bool write_iteration = false;
  int64_t version = 0;
  std::unordered_set<int64_t> applied;  // closure ids whose push was applied (async)
  // Synchronous step being accumulated: parts received, each part's gradients by name.
  int64_t sync_step = -1;
  std::map<int, std::vector<std::pair<Variable*, Tensor>>> sync_parts;
  std::unordered_set<int64_t> sync_done_steps;
  ParameterServerStats stats;

  std::string who() const { return str_cat("parameter server ", address); }

  void check_ready(const std::string& signature_in) const {
    if (!initialized) {
      // A restarted server: the chief must register and restore before anyone trains.
      throw UnavailableError(str_cat(who(),
                                     " holds no variables (restarted?): the chief must "
                                     "register them again (incarnation ",
                                     incarnation, ")"));
    }
    if (!signature_in.empty() && signature_in != signature) {
      throw FailedPreconditionError(
          str_cat(who(), ": the worker's model (signature ", signature_in,
                  ") differs from the one the chief registered (signature ", signature,
                  "); every task must build the same model"));
    }
  }

  Variable& find(const std::string& name, const Shape* shape, int32_t dtype) const {
    const auto it = vars.find(name);
    if (it == vars.end()) {
      throw InvalidArgumentError(str_cat(who(), " has no variable '", name,
                                         "' (the worker's model differs from the chief's, or the "
                                         "placement does)"));
    }
    Variable& v = *it->second;
    if (shape != nullptr && (*shape != v.shape() || dtype != static_cast<int32_t>(v.dtype()))) {
      throw InvalidArgumentError(
          str_cat(who(), ": variable '", name, "' is ", dtype_name(static_cast<DType>(dtype)), " ",
                  shape->to_string(), " on the worker but ", dtype_name(v.dtype()), " ",
                  v.shape().to_string(), " on the parameter server"));
    }
    return v;
  }

  void reset_stats() {
    stats = ParameterServerStats{};
    stats.incarnation = incarnation;
    stats.initialized = initialized;
    stats.num_variables = static_cast<int64_t>(order.size());
    for (Variable* v : order) stats.bytes += v->tensor().nbytes();
  }

  void apply(std::span<const Tensor> grads, std::span<Variable* const> targets) {
    optimizer->apply_gradients(grads, targets);
    ++version;
  }
};

class Service final : public pb::ParameterServer::Service {
 public:
  explicit Service(State& s) : s_(s) {}

  grpc::Status Register(grpc::ServerContext*, const pb::RegisterRequest* req,
                        pb::RegisterResponse* resp) override {
    return serve_call([&] {
      check_protocol(req->protocol(), kParameterServerProtocol, "parameter server");
      DTRAIN_CHECK(req->specs_size() == req->values_size(), s_.who(), ": Register carries ",
                   req->specs_size(), " specs and ", req->values_size(), " values");
      std::map<std::string, std::unique_ptr<Variable>> vars;
      std::vector<Variable*> order;
      for (int i = 0; i < req->specs_size(); ++i) {
        const pb::VariableSpecProto& spec = req->specs(i);
        Tensor value = from_proto(req->values(i), s_.who());
        DTRAIN_CHECK(value.shape() == shape_of(spec.shape()), s_.who(), ": variable '", spec.name(),
                     "' value does not match its spec");
        auto v = std::make_unique<Variable>(spec.name(), std::move(value), true);
        order.push_back(v.get());
        DTRAIN_CHECK(vars.emplace(spec.name(), std::move(v)).second, s_.who(), ": variable '",
                     spec.name(), "' registered twice");
      }
      std::unique_ptr<optim::Optimizer> optimizer =
          optim::optimizer_from_config(from_proto(req->optimizer()));
      if (!order.empty()) optimizer->build(order);
      std::unique_lock lock(s_.mu);
      s_.vars = std::move(vars);
      s_.order = std::move(order);
      s_.optimizer = std::move(optimizer);
      s_.write_iteration = req->write_iteration();
      s_.signature = req->signature();
      s_.version = 0;
      s_.applied.clear();
      s_.sync_step = -1;
      s_.sync_parts.clear();
      s_.sync_done_steps.clear();
      s_.initialized = true;
      s_.reset_stats();
      resp->set_incarnation(s_.incarnation);
    });
  }

  grpc::Status Pull(grpc::ServerContext*, const pb::PullRequest* req,
                    pb::PullResponse* resp) override {
    return serve_call([&] {
      check_protocol(req->protocol(), kParameterServerProtocol, "parameter server");
      std::shared_lock lock(s_.mu);
      s_.check_ready("");
      std::vector<Variable*> found;
      for (const pb::VariableSpecProto& spec : req->specs()) {
        const Shape shape = shape_of(spec.shape());
        found.push_back(&s_.find(spec.name(), &shape, spec.dtype()));
      }
      // Shapes first (the precise message), then the whole model's signature.
      s_.check_ready(req->signature());
      for (int i = 0; i < req->specs_size(); ++i) {
        to_proto(found[static_cast<size_t>(i)]->tensor(), req->specs(i).name(), resp->add_values());
      }
      resp->set_version(s_.version);
      resp->set_incarnation(s_.incarnation);
    });
  }

  grpc::Status Push(grpc::ServerContext*, const pb::PushRequest* req,
                    pb::PushResponse* resp) override {
    return serve_call([&] {
      check_protocol(req->protocol(), kParameterServerProtocol, "parameter server");
      // Decode outside the lock.
      std::vector<Tensor> grads;
      grads.reserve(static_cast<size_t>(req->gradients_size()));
      for (const pb::TensorProto& g : req->gradients()) grads.push_back(from_proto(g, s_.who()));
      std::unique_lock lock(s_.mu);
      s_.check_ready("");
      if (req->incarnation() != 0 && req->incarnation() != s_.incarnation) {
        throw UnavailableError(str_cat(s_.who(), " restarted since the worker pulled"));
      }
      std::vector<Variable*> targets;
      for (size_t i = 0; i < grads.size(); ++i) {
        const pb::TensorProto& g = req->gradients(static_cast<int>(i));
        targets.push_back(&s_.find(g.name(), &grads[i].shape(), g.dtype()));
      }
      s_.check_ready(req->signature());
      const int64_t staleness = std::max<int64_t>(0, s_.version - req->pulled_version());
      resp->set_staleness(staleness);
      if (req->num_parts() <= 0) {
        if (req->closure_id() >= 0 && !s_.applied.insert(req->closure_id()).second) {
          ++s_.stats.duplicates;
          resp->set_duplicate(true);
          resp->set_version(s_.version);
          return;
        }
        s_.apply(grads, targets);
      } else {
        accumulate(*req, std::move(grads), targets, resp);
        if (resp->duplicate()) return;
      }
      ++s_.stats.pushes;
      s_.stats.staleness_sum += staleness;
      s_.stats.staleness_max = std::max(s_.stats.staleness_max, staleness);
      resp->set_version(s_.version);
    });
  }

  grpc::Status Save(grpc::ServerContext*, const pb::SaveRequest* req,
                    pb::SaveResponse* resp) override {
    return serve_call([&] {
      check_protocol(req->protocol(), kParameterServerProtocol, "parameter server");
      std::unique_lock lock(s_.mu);
      s_.check_ready("");
      checkpoint::BundleWriter writer(req->prefix(), {.sync = s_.sync_to_disk});
      for (Variable* v : s_.order) writer.add(v->name(), v->tensor());
      for (Variable* slot : s_.optimizer->variables()) {
        if (slot == &s_.optimizer->iterations_variable()) continue;
        writer.add(slot->name(), slot->tensor());
      }
      if (s_.write_iteration)
        writer.add(kIterationKey, s_.optimizer->iterations_variable().tensor());
      writer.finish();
      resp->set_version(s_.version);
    });
  }

  grpc::Status Restore(grpc::ServerContext*, const pb::RestoreRequest* req,
                       pb::RestoreResponse* resp) override {
    return serve_call([&] {
      check_protocol(req->protocol(), kParameterServerProtocol, "parameter server");
      std::unique_lock lock(s_.mu);
      s_.check_ready("");
      const checkpoint::BundleReader reader(req->prefix());
      // Read everything first, so a failure leaves the variables as they were.
      std::vector<std::pair<Variable*, Tensor>> values;
      auto take = [&](Variable* v) {
        Tensor t = reader.read(v->name());
        DTRAIN_CHECK(t.shape() == v->shape() && t.dtype() == v->dtype(), s_.who(), ": checkpoint ",
                     req->prefix(), " has '", v->name(), "' as ", t.shape().to_string(),
                     ", the variable is ", v->shape().to_string());
        values.emplace_back(v, std::move(t));
      };
      for (Variable* v : s_.order) take(v);
      for (Variable* slot : s_.optimizer->variables()) {
        if (slot != &s_.optimizer->iterations_variable()) take(slot);
      }
      Tensor iteration;
      if (reader.contains(kIterationKey)) iteration = reader.read(kIterationKey);
      for (auto& [v, t] : values) v->assign(t);
      if (iteration.defined()) s_.optimizer->iterations_variable().assign(iteration);
      s_.version = 0;
      s_.applied.clear();
      s_.sync_step = -1;
      s_.sync_parts.clear();
      s_.sync_done_steps.clear();
      resp->set_version(s_.version);
    });
  }

  grpc::Status Status(grpc::ServerContext*, const pb::StatusRequest*,
                      pb::StatusResponse* resp) override {
    return serve_call([&] {
      std::shared_lock lock(s_.mu);
      const ParameterServerStats& st = s_.stats;
      resp->set_incarnation(s_.incarnation);
      resp->set_initialized(s_.initialized);
      resp->set_version(s_.version);
      resp->set_num_variables(st.num_variables);
      resp->set_bytes(st.bytes);
      resp->set_pushes(st.pushes);
      resp->set_staleness_sum(st.staleness_sum);
      resp->set_staleness_max(st.staleness_max);
      resp->set_duplicates(st.duplicates);
    });
  }

 private:
  // Synchronous mode: keeps part `part` of step `step`; when all parts are in, sums them in
  // part order and applies one update. Called with the lock held.
  void accumulate(const pb::PushRequest& req, std::vector<Tensor> grads,
                  const std::vector<Variable*>& targets, pb::PushResponse* resp) {
    if (s_.sync_done_steps.count(req.step()) != 0) {
      ++s_.stats.duplicates;
      resp->set_duplicate(true);
      resp->set_version(s_.version);
      return;
    }
    if (s_.sync_step != req.step()) {
      s_.sync_step = req.step();  // a new step; parts of an abandoned one are dropped
      s_.sync_parts.clear();
    }
    DTRAIN_CHECK(req.part() >= 0 && req.part() < req.num_parts(), s_.who(), ": part ", req.part(),
                 " of ", req.num_parts());
    auto& slot = s_.sync_parts[req.part()];
    if (!slot.empty()) {
      ++s_.stats.duplicates;
      resp->set_duplicate(true);
      resp->set_version(s_.version);
      return;
    }
    for (size_t i = 0; i < grads.size(); ++i) slot.emplace_back(targets[i], std::move(grads[i]));
    if (static_cast<int>(s_.sync_parts.size()) < req.num_parts()) return;
    // All parts: sum per variable in part order.
    std::map<Variable*, Tensor> sums;
    std::vector<Variable*> order;
    for (auto& [part, list] : s_.sync_parts) {
      for (auto& [v, g] : list) {
        auto [it, inserted] = sums.try_emplace(v);
        if (inserted) {
          it->second = g;
          order.push_back(v);
        } else {
          float* d = it->second.data<float>();
          const float* p = g.data<float>();
          for (int64_t k = 0, n = g.num_elements(); k < n; ++k) d[k] += p[k];
        }
      }
    }
    std::vector<Tensor> summed;
    for (Variable* v : order) summed.push_back(sums[v]);
    s_.apply(summed, order);
    s_.sync_parts.clear();
    s_.sync_done_steps.insert(req.step());
    s_.sync_step = -1;
  }

  State& s_;
};

}  // namespace

struct ParameterServer::Impl {
  State state;
  Service service{state};
  std::unique_ptr<grpc::Server> server;
  std::string host;
  int port = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
};

ParameterServer::ParameterServer(const ParameterServerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const HostPort where = parse_host_port(options.address, "parameter server address");
  std::random_device rd;
  impl_->state.incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
  impl_->state.sync_to_disk = options.sync_to_disk;
  impl_->state.reset_stats();
  grpc::ServerBuilder builder;
  int bound = 0;
  configure_server(builder, options.address, &bound);
  builder.RegisterService(&impl_->service);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || bound == 0) {
    throw UnavailableError(str_cat("parameter server: cannot listen on ", options.address,
                                   " (address in use, or not an address of this host)"));
  }
  impl_->host = where.host;
  impl_->port = bound;
  HostPort hp{.host = where.host, .port = bound};
  if (hp.host == "0.0.0.0" || hp.host.empty()) hp.host = "127.0.0.1";
  impl_->state.address = hp.to_string();
}

ParameterServer::~ParameterServer() { stop(); }

int ParameterServer::port() const { return impl_->port; }

std::string ParameterServer::address() const { return impl_->state.address; }

void ParameterServer::wait() {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->stopped; });
}

void ParameterServer::stop() {
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->server->Wait();
  impl_->cv.notify_all();
}

ParameterServerStats ParameterServer::stats() const {
  std::shared_lock lock(impl_->state.mu);
  ParameterServerStats s = impl_->state.stats;
  s.version = impl_->state.version;
  s.initialized = impl_->state.initialized;
  return s;
}

std::vector<VariablePlacement> place_variables(std::span<Variable* const> vars, int num_ps,
                                               const VariablePartitioner& partitioner) {
  DTRAIN_CHECK(num_ps >= 1, "place_variables: needs at least one parameter server, got ", num_ps);
  DTRAIN_CHECK(partitioner.num_shards >= 1, "place_variables: num_shards must be >= 1, got ",
               partitioner.num_shards);
  std::vector<VariablePlacement> out;
  std::unordered_set<std::string> names;
  struct Piece {
    size_t var;
    size_t shard;
    int64_t bytes;
  };
  std::vector<Piece> pieces;
  for (Variable* v : vars) {
    DTRAIN_CHECK(v != nullptr, "place_variables: null variable");
    DTRAIN_CHECK(names.insert(v->name()).second, "place_variables: two variables are named '",
                 v->name(), "'; parameter servers identify variables by name");
    VariablePlacement p{.name = v->name(), .shape = v->shape(), .dtype = v->dtype(), .shards = {}};
    const int64_t bytes = v->tensor().nbytes();
    const int64_t rows = v->shape().rank() > 0 ? v->shape()[0] : 1;
    const int k =
        (partitioner.num_shards > 1 && bytes >= partitioner.min_bytes && v->shape().rank() > 0)
            ? static_cast<int>(std::min<int64_t>(partitioner.num_shards, rows))
            : 1;
    int64_t begin = 0;
    for (int i = 0; i < k; ++i) {
      const int64_t n = rows / k + (i < rows % k ? 1 : 0);
      VariableShard s;
      s.name = k == 1 ? v->name() : str_cat(v->name(), "/part_", i);
      s.row_begin = begin;
      s.row_end = begin + n;
      s.shape = v->shape();
      if (s.shape.rank() > 0) s.shape[0] = n;
      begin += n;
      p.shards.push_back(s);
      pieces.push_back({out.size(), static_cast<size_t>(i),
                        s.shape.num_elements() * static_cast<int64_t>(dtype_size(v->dtype()))});
    }
    out.push_back(std::move(p));
  }
  // Largest first onto the least-loaded server; ties by (variable, shard) order.
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.bytes > b.bytes; });
  std::vector<int64_t> load(static_cast<size_t>(num_ps), 0);
  for (const Piece& piece : pieces) {
    const size_t ps =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out[piece.var].shards[piece.shard].ps = static_cast<int>(ps);
    load[ps] += piece.bytes;
  }
  return out;
}

}  // namespace dtrain::distribute
