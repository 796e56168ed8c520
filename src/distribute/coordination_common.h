// Settings shared by the coordination service's server and client (private to src/distribute).
// Constants only; thread-safe.
#pragma once

#include "dtrain/distribute/launcher_env.h"  // parse_host_port

namespace dtrain::distribute {

// Clients ping an idle connection this often, so a silently lost peer is noticed in about
// twice this time; the server accepts pings at half this interval.
inline constexpr int kKeepaliveTimeMs = 10'000;
inline constexpr int kKeepaliveTimeoutMs = 10'000;
// Rendezvous values are small, but a value may carry, e.g., a serialized config.
inline constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace dtrain::distribute
