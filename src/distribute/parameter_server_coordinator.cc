// RemoteValue and ClusterCoordinator (tf.distribute.experimental.coordinator): one dispatcher
// thread per worker task over a shared closure queue; a lost worker's closure goes back to the
// queue and the worker is probed until it answers again. Thread-safe: the queue and the
// workers' states are guarded by one mutex.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <thread>

#include "distribute/coordination_common.h"
#include "distribute/parameter_server_strategy_impl.h"

namespace dtrain::distribute {

using namespace ps_detail;  // NOLINT

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
