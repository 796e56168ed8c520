// Checks of the launcher's options (validate_launch_options, parse_nnodes in launch_agent.h):
// every value is checked before anything starts, so a bad one is a usage error at once.
#include <charconv>
#include <cmath>
#include <string_view>

#include "dtrain/core/error.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/fault/launch_agent.h"
#include "fault/process_limits.h"

namespace dtrain::fault {
namespace {

// The longest timeout or interval accepted: a year (ms_of must not overflow).
constexpr double kMaxSeconds = 365.0 * 24 * 3600;
// The most nodes one job spans.
constexpr int kMaxNodes = 65536;
// The most hot spares one launcher keeps.
constexpr int kMaxSpares = 64;

void check_seconds(double v, const char* flag, bool positive) {
  DTRAIN_CHECK(std::isfinite(v) && (positive ? v > 0 : v >= 0) && v <= kMaxSeconds,
               "launch: ", flag, " ", v, " must be ", positive ? "> 0" : ">= 0", " and at most ",
               kMaxSeconds, " seconds (a year)");
}

}  // namespace

void validate_launch_options(const LaunchOptions& o) {
  DTRAIN_CHECK(o.nproc_per_node >= 1, "launch: --nproc-per-node must be >= 1, got ",
               o.nproc_per_node);
  DTRAIN_CHECK(o.min_nodes >= 1 && o.min_nodes <= o.max_nodes,
               "launch: --nnodes must be N or MIN:MAX with 1 <= MIN <= MAX");
  DTRAIN_CHECK(o.max_nodes <= kMaxNodes, "launch: --nnodes ", o.max_nodes, " is more than ",
               kMaxNodes, " nodes");
  DTRAIN_CHECK(o.node_rank >= 0 && o.node_rank < o.max_nodes, "launch: --node-rank ", o.node_rank,
               " is not in [0, ", o.max_nodes, ")");
  DTRAIN_CHECK(!o.command.empty(), "launch: no program to run (dtrain launch ... -- PROGRAM ARGS)");
  DTRAIN_CHECK(o.rdzv != "coordinator" || o.max_nodes == 1, "launch: with --nnodes ", o.max_nodes,
               ", --rdzv must be host:port of node 0 (where it hosts the coordination service), "
               "file:///shared/dir, redis://host:port or etcd://host:port[,host:port...]");
  DTRAIN_CHECK(o.rdzv_timeout_s > 0 && o.grace_period_s >= 0,
               "launch: --rdzv-timeout must be > 0 and --grace-period >= 0");
  DTRAIN_CHECK(o.max_restarts >= 0, "launch: --max-restarts must be >= 0, got ", o.max_restarts);
  DTRAIN_CHECK(o.snapshot_every >= 0, "launch: --snapshot-every must be >= 0, got ",
               o.snapshot_every);
  DTRAIN_CHECK(o.snapshot_commit == "journal" || o.snapshot_commit == "files",
               "launch: --snapshot-commit must be journal or files, got '", o.snapshot_commit, "'");
  DTRAIN_CHECK(o.heartbeat_interval_s >= 0 && o.heartbeat_timeout_s >= 0 &&
                   o.watchdog_timeout_s >= 0 && o.stack_timeout_s >= 0 && o.exclude_window_s >= 0 &&
                   o.rdzv_settle_s >= 0,
               "launch: timeouts and intervals must be >= 0");
  check_seconds(o.rdzv_timeout_s, "--rdzv-timeout", true);
  check_seconds(o.rdzv_settle_s, "--rdzv-settle", false);
  check_seconds(o.grace_period_s, "--grace-period", false);
  check_seconds(o.heartbeat_interval_s, "--heartbeat-interval", false);
  check_seconds(o.heartbeat_timeout_s, "--heartbeat-timeout", false);
  check_seconds(o.watchdog_timeout_s, "--watchdog-timeout", false);
  check_seconds(o.stack_timeout_s, "--stack-timeout", false);
  check_seconds(o.exclude_window_s, "--exclude-window", false);
  DTRAIN_CHECK(o.exclude_after >= 0, "launch: --exclude-after must be >= 0");
  DTRAIN_CHECK(o.preemption_exit_code >= 1 && o.preemption_exit_code <= 255,
               "launch: --preemption-exit-code (or $DTRAIN_PREEMPTION_EXIT_CODE) ",
               o.preemption_exit_code, " is not an exit code in [1, 255]");
  const bool store_url = o.rdzv.find("://") != std::string::npos;
  DTRAIN_CHECK(o.on_failure == "restart-all" || o.on_failure == "survivors",
               "launch: --on-failure '", o.on_failure, "' must be restart-all or survivors");
  if (o.on_failure == "survivors") {
    DTRAIN_CHECK(o.snapshot_every > 0,
                 "launch: --on-failure survivors needs in-memory snapshots (--snapshot-every > 0): "
                 "the survivors roll back to one");
    DTRAIN_CHECK(!store_url, "launch: --on-failure survivors needs the coordination service, not ",
                 o.rdzv);
  }
  // On etcd every node serves the coordination state from etcd; on a file or Redis store there
  // is none.
  const bool etcd = o.rdzv.rfind("etcd://", 0) == 0;
  DTRAIN_CHECK(
      !(store_url && !etcd && o.max_nodes > 1 && (o.max_restarts > 0 || o.min_nodes < o.max_nodes)),
      "launch: restarts and elastic jobs over several nodes need the coordination service "
      "(--rdzv host:port, or its state in etcd: --rdzv etcd://host:port), not ",
      o.rdzv);
  if (!store_url && o.rdzv != "coordinator") {
    distribute::parse_host_port(o.rdzv, "launch: --rdzv");  // a usage error before anything else
  }
  DTRAIN_CHECK(o.spares >= 0 && o.spares <= kMaxSpares, "launch: --spares ", o.spares,
               " must be in [0, ", kMaxSpares, "]");
  if (o.spares > 0) {
    DTRAIN_CHECK(o.snapshot_every > 0,
                 "launch: --spares needs in-memory snapshots (--snapshot-every > 0): a spare "
                 "restores one when it takes over");
    DTRAIN_CHECK(!store_url, "launch: --spares needs the coordination service, not ", o.rdzv);
  }
  DTRAIN_CHECK(o.spare_start == "fork" || o.spare_start == "exec", "launch: --spare-start '",
               o.spare_start, "' must be fork or exec");
  check_process_count(o.nproc_per_node + o.spares,
                      o.spares > 0
                          ? str_cat("--nproc-per-node ", o.nproc_per_node, " + --spares ", o.spares)
                          : str_cat("--nproc-per-node ", o.nproc_per_node));
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  const auto parse = [&](std::string_view s) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 1) {
      throw InvalidArgumentError(
          str_cat("launch: --nnodes '", text, "' is not N or MIN:MAX with 1 <= MIN <= MAX"));
    }
    return v;
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    const int n = parse(text);
    return {n, n};
  }
  const int lo = parse(std::string_view(text).substr(0, colon));
  const int hi = parse(std::string_view(text).substr(colon + 1));
  if (lo > hi) {
    throw InvalidArgumentError(str_cat("launch: --nnodes '", text, "': MIN is larger than MAX"));
  }
  return {lo, hi};
}

}  // namespace dtrain::fault
