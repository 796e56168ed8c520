// CoordinationClient: the gRPC client of the coordination service, and the KeyValueStore behind
// rendezvous. One channel (its own TCP connection) per client; the generated stub is thread-safe,
// so every method may be called from any thread. gRPC statuses become dtrain errors here.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "coordination.grpc.pb.h"
#include "distribute/coordination_common.h"
#include "distribute/grpc_settings.h"
#include "dtrain/distribute/coordination.h"

namespace dtrain::distribute {
namespace {

namespace pb = ::dtrain::coordination;
using std::chrono::milliseconds;

// Waiting calls get this much beyond their own timeout before the client gives up on the
// server's answer (the server answers DEADLINE_EXCEEDED itself at the timeout).
constexpr milliseconds kWaitSlack = std::chrono::seconds(5);
constexpr milliseconds kMaxTimeout = std::chrono::hours(24);

milliseconds clamp_timeout(milliseconds t) { return std::clamp(t, milliseconds(0), kMaxTimeout); }

}  // namespace

struct CoordinationClient::Impl {
  std::string address;
  CoordinationClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Coordination::Stub> stub;

  // Background heartbeats.
  std::thread heartbeat_thread;
  std::mutex heartbeat_mu;
  std::condition_variable heartbeat_cv;
  bool heartbeat_stop = false;
  grpc::ClientContext* heartbeat_call = nullptr;  // in flight, cancelled by the destructor
  std::atomic<bool> heartbeat_failed{false};

  // Runs one RPC with a deadline `within` from now; throws the matching dtrain error.
  // `what` names the operation in messages. `on_context` may record the context.
  template <class Rpc>
  void call(const std::string& what, milliseconds within, Rpc&& rpc,
            const std::function<void(grpc::ClientContext*)>& on_context = nullptr) {
    grpc::ClientContext ctx;
    const auto deadline = std::chrono::system_clock::now() + within;
    ctx.set_deadline(deadline);
    if (on_context) on_context(&ctx);
    const grpc::Status status = rpc(&ctx);
    if (on_context) on_context(nullptr);
    if (status.ok()) return;
    const auto code = static_cast<ErrorCode>(status.error_code());
    if (code == ErrorCode::kUnavailable || code == ErrorCode::kCancelled) {
      throw UnavailableError(str_cat("coordination service at ", address, " unavailable (", what,
                                     "): ", status.error_message()));
    }
    if (code == ErrorCode::kDeadlineExceeded && std::chrono::system_clock::now() >= deadline) {
      // The client's own deadline, not the server's answer: the server did not respond.
      throw DeadlineExceededError(str_cat("coordination ", what, ": no answer from ", address,
                                          " within ", within.count(), " ms"));
    }
    dtrain::throw_error(code, status.error_message());
  }

  milliseconds wait_deadline(milliseconds timeout) const {
    return clamp_timeout(timeout) + std::min(options.rpc_timeout, kWaitSlack);
  }

  // Sends a heartbeat every interval (the constructor sent the first) until stopped.
  void heartbeat_loop() {
    auto last_ok = std::chrono::steady_clock::now();
    std::unique_lock lock(heartbeat_mu);
    while (!heartbeat_stop) {
      heartbeat_cv.wait_for(lock, options.heartbeat_interval, [&] { return heartbeat_stop; });
      if (heartbeat_stop) break;
      lock.unlock();
      try {
        pb::HeartbeatRequest req;
        req.set_task(options.heartbeat_task);
        pb::HeartbeatResponse resp;
        call(
            "heartbeat", std::min(options.rpc_timeout, options.heartbeat_timeout),
            [&](grpc::ClientContext* c) { return stub->Heartbeat(c, req, &resp); },
            [&](grpc::ClientContext* c) {
              std::lock_guard l(heartbeat_mu);
              heartbeat_call = c;
              if (c != nullptr && heartbeat_stop) c->TryCancel();  // stopped meanwhile
            });
        last_ok = std::chrono::steady_clock::now();
      } catch (const Error& e) {
        lock.lock();
        if (heartbeat_stop) break;
        if (std::chrono::steady_clock::now() - last_ok >= options.heartbeat_timeout) {
          heartbeat_failed = true;
          lock.unlock();
          if (options.on_heartbeat_failure) options.on_heartbeat_failure(e);
          return;
        }
        lock.unlock();
      }
      lock.lock();
    }
  }
};

CoordinationClient::CoordinationClient(const std::string& address,
                                       const CoordinationClientOptions& options)
    : impl_(std::make_unique<Impl>()) {
  parse_host_port(address, "coordination service address");  // validates
  impl_->address = address;
  impl_->options = options;
  // Reconnect quickly while the server is starting or coming back.
  impl_->channel = make_channel(address, 1000);
  const milliseconds connect = clamp_timeout(options.connect_timeout);
  if (!impl_->channel->WaitForConnected(std::chrono::system_clock::now() + connect)) {
    throw UnavailableError(str_cat("coordination service at ", address, " unreachable after ",
                                   connect.count(), " ms"));
  }
  impl_->stub = pb::Coordination::NewStub(impl_->channel);
  if (!options.heartbeat_task.empty()) {
    heartbeat(options.heartbeat_task);  // the server knows the task from the start
    impl_->heartbeat_thread = std::thread([impl = impl_.get()] { impl->heartbeat_loop(); });
  }
}

CoordinationClient::~CoordinationClient() {
  if (impl_->heartbeat_thread.joinable()) {
    {
      std::lock_guard lock(impl_->heartbeat_mu);
      impl_->heartbeat_stop = true;
      if (impl_->heartbeat_call != nullptr) impl_->heartbeat_call->TryCancel();
    }
    impl_->heartbeat_cv.notify_all();
    impl_->heartbeat_thread.join();
  }
}

const std::string& CoordinationClient::address() const { return impl_->address; }

std::string CoordinationClient::describe() const { return impl_->address; }

void CoordinationClient::set(const std::string& key, std::string_view value) {
  pb::SetRequest req;
  req.set_key(key);
  req.set_value(std::string(value));
  pb::SetResponse resp;
  impl_->call("set '" + key + "'", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->Set(c, req, &resp); });
}

