// The gRPC settings every dtrain service and client uses, and the handler wrapper of its services
// (private to src/distribute; only .cc files that already speak gRPC include it): keepalive so a
// lost peer is noticed in seconds, message limits, no proxy, no port sharing, quick reconnects.
// Stateless; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <exception>
#include <memory>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"

namespace dtrain::distribute {

// A client channel to `address` on its own TCP connection (failures stay isolated), reconnecting
// after 100 ms, backing off up to `max_reconnect_backoff_ms`. A connection attempt that has not
// received the server's HTTP/2 settings after `min_connect_timeout_ms` (or the current backoff,
// when longer) is abandoned; servers that answer late (etcd at start, on a loaded machine) need
// more than the default.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            int max_reconnect_backoff_ms,
                                            int min_connect_timeout_ms = 100);

// Adds a listening port on `address` (its bound port lands in *bound after BuildAndStart) and
// the server settings: no SO_REUSEPORT (two services on one port must be an error, not a silent
// split of the clients), clients' keepalive pings accepted, message limits.
void configure_server(grpc::ServerBuilder& builder, const std::string& address, int* bound);

// Runs a service handler's body `fn` and turns a dtrain Error into the gRPC status with the same
// code and message (any other exception: INTERNAL), so clients raise what the server raised.
// The body runs with the process's flush-denormals setting (gRPC's threads are its own).
template <class Fn>
grpc::Status serve_call(Fn&& fn) {
  follow_flush_denormals();
  try {
    fn();
    return grpc::Status::OK;
  } catch (const Error& e) {
    return grpc::Status(static_cast<grpc::StatusCode>(e.code()), e.what());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

}  // namespace dtrain::distribute
