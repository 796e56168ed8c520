// CoordinationServer: the gRPC service over a CoordinationBackend (in memory, or in etcd). Handlers
// run on gRPC's synchronous-server threads (one per in-flight call, created on demand), so a call
// blocked in get / barrier / join holds one thread and blocks nobody else. Thread-safe.
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "coordination.grpc.pb.h"
#include "distribute/coordination_common.h"
#include "distribute/coordination_state.h"
#include "distribute/etcd_coordination_state.h"
#include "distribute/grpc_settings.h"
#include "dtrain/distribute/coordination.h"

namespace dtrain::distribute {
namespace {

namespace pb = ::dtrain::coordination;
using std::chrono::milliseconds;

class Service final : public pb::Coordination::Service {
 public:
  explicit Service(CoordinationBackend& state) : state_(state) {}

  grpc::Status Set(grpc::ServerContext*, const pb::SetRequest* req, pb::SetResponse*) override {
    return serve_call([&] { state_.set(req->key(), req->value()); });
  }
  grpc::Status Get(grpc::ServerContext*, const pb::GetRequest* req,
                   pb::GetResponse* resp) override {
    return serve_call(
        [&] { resp->set_value(state_.get(req->key(), milliseconds(req->timeout_ms()))); });
  }
  grpc::Status Add(grpc::ServerContext*, const pb::AddRequest* req,
                   pb::AddResponse* resp) override {
    return serve_call([&] { resp->set_value(state_.add(req->key(), req->delta())); });
  }
  grpc::Status Wait(grpc::ServerContext*, const pb::WaitRequest* req, pb::WaitResponse*) override {
    return serve_call([&] {
      state_.wait({req->keys().begin(), req->keys().end()}, milliseconds(req->timeout_ms()));
    });
  }
  grpc::Status Barrier(grpc::ServerContext*, const pb::BarrierRequest* req,
                       pb::BarrierResponse*) override {
    return serve_call(
        [&] { state_.barrier(req->name(), req->count(), milliseconds(req->timeout_ms())); });
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    return serve_call([&] { resp->set_generation(state_.heartbeat(req->task())); });
  }
  grpc::Status Health(grpc::ServerContext*, const pb::HealthRequest*,
                      pb::HealthResponse* resp) override {
    return serve_call([&] {
      for (const auto& [task, age] : state_.heartbeat_ages()) {
        (*resp->mutable_ms_since_heartbeat())[task] = age.count();
      }
    });
  }
  grpc::Status Join(grpc::ServerContext*, const pb::JoinRequest* req,
                    pb::JoinResponse* resp) override {
    return serve_call([&] {
      to_proto(state_.join(req->member(), {.max_members = req->count(),
                                           .min_members = req->min_count(),
                                           .settle = milliseconds(req->settle_ms()),
                                           .timeout = milliseconds(req->timeout_ms())}),
               resp);
    });
  }
  grpc::Status GetMembership(grpc::ServerContext*, const pb::GetMembershipRequest*,
                             pb::JoinResponse* resp) override {
    return serve_call([&] { to_proto(state_.membership(), resp); });
  }

  grpc::Status GetPrefix(grpc::ServerContext*, const pb::GetPrefixRequest* req,
                         pb::GetPrefixResponse* resp) override {
    return serve_call([&] {
      for (auto& [k, v] : state_.get_prefix(req->prefix())) (*resp->mutable_values())[k] = v;
    });
  }

 private:
  static void to_proto(const Membership& m, pb::JoinResponse* resp) {
    resp->set_generation(m.generation);
    for (const auto& member : m.members) resp->add_members(member);
    for (const auto& member : m.joining) resp->add_joining(member);
  }

  CoordinationBackend& state_;
};

}  // namespace

struct CoordinationServer::Impl {
  explicit Impl(std::unique_ptr<CoordinationBackend> backend)
      : state(std::move(backend)), service(*state) {}
  std::unique_ptr<CoordinationBackend> state;
  Service service;
  std::unique_ptr<grpc::Server> server;
  std::string host;
  int port = 0;
  std::mutex stop_mu;
  bool stopped = false;
};

CoordinationServer::CoordinationServer(const CoordinationServerOptions& options) : impl_(nullptr) {
  const HostPort where = parse_host_port(options.address, "CoordinationServer address");
  std::unique_ptr<CoordinationBackend> backend;
  if (options.state_store.empty()) {
    backend = std::make_unique<CoordinationState>();
  } else {
    backend = make_etcd_coordination_state(options.state_store, options.state_prefix);
  }
  impl_ = std::make_unique<Impl>(std::move(backend));
  grpc::ServerBuilder builder;
  int bound = 0;
  configure_server(builder, options.address, &bound);
  builder.RegisterService(&impl_->service);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || bound == 0) {
    throw UnavailableError(str_cat("coordination service: cannot listen on ", options.address,
                                   " (address in use, or not an address of this host)"));
  }
  impl_->host = where.host;
  impl_->port = bound;
}

CoordinationServer::~CoordinationServer() { stop(); }

int CoordinationServer::port() const { return impl_->port; }

std::string CoordinationServer::address() const {
  // A wildcard address is not something to connect to; loopback reaches it from this host.
  HostPort hp{.host = impl_->host, .port = impl_->port};
  if (hp.host == "0.0.0.0" || hp.host.empty()) hp.host = "127.0.0.1";
  if (hp.host == "::") hp.host = "::1";
  return hp.to_string();
}

void CoordinationServer::stop() {
  std::lock_guard lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->state->stop();  // blocked handlers return UNAVAILABLE now
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->server->Wait();
}

std::map<std::string, std::chrono::milliseconds> CoordinationServer::heartbeat_ages() const {
  return impl_->state->heartbeat_ages();
}

Membership CoordinationServer::membership() const { return impl_->state->membership(); }

}  // namespace dtrain::distribute
