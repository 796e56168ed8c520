// The launcher's environment contract: parsing and formatting. Pure functions; thread-safe.
#include "dtrain/distribute/launcher_env.h"

#include <charconv>
#include <cstdlib>
#include <limits>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

// Parses a whole decimal integer in [lo, hi]; throws naming `what`.
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
    throw InvalidArgumentError(
        str_cat(what, "='", text, "': expected an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

}  // namespace

std::string HostPort::to_string() const {
  return host.find(':') != std::string::npos ? str_cat("[", host, "]:", port)
                                             : str_cat(host, ":", port);
}

HostPort parse_host_port(const std::string& text, const std::string& what) {
  const auto bad = [&](const char* why) {
    return InvalidArgumentError(
        str_cat(what, " '", text, "': ", why, " (expected host:port or [ipv6]:port)"));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) throw bad("no port");
  std::string host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') throw bad("unbalanced brackets");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    throw bad("an IPv6 host needs brackets");
  }
  const std::string port = text.substr(colon + 1);
  int64_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 0 || p > 65535) {
    throw bad("port is not a number in [0, 65535]");
  }
  return {.host = host, .port = static_cast<int>(p)};
}

bool LauncherEnv::rdzv_is_coordinator() const {
  return !rdzv.empty() && rdzv.find("://") == std::string::npos;
}

std::vector<std::pair<std::string, std::string>> LauncherEnv::to_variables() const {
  std::vector<std::pair<std::string, std::string>> v = {
      {kEnvRank, std::to_string(rank)},
      {kEnvWorldSize, std::to_string(world_size)},
      {kEnvLocalRank, std::to_string(local_rank)},
      {kEnvLocalWorldSize, std::to_string(local_world_size)},
      {kEnvNodeRank, std::to_string(node_rank)},
      {kEnvNnodes, std::to_string(nnodes)},
      {kEnvRdzv, rdzv},
      {kEnvRdzvGeneration, std::to_string(generation)},
      {kEnvRunId, run_id},
  };
  if (master) {
    v.emplace_back(kEnvMasterAddr, master->host);
    v.emplace_back(kEnvMasterPort, std::to_string(master->port));
  }
  return v;
}

bool LauncherEnv::present() { return std::getenv(kEnvRank) != nullptr; }

LauncherEnv LauncherEnv::from_environment() {
  return from_lookup([](const char* name) { return std::getenv(name); });
}

LauncherEnv LauncherEnv::from_lookup(const std::function<const char*(const char*)>& lookup) {
  const auto required = [&](const char* name) -> std::string {
    const char* v = lookup(name);
    if (v == nullptr) {
      throw InvalidArgumentError(str_cat("launcher environment: ", name,
                                         " is not set (start workers with `dtrain launch`)"));
    }
    return v;
  };
  const auto optional = [&](const char* name) -> std::optional<std::string> {
    const char* v = lookup(name);
    return v == nullptr ? std::nullopt : std::optional<std::string>(v);
  };
  constexpr int64_t kMaxInt = 1 << 30;
  LauncherEnv env;
  env.world_size = static_cast<int>(parse_int(required(kEnvWorldSize), kEnvWorldSize, 1, kMaxInt));
  env.rank = static_cast<int>(parse_int(required(kEnvRank), kEnvRank, 0, env.world_size - 1));
  env.local_world_size = static_cast<int>(
      parse_int(required(kEnvLocalWorldSize), kEnvLocalWorldSize, 1, env.world_size));
  env.local_rank = static_cast<int>(
      parse_int(required(kEnvLocalRank), kEnvLocalRank, 0, env.local_world_size - 1));
  env.nnodes = static_cast<int>(parse_int(required(kEnvNnodes), kEnvNnodes, 1, env.world_size));
  env.node_rank =
      static_cast<int>(parse_int(required(kEnvNodeRank), kEnvNodeRank, 0, env.nnodes - 1));
  env.rdzv = required(kEnvRdzv);
  if (env.rdzv.empty()) throw InvalidArgumentError(str_cat(kEnvRdzv, " is empty"));
  if (env.rdzv_is_coordinator()) parse_host_port(env.rdzv, kEnvRdzv);  // validates
  env.generation = parse_int(required(kEnvRdzvGeneration), kEnvRdzvGeneration, 0,
                             std::numeric_limits<int64_t>::max());
  const auto addr = optional(kEnvMasterAddr);
  const auto port = optional(kEnvMasterPort);
  if (addr.has_value() != port.has_value()) {
    throw InvalidArgumentError(str_cat("launcher environment: ", kEnvMasterAddr, " and ",
                                       kEnvMasterPort, " must be set together"));
  }
  if (addr) {
    if (addr->empty()) throw InvalidArgumentError(str_cat(kEnvMasterAddr, " is empty"));
    env.master = HostPort{.host = *addr,
                          .port = static_cast<int>(parse_int(*port, kEnvMasterPort, 1, 65535))};
  }
  if (const auto run_id = optional(kEnvRunId)) env.run_id = *run_id;
  return env;
}

}  // namespace dtrain::distribute
