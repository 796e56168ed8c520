// Private to src/distribute: what the parts of ParameterServerStrategy share — the Worker service
// a worker process serves, the strategy's Impl (stubs of the servers and the call wrapper that
// turns gRPC statuses into dtrain errors naming host:port), and helpers the ClusterCoordinator
// uses too. Thread-safe as parameter_server_strategy.h says: the stubs are thread-safe, the
// worker service's state is guarded by its mutex.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distribute/grpc_settings.h"
#include "distribute/parameter_server_common.h"
#include "dtrain/distribute/parameter_server_strategy.h"

namespace dtrain::distribute::ps_detail {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The id of the closure this thread runs inside the Worker service (-1 outside).
inline thread_local int64_t t_closure_id = -1;

// `message` as the exception_ptr of the dtrain error with `code`.
inline std::exception_ptr make_error(ErrorCode code, const std::string& message) {
  try {
    dtrain::throw_error(code, message);
  } catch (...) {
    return std::current_exception();
  }
}

// Workers and the chief reconnect to a restarted server within half a second.
inline std::shared_ptr<grpc::Channel> ps_channel(const std::string& address) {
  return make_channel(address, 500);
}

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

}  // namespace dtrain::distribute::ps_detail

namespace dtrain::distribute {

struct ParameterServerStrategy::Impl {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<ps_detail::pb::ParameterServer::Stub>> ps;
  std::vector<std::string> ps_names;  // "/job:ps/replica:0/task:i at host:port"
  std::string signature;
  bool write_iteration_on_0 = true;
  optim::OptimizerConfig optimizer;
  std::chrono::milliseconds reconnect_grace{0};
  ps_detail::WorkerService worker;

  // A channel whose server went away sits in gRPC's reconnect backoff, where a fail-fast call
  // fails at once even when the server is back: give it up to reconnect_grace to reconnect.
  void await_connected(size_t i, std::chrono::milliseconds within) {
    if (channels[i]->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return;
    channels[i]->WaitForConnected(std::chrono::system_clock::now() +
                                  std::min(within, reconnect_grace));
  }

  template <class Rpc>
  void call(size_t i, const char* what, std::chrono::milliseconds within, Rpc&& rpc,
            bool wait_for_ready = false) {
    if (!wait_for_ready) await_connected(i, within);
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

}  // namespace dtrain::distribute
