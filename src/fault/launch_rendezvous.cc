// The launcher's rendezvous (see launch_rendezvous.h).
#include "fault/launch_rendezvous.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/launcher_env.h"

namespace dtrain::fault {
namespace {
namespace dist = dtrain::distribute;
using json = nlohmann::json;
}  // namespace

LaunchRendezvous::LaunchRendezvous(const LaunchOptions& options)
    : o_(options), prefix_(str_cat("dtrain/", options.run_id, "/launch/")) {
  const bool store_url = o_.rdzv.find("://") != std::string::npos;
  if (multi_node() && o_.rdzv.rfind("etcd://", 0) == 0) {
    // Every node serves the job's coordination state from etcd to its own launcher and
    // workers; no node is special, and the state outlives any of them.
    server_ = std::make_unique<dist::CoordinationServer>(dist::CoordinationServerOptions{
        .address = "127.0.0.1:0",
        .state_store = o_.rdzv,
        .state_prefix = str_cat("dtrain/", o_.run_id, "/coordination/")});
    shared_state_ = true;
    service_ = server_->address();
    say("node ", o_.node_rank, ": coordination state in ", o_.rdzv, " (run '", o_.run_id,
        "'), served to this node on ", service_);
  } else if (o_.rdzv == "coordinator" || (store_url && !multi_node())) {
    server_ = std::make_unique<dist::CoordinationServer>(
        dist::CoordinationServerOptions{.address = "127.0.0.1:0"});
    service_ = server_->address();
  } else if (!store_url) {
    service_ = o_.rdzv;
    if (o_.node_rank == 0) {
      server_ = std::make_unique<dist::CoordinationServer>(
          dist::CoordinationServerOptions{.address = o_.rdzv});
      say("coordination service listening on ", server_->address());
    }
  }
  if (service_.empty()) return;
  client_ = std::make_unique<dist::CoordinationClient>(service_,
                                                       client_options(ms_of(o_.rdzv_timeout_s)));
}

dist::CoordinationClientOptions LaunchRendezvous::client_options(
    milliseconds connect_timeout) const {
  dist::CoordinationClientOptions co{.connect_timeout = connect_timeout,
                                     .rpc_timeout = std::chrono::seconds(10)};
  // A node away from the service that gets no answer for its heartbeat timeout is as good as
  // lost to the others (they stop waiting for it then): its calls give up as soon, not under 2 s.
  if (multi_node() && server_ == nullptr && o_.heartbeat_timeout_s > 0) {
    co.rpc_timeout = std::clamp(ms_of(o_.heartbeat_timeout_s), milliseconds(2000), co.rpc_timeout);
  }
  if (multi_node() && o_.heartbeat_interval_s > 0) {
    co.heartbeat_task = str_cat("node/", o_.node_rank);
    co.heartbeat_interval = ms_of(o_.heartbeat_interval_s);
    co.heartbeat_timeout = std::chrono::hours(24 * 365);  // keep trying: the link may return
  }
  return co;
}

Generation LaunchRendezvous::next_generation(const std::vector<int>& slots) {
  Generation g;
  g.slots = slots;
  if (client_ == nullptr) {  // multi-node on a shared store: fixed membership, no restarts
    g.nodes.resize(o_.max_nodes);
    for (int n = 0; n < o_.max_nodes; ++n) g.nodes[n] = n;
    g.node_index = o_.node_rank;
    g.world_size = o_.max_nodes * o_.nproc_per_node;
    g.rank_offset = o_.node_rank * o_.nproc_per_node;
    return g;
  }
  const dist::Membership m = join_round();
  g.number = m.generation;
  for (const auto& member : m.members) {
    g.nodes.push_back(static_cast<int>(parse_int(member.substr(member.find('-') + 1)).value_or(0)));
  }
  std::sort(g.nodes.begin(), g.nodes.end());
  g.node_index =
      static_cast<int>(std::find(g.nodes.begin(), g.nodes.end(), o_.node_rank) - g.nodes.begin());
  if (!multi_node()) {
    g.world_size = static_cast<int>(g.slots.size());
    return g;
  }
  const auto timeout = ms_of(o_.rdzv_timeout_s);
  client_->set(key(g, str_cat("nproc/", o_.node_rank)), std::to_string(g.slots.size()));
  for (int node : g.nodes) {
    const int n = static_cast<int>(
        parse_int(client_->get(key(g, str_cat("nproc/", node)), timeout)).value_or(0));
    if (node < o_.node_rank) g.rank_offset += n;
    g.world_size += n;
  }
  return g;
}

// One membership round, retried on a fresh connection while the service does not answer.
dist::Membership LaunchRendezvous::join_round() {
  const auto deadline = Clock::now() + ms_of(o_.rdzv_timeout_s);
  const auto remaining = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  // A node cut off from the service (its link went down, a switch failed) keeps trying until
  // --rdzv-timeout: on a fresh connection, since the old one may lead nowhere, and then into
  // the next round, where the running nodes see it waiting and admit it.
  bool said = false;
  const auto say_retrying = [&](const std::string& why) {
    if (said) return;
    say("node ", o_.node_rank, " cannot reach the coordination service at ", service_, " (", why,
        "); retrying until --rdzv-timeout (", o_.rdzv_timeout_s, " s)");
    said = true;
  };
  if (lost_service_) say_retrying("lost it during the last generation");
  while (true) {
    try {
      if (lost_service_) {
        client_.reset();  // stops its heartbeats
        client_ = std::make_unique<dist::CoordinationClient>(service_, client_options(remaining()));
        lost_service_ = false;
        say("node ", o_.node_rank, " reached the coordination service again; rejoining");
      }
      int available = o_.max_nodes;
      if (multi_node()) {
        const auto excluded = client_->get_prefix(prefix_ + "excluded/");
        available -= static_cast<int>(excluded.size());
        if (available < o_.min_nodes) {
          throw FailedPreconditionError(str_cat("launch: ", excluded.size(),
                                                " node(s) excluded; fewer than --nnodes minimum ",
                                                o_.min_nodes, " remain"));
        }
      }
      return client_->join(str_cat("node-", o_.node_rank),
                           dist::JoinOptions{.max_members = available,
                                             .min_members = std::min(o_.min_nodes, available),
                                             .settle = ms_of(o_.rdzv_settle_s),
                                             .timeout = remaining()});
    } catch (const Error& e) {
      // UNAVAILABLE, or no answer in time on a connection that leads nowhere. (A round that did
      // not fill answers DEADLINE_EXCEEDED at the deadline, and that ends the wait.)
      const bool unreachable =
          e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kDeadlineExceeded;
      if (!unreachable || Clock::now() >= deadline) throw;
      say_retrying(e.what());
      lost_service_ = true;
      std::this_thread::sleep_for(milliseconds(500));
    }
  }
}

std::map<std::string, std::string> LaunchRendezvous::progress(const Generation& g) {
  return client_->get_prefix(str_cat("progress/", g.number, "/"));
}

bool LaunchRendezvous::claim_first_failure(const Generation& g) {
  return client_->add(key(g, "failures"), 1) == 1;
}

void LaunchRendezvous::exclude_this_node(const Generation& g) {
  client_->set(str_cat(prefix_, "excluded/", o_.node_rank), std::to_string(g.number));
}

void LaunchRendezvous::publish_failure(const Generation& g, const Failure& f) {
  json j = {{"code", f.code},   {"detector", f.detector},
            {"what", f.what},   {"preemption", f.preemption},
            {"admit", f.admit}, {"exclude", f.exclude}};
  if (f.node) j["node"] = *f.node;
  if (f.rank) j["rank"] = *f.rank;
  if (f.last_step) j["last_step"] = *f.last_step;
  client_->set(key(g, "failure"), j.dump());
}

std::optional<Failure> LaunchRendezvous::read_failure(const Generation& g) {
  const std::vector<std::string> k = {key(g, "failure")};
  if (!client_->check(k)) return std::nullopt;
  Failure f;
  f.remote = true;
  f.detected_at = Clock::now();
  const json j = json::parse(client_->get(k[0], milliseconds(1000)), nullptr, false);
  if (!j.is_object()) return f;
  f.code = j.value("code", 1);
  f.detector = j.value("detector", std::string(kDetectExit));
  f.what = j.value("what", std::string("failure on another node"));
  f.preemption = j.value("preemption", false);
  f.admit = j.value("admit", false);
  f.exclude = j.value("exclude", false);
  if (j.contains("node")) f.node = j["node"].get<int>();
  if (j.contains("rank")) f.rank = j["rank"].get<int>();
  if (j.contains("last_step")) f.last_step = j["last_step"].get<int64_t>();
  return f;
}

void LaunchRendezvous::mark_done(const Generation& g) {
  client_->set(key(g, str_cat("done/", o_.node_rank)), "0");
}

bool LaunchRendezvous::all_done(const Generation& g) {
  std::vector<std::string> done;
  for (int node : g.nodes) done.push_back(key(g, str_cat("done/", node)));
  return client_->check(done);
}

void LaunchRendezvous::leave(const Generation& g, int code) {
  try {
    client_->set(key(g, str_cat("exit/", o_.node_rank)), std::to_string(code));
    if (hosts_service()) {
      std::vector<std::string> acks;
      for (int node : g.nodes) acks.push_back(key(g, str_cat("exit/", node)));
      client_->wait(acks, std::chrono::seconds(10));
    }
  } catch (const Error& e) {
    say("while finishing: ", e.what());
  }
}

}  // namespace dtrain::fault