std::string CoordinationClient::get(const std::string& key, milliseconds timeout) {
  pb::GetRequest req;
  req.set_key(key);
  req.set_timeout_ms(clamp_timeout(timeout).count());
  pb::GetResponse resp;
  impl_->call("get '" + key + "'", impl_->wait_deadline(timeout),
              [&](grpc::ClientContext* c) { return impl_->stub->Get(c, req, &resp); });
  return std::move(*resp.mutable_value());
}

int64_t CoordinationClient::add(const std::string& key, int64_t delta) {
  pb::AddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  pb::AddResponse resp;
  impl_->call("add '" + key + "'", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->Add(c, req, &resp); });
  return resp.value();
}

bool CoordinationClient::check(std::span<const std::string> keys) {
  try {
    wait(keys, milliseconds(0));
    return true;
  } catch (const DeadlineExceededError&) {
    return false;
  }
}

void CoordinationClient::wait(std::span<const std::string> keys, milliseconds timeout) {
  pb::WaitRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_timeout_ms(clamp_timeout(timeout).count());
  pb::WaitResponse resp;
  impl_->call("wait", impl_->wait_deadline(timeout),
              [&](grpc::ClientContext* c) { return impl_->stub->Wait(c, req, &resp); });
}

void CoordinationClient::barrier(const std::string& name, int count, milliseconds timeout) {
  pb::BarrierRequest req;
  req.set_name(name);
  req.set_count(count);
  req.set_timeout_ms(clamp_timeout(timeout).count());
  pb::BarrierResponse resp;
  impl_->call("barrier '" + name + "'", impl_->wait_deadline(timeout),
              [&](grpc::ClientContext* c) { return impl_->stub->Barrier(c, req, &resp); });
}

int64_t CoordinationClient::heartbeat(const std::string& task) {
  pb::HeartbeatRequest req;
  req.set_task(task);
  pb::HeartbeatResponse resp;
  impl_->call("heartbeat", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->Heartbeat(c, req, &resp); });
  return resp.generation();
}

std::map<std::string, milliseconds> CoordinationClient::heartbeat_ages() {
  pb::HealthRequest req;
  pb::HealthResponse resp;
  impl_->call("health", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->Health(c, req, &resp); });
  std::map<std::string, milliseconds> ages;
  for (const auto& [task, ms] : resp.ms_since_heartbeat()) ages[task] = milliseconds(ms);
  return ages;
}

bool CoordinationClient::heartbeat_failed() const { return impl_->heartbeat_failed; }

Membership CoordinationClient::join(const std::string& member, int count, milliseconds timeout) {
  return join(member, JoinOptions{.max_members = count, .timeout = timeout});
}

Membership CoordinationClient::join(const std::string& member, const JoinOptions& options) {
  pb::JoinRequest req;
  req.set_member(member);
  req.set_count(options.max_members);
  req.set_min_count(options.min_members);
  req.set_settle_ms(clamp_timeout(options.settle).count());
  req.set_timeout_ms(clamp_timeout(options.timeout).count());
  pb::JoinResponse resp;
  impl_->call("join", impl_->wait_deadline(options.timeout),
              [&](grpc::ClientContext* c) { return impl_->stub->Join(c, req, &resp); });
  return {.generation = resp.generation(),
          .members = {resp.members().begin(), resp.members().end()}};
}

Membership CoordinationClient::membership() {
  pb::GetMembershipRequest req;
  pb::JoinResponse resp;
  impl_->call("membership", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->GetMembership(c, req, &resp); });
  return {.generation = resp.generation(),
          .members = {resp.members().begin(), resp.members().end()},
          .joining = {resp.joining().begin(), resp.joining().end()}};
}

std::map<std::string, std::string> CoordinationClient::get_prefix(const std::string& prefix) {
  pb::GetPrefixRequest req;
  req.set_prefix(prefix);
  pb::GetPrefixResponse resp;
  impl_->call("get_prefix '" + prefix + "'", impl_->options.rpc_timeout,
              [&](grpc::ClientContext* c) { return impl_->stub->GetPrefix(c, req, &resp); });
  return {resp.values().begin(), resp.values().end()};
}

int64_t CoordinationClient::generation() { return membership().generation; }

}  // namespace dtrain::distribute
