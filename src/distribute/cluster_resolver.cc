// TF_CONFIG, Slurm, Open MPI and dtrain-launch cluster resolution, with TF's validation rules.
#include "dtrain/distribute/cluster_resolver.h"

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/distribute/launcher_env.h"

namespace dtrain::distribute {
namespace {

[[noreturn]] void bad_env(const std::string& var, const std::string& value,
                          const std::string& why) {
  std::string shown = value.size() > 200 ? value.substr(0, 200) + "..." : value;
  throw InvalidArgumentError(str_cat(var, "='", shown, "': ", why));
}

int parse_int_var(const std::string& var, const std::string& value, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
    bad_env(var, value, "not an integer");
  }
  if (v < lo || v > hi) bad_env(var, value, str_cat("out of range [", lo, ", ", hi, "]"));
  return v;
}

std::string host_of(const std::string& address) {
  if (address.empty()) return "";
  if (address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;  // bare host
  return address.substr(0, colon);
}

void fill_workers(ClusterSpec& c) {
  c.worker_addresses.clear();
  for (const char* job : {"chief", "worker"}) {
    auto it = c.jobs.find(job);
    if (it != c.jobs.end()) {
      c.worker_addresses.insert(c.worker_addresses.end(), it->second.begin(), it->second.end());
    }
  }
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

bool ClusterSpec::is_chief() const {
  if (task_type == "chief" || task_type == "evaluator") return true;
  return task_type == "worker" && task_index == 0 && jobs.count("chief") == 0;
}

ClusterSpec parse_tf_config(const std::string& text) {
  const std::string var = "TF_CONFIG";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    bad_env(var, text, str_cat("not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) bad_env(var, text, "expected a JSON object");
  ClusterSpec c;
  c.source = "TF_CONFIG";
  if (!j.contains("cluster")) bad_env(var, text, "no \"cluster\" field");
  const auto& cluster = j["cluster"];
  if (!cluster.is_object()) bad_env(var, text, "\"cluster\" must be an object of job lists");
  for (const auto& [job, tasks] : cluster.items()) {
    std::vector<std::string> addresses;
    if (tasks.is_array()) {
      for (const auto& a : tasks) {
        if (!a.is_string()) {
          bad_env(var, text, str_cat("cluster job \"", job, "\" must list address strings"));
        }
        addresses.push_back(a.get<std::string>());
      }
    } else if (tasks.is_object()) {  // TF also accepts {"0": "host:port", "2": ...}
      std::map<int, std::string> sparse;
      for (const auto& [index, a] : tasks.items()) {
        int i = -1;
        auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), i);
        if (ec != std::errc() || end != index.data() + index.size() || i < 0 || !a.is_string()) {
          bad_env(var, text,
                  str_cat("cluster job \"", job, "\" must map task indices to addresses"));
        }
        sparse[i] = a.get<std::string>();
      }
      for (const auto& [i, a] : sparse) {
        if (i != static_cast<int>(addresses.size())) {
          bad_env(var, text,
                  str_cat("cluster job \"", job, "\" skips task index ", addresses.size(),
                          " (dtrain needs dense task lists)"));
        }
        addresses.push_back(a);
      }
    } else {
      bad_env(var, text, str_cat("cluster job \"", job, "\" must be a list of addresses"));
    }
    c.jobs[job] = std::move(addresses);
  }
  if (!j.contains("task")) bad_env(var, text, "no \"task\" field");
  const auto& task = j["task"];
  if (!task.is_object()) bad_env(var, text, "\"task\" must be an object {\"type\", \"index\"}");
  if (!task.contains("type") || !task["type"].is_string()) {
    bad_env(var, text, "\"task\" needs a string \"type\"");
  }
  c.task_type = task["type"].get<std::string>();
  if (task.contains("index")) {
    const auto& index = task["index"];
    if (index.is_number_integer()) {
      const auto v = index.get<int64_t>();
      if (v < 0 || v > 1 << 30)
        bad_env(var, text, str_cat("task index ", v, " is negative or too big"));
      c.task_index = static_cast<int>(v);
    } else if (index.is_string()) {  // TF converts with int()
      c.task_index = parse_int_var("TF_CONFIG task.index", index.get<std::string>(), 0, 1 << 30);
    } else {
      bad_env(var, text, "task \"index\" must be an integer");
    }
  }
  // TF's _validate_cluster_spec.
  if (c.task_type != "chief" && c.task_type != "worker" && c.task_type != "evaluator" &&
      c.task_type != "ps") {
    bad_env(var, text,
            str_cat("unrecognized task type \"", c.task_type,
                    "\"; valid task types are \"chief\", \"worker\", \"evaluator\" and "
                    "\"ps\""));
  }
  if (!c.jobs.count(c.task_type)) {
    bad_env(var, text, str_cat("task type \"", c.task_type, "\" is not in the cluster"));
  }
  if (c.jobs.count("chief") && c.jobs["chief"].size() > 1) {
    bad_env(var, text,
            str_cat("there must be at most one chief, the cluster lists ", c.jobs["chief"].size()));
  }
  if (c.jobs.count("evaluator") && c.jobs["evaluator"].size() > 1) {
    bad_env(var, text,
            str_cat("there must be at most one evaluator, the cluster lists ",
                    c.jobs["evaluator"].size()));
  }
  const auto n = c.jobs[c.task_type].size();
  if (static_cast<size_t>(c.task_index) >= n) {
    bad_env(var, text,
            str_cat("task index ", c.task_index, " is out of range: the cluster has ", n, " \"",
                    c.task_type, "\" task", n == 1 ? "" : "s"));
  }
  // TF's worker_count and id_in_cluster.
  const int chiefs = c.jobs.count("chief") ? static_cast<int>(c.jobs["chief"].size()) : 0;
  const int workers = c.jobs.count("worker") ? static_cast<int>(c.jobs["worker"].size()) : 0;
  if (c.task_type == "evaluator") {
    c.num_workers = static_cast<int>(c.jobs["evaluator"].size());
    c.rank = c.task_index;
  } else {
    c.num_workers = chiefs + workers;
    c.rank = c.task_type == "chief" ? 0 : c.task_type == "worker" ? c.task_index + chiefs : -1;
  }
  c.host = host_of(c.jobs[c.task_type][c.task_index]);
  fill_workers(c);
  return c;
}

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  const std::string var = "SLURM_NODELIST";
  // Split at top-level commas.
  std::vector<std::string> entries;
  int depth = 0;
  std::string cur;
  for (char ch : list) {
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (depth < 0) bad_env(var, list, "unbalanced ']'");
    if (ch == ',' && depth == 0) {
      entries.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (depth != 0) bad_env(var, list, "unbalanced '['");
  entries.push_back(cur);
  std::vector<std::string> hosts;
  for (const auto& e : entries) {
    if (e.empty()) bad_env(var, list, "empty host name");
    // Expand bracket groups left to right (cartesian product).
    std::vector<std::string> partial{""};
    size_t i = 0;
    while (i < e.size()) {
      if (e[i] != '[') {
        const size_t next = e.find('[', i);
        const std::string lit =
            e.substr(i, next == std::string::npos ? std::string::npos : next - i);
        for (auto& p : partial) p += lit;
        i = next == std::string::npos ? e.size() : next;
        continue;
      }
      const size_t close = e.find(']', i);
      const std::string body = e.substr(i + 1, close - i - 1);
      if (body.empty()) bad_env(var, list, "empty brackets");
      std::vector<std::string> items;
      size_t start = 0;
      while (start <= body.size()) {
        size_t comma = body.find(',', start);
        if (comma == std::string::npos) comma = body.size();
        const std::string range = body.substr(start, comma - start);
        const size_t dash = range.find('-');
        const std::string lo_s = range.substr(0, dash);
        const std::string hi_s = dash == std::string::npos ? lo_s : range.substr(dash + 1);
        auto num = [&](const std::string& s) {
          if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
            bad_env(var, list, str_cat("bad range '", range, "'"));
          }
          return parse_int_var(var, s, 0, 1 << 30);
        };
        const int lo = num(lo_s), hi = num(hi_s);
        if (hi < lo) bad_env(var, list, str_cat("descending range '", range, "'"));
        if (hi - lo > 100000) bad_env(var, list, str_cat("range '", range, "' is too large"));
        const size_t width = lo_s.size();
        for (int v = lo; v <= hi; ++v) {
          std::string s = std::to_string(v);
          if (s.size() < width) s.insert(0, width - s.size(), '0');
          items.push_back(s);
        }
        start = comma + 1;
      }
      std::vector<std::string> next;
      for (const auto& p : partial) {
        for (const auto& it : items) next.push_back(p + it);
      }
      partial = std::move(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
  }
  return hosts;
}

namespace {

std::optional<std::pair<std::string, std::string>> first_of(
    const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (auto v = env(n)) return std::make_pair(std::string(n), *v);
  }
  return std::nullopt;
}

// "2(x3),1" -> {2, 2, 2, 1}
std::vector<int> expand_tasks_per_node(const std::string& var, const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    const size_t paren = item.find("(x");
    int count = 0, repeat = 1;
    if (paren == std::string::npos) {
      count = parse_int_var(var, item, 0, 1 << 20);
    } else {
      if (item.back() != ')') bad_env(var, text, str_cat("bad item '", item, "'"));
      count = parse_int_var(var, item.substr(0, paren), 0, 1 << 20);
      repeat = parse_int_var(var, item.substr(paren + 2, item.size() - paren - 3), 1, 1 << 20);
    }
    for (int r = 0; r < repeat; ++r) out.push_back(count);
    start = comma + 1;
  }
  return out;
}

}  // namespace

ClusterSpec resolve_slurm(const EnvLookup& env, int port_base) {
  ClusterSpec c;
  c.source = "SLURM";
  auto procid = env("SLURM_PROCID");
  if (!procid) throw InvalidArgumentError("SLURM_PROCID is not set: not a Slurm task");
  auto ntasks = first_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  if (!ntasks) {
    throw InvalidArgumentError("SLURM_NTASKS is not set (needed with SLURM_PROCID)");
  }
  c.num_workers = parse_int_var(ntasks->first, ntasks->second, 1, 1 << 20);
  c.rank = parse_int_var("SLURM_PROCID", *procid, 0, c.num_workers - 1);
  if (auto local = env("SLURM_LOCALID")) {
    c.local_rank = parse_int_var("SLURM_LOCALID", *local, 0, 1 << 20);
  }
  c.task_type = "worker";
  c.task_index = c.rank;
  std::vector<std::string> addresses(c.num_workers);
  auto nodelist = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (nodelist) {
    const auto nodes = expand_slurm_hostlist(nodelist->second);
    std::vector<int> per_node;
    if (auto tpn = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
      per_node = expand_tasks_per_node(tpn->first, tpn->second);
      if (per_node.size() != nodes.size()) {
        bad_env(tpn->first, tpn->second,
                str_cat("describes ", per_node.size(), " nodes but ", nodelist->first, " lists ",
                        nodes.size()));
      }
    } else {  // spread evenly, as srun does by default
      per_node.assign(nodes.size(), 0);
      for (int r = 0; r < c.num_workers; ++r) ++per_node[r * nodes.size() / c.num_workers];
    }
    int r = 0;
    for (size_t n = 0; n < nodes.size(); ++n) {
      for (int k = 0; k < per_node[n] && r < c.num_workers; ++k, ++r) {
        addresses[r] = str_cat(nodes[n], ":", port_base + k);
      }
    }
    if (r != c.num_workers) {
      bad_env(nodelist->first, nodelist->second,
              str_cat("has room for ", r, " tasks but ", ntasks->first, " is ", c.num_workers));
    }
  }
  c.jobs["worker"] = addresses;
  c.worker_addresses = addresses;
  c.host = host_of(addresses[c.rank]);
  return c;
}

ClusterSpec resolve_mpi(const EnvLookup& env) {
  ClusterSpec c;
  c.source = "OMPI";
  auto rank = env("OMPI_COMM_WORLD_RANK");
  auto size = env("OMPI_COMM_WORLD_SIZE");
  if (!rank) throw InvalidArgumentError("OMPI_COMM_WORLD_RANK is not set: not an Open MPI rank");
  if (!size)
    throw InvalidArgumentError(
        "OMPI_COMM_WORLD_SIZE is not set (needed with OMPI_COMM_WORLD_RANK)");
  c.num_workers = parse_int_var("OMPI_COMM_WORLD_SIZE", *size, 1, 1 << 20);
  c.rank = parse_int_var("OMPI_COMM_WORLD_RANK", *rank, 0, c.num_workers - 1);
  if (auto local = env("OMPI_COMM_WORLD_LOCAL_RANK")) {
    c.local_rank = parse_int_var("OMPI_COMM_WORLD_LOCAL_RANK", *local, 0, 1 << 20);
  }
  c.task_type = "worker";
  c.task_index = c.rank;
  c.jobs["worker"] = std::vector<std::string>(c.num_workers);
  c.worker_addresses = c.jobs["worker"];
  return c;
}

ClusterSpec resolve_launcher(const EnvLookup& env) {
  std::vector<std::string> keep;  // from_lookup hands out const char*: keep the strings alive
  keep.reserve(32);
  const LauncherEnv l = LauncherEnv::from_lookup([&](const char* name) -> const char* {
    auto v = env(name);
    if (!v) return nullptr;
    keep.push_back(*v);
    return keep.back().c_str();
  });
  ClusterSpec c;
  c.source = "DTRAIN";
  c.rank = l.rank;
  c.num_workers = l.world_size;
  c.local_rank = l.local_rank;
  c.task_type = "worker";
  c.task_index = l.rank;
  c.jobs["worker"] = std::vector<std::string>(c.num_workers);
  c.worker_addresses = c.jobs["worker"];
  c.rendezvous = l.rdzv;
  c.generation = l.generation;
  c.run_id = l.run_id;
  if (l.master) c.host = "";  // collectives bind per DTRAIN_HOST or the machine's name
  return c;
}

ClusterSpec resolve_cluster(const EnvLookup& env) {
  ClusterSpec c;
  if (env("DTRAIN_RANK")) {
    c = resolve_launcher(env);
  } else if (auto tf = env("TF_CONFIG"); tf && !tf->empty()) {
    c = parse_tf_config(*tf);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    c = resolve_mpi(env);
  } else if (env("SLURM_PROCID")) {
    c = resolve_slurm(env);
  } else {
    c.jobs["worker"] = {""};
    c.worker_addresses = {""};
    c.host = "127.0.0.1";
  }
  if (auto host = env("DTRAIN_HOST"); host && !host->empty()) c.host = *host;
  if (c.rendezvous.empty()) {
    if (auto r = env("DTRAIN_RDZV"); r && !r->empty()) c.rendezvous = *r;
  }
  return c;
}

}  // namespace dtrain::distribute
