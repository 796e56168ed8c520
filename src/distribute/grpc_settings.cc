// Shared gRPC settings.
#include "distribute/grpc_settings.h"

#include <grpc/support/log.h>

#include <cstdlib>
#include <mutex>

#include "distribute/coordination_common.h"

namespace dtrain::distribute {
namespace {

void drop_grpc_log(gpr_log_func_args*) {}

// gRPC's own log lines ("E1201 12:00:00.000 ... chttp2_server.cc:1181] ... bind ...") are for
// gRPC's developers, and they reached users before dtrain's one-line error about the same
// failure. They are dropped unless the user asks gRPC for them with GRPC_VERBOSITY or
// GRPC_TRACE (then gRPC logs to stderr as usual). Runs before the first channel or server.
void quiet_grpc_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("GRPC_VERBOSITY") != nullptr || std::getenv("GRPC_TRACE") != nullptr) return;
    gpr_set_log_function(drop_grpc_log);
  });
}

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            int max_reconnect_backoff_ms,
                                            int min_connect_timeout_ms) {
  quiet_grpc_logging();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);          // 127.0.0.1 must not go to a proxy
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // own connection: failures stay isolated
  // Reconnect quickly while the server is starting or coming back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, min_connect_timeout_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_reconnect_backoff_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void configure_server(grpc::ServerBuilder& builder, const std::string& address, int* bound) {
  quiet_grpc_logging();
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), bound);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Accept the clients' keepalive pings (a lost peer is detected in seconds, not hours).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kKeepaliveTimeMs / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
}

}  // namespace dtrain::distribute
