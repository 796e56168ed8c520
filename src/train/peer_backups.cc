// Durable backups without a shared filesystem (peer_backups.h): the workers' agreement on the
// newest backup any host holds, and the copy a worker whose host lacks it fetches from a peer.
#include "peer_backups.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "backup_transfer.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/train/sharded_checkpoints.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// What one worker holds after restoring its own host's newest valid backup.
struct Offer {
  int rank = 0;
  int node = 0;         // node index in the generation (DTRAIN_NODE_RANK)
  int64_t step = -1;    // global step of the backup it restored; -1: none
  std::string name;     // "backup-7"
  std::string address;  // where its file server listens; empty: none
};

Offer parse_offer(const std::string& text, int rank) {
  try {
    const json j = json::parse(text);
    return Offer{.rank = j.at("rank").get<int>(),
                 .node = j.at("node").get<int>(),
                 .step = j.at("step").get<int64_t>(),
                 .name = j.at("name").get<std::string>(),
                 .address = j.at("address").get<std::string>()};
  } catch (const std::exception& e) {
    throw DataLossError(
        str_cat("BackupAndRestore: worker ", rank, " sent a malformed backup offer: ", e.what()));
  }
}

// Best effort: the launcher's event log says where each rank's backup came from.
void report_to_launcher(const json& report) {
  try {
    const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
    if (!env.master) return;
    distribute::CoordinationClient client(
        env.master->to_string(),
        {.connect_timeout = std::chrono::seconds(5), .rpc_timeout = std::chrono::seconds(5)});
    client.set(backup_restore_key(env.generation, env.rank), report.dump());
  } catch (const Error& e) {
    std::cerr << "BackupAndRestore: could not report the backup's source to the launcher: "
              << e.what() << "\n";
  }
}

}  // namespace

std::string backup_restore_key(int64_t generation, int rank) {
  return str_cat("backup_restore/", generation, "/", rank);
}

bool backups_per_host(const distribute::Strategy* strategy) {
  if (strategy == nullptr || strategy->num_workers() < 2) return false;
  if (!distribute::LauncherEnv::present()) return false;
  return distribute::LauncherEnv::from_environment().nnodes > 1;
}

bool writes_host_copy() { return distribute::LauncherEnv::from_environment().local_rank == 0; }

std::optional<checkpoint::ShardedSaveOptions> host_sharding(distribute::Strategy& strategy,
                                                            nn::Model& model, bool locked_out) {
  const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
  const json mine = {
      {"node", env.node_rank}, {"local_rank", env.local_rank}, {"locked_out", locked_out}};
  const std::vector<std::string> all = all_gather_bytes(strategy, mine.dump());
  // This host's workers by local rank: (local rank, global rank).
  std::vector<std::pair<int, int>> host;
  bool shared = false;
  for (size_t r = 0; r < all.size(); ++r) {
    const json j = json::parse(all[r], nullptr, false);
    if (j.is_discarded() || !j.contains("node") || !j["node"].is_number_integer() ||
        !j.contains("local_rank") || !j["local_rank"].is_number_integer()) {
      throw DataLossError(
          str_cat("BackupAndRestore: worker ", r, " sent a malformed host entry '", all[r], "'"));
    }
    shared |= j.value("locked_out", false);
    if (j["node"].get<int>() == env.node_rank) {
      host.emplace_back(j["local_rank"].get<int>(), static_cast<int>(r));
    }
  }
  if (shared) return std::nullopt;
  std::sort(host.begin(), host.end());
  checkpoint::ShardedSaveOptions options = sharded_save_options(strategy, model);
  std::vector<int> members;
  for (const auto& [local, global] : host) {
    if (global == strategy.worker_rank()) options.rank = static_cast<int>(members.size());
    members.push_back(global);
  }
  options.num_shards = static_cast<int>(members.size());
  options.all_gather = [&strategy, members](const std::string& value) {
    const std::vector<std::string> everyone = all_gather_bytes(strategy, value);
    std::vector<std::string> out;
    for (int r : members) out.push_back(everyone.at(static_cast<size_t>(r)));
    return out;
  };
  return options;
}

std::optional<std::string> agree_on_host_backups(distribute::Strategy& strategy,
                                                 checkpoint::Checkpoint& ckpt,
                                                 const std::string& dir,
                                                 const std::optional<std::string>& local,
                                                 const std::function<int64_t()>& restored_step) {
  const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
  const int rank = strategy.worker_rank();
  // 1. What every worker restored from its own host's directory, and where it serves it.
  std::unique_ptr<BackupFileServer> server;
  Offer mine{.rank = rank, .node = env.node_rank, .step = -1, .name = "", .address = ""};
  if (local) {
    server = std::make_unique<BackupFileServer>(fs::path(*local).parent_path().string());
    mine.step = restored_step();
    mine.name = fs::path(*local).filename().string();
    mine.address = str_cat(reachable_host(env.master ? env.master->host : ""), ":", server->port());
  }
  const json offer = {{"rank", mine.rank},
                      {"node", mine.node},
                      {"step", mine.step},
                      {"name", mine.name},
                      {"address", mine.address}};
  const std::vector<std::string> texts = all_gather_bytes(strategy, offer.dump());
  std::vector<Offer> offers;
  int64_t agreed = -1;
  for (size_t r = 0; r < texts.size(); ++r) {
    offers.push_back(parse_offer(texts[r], static_cast<int>(r)));
    agreed = std::max(agreed, offers.back().step);
  }
  if (agreed < 0) return std::nullopt;  // no host holds a backup: a fresh start everywhere

  // 2. A worker behind the agreed step fetches it from a worker that holds it, trying the holders
  // in rank order (they are on other hosts: the workers of one host read one directory).
  std::optional<std::string> restored = mine.step == agreed ? local : std::nullopt;
  json report = {{"source", "local_disk"}, {"step", agreed}, {"checkpoint", mine.name}};
  std::string error;
  std::exception_ptr failure;  // rethrown on this worker, with its own type
  const fs::path into = fs::path(dir) / str_cat(".peer-backup-r", rank);
  if (!restored) {
    for (const Offer& o : offers) {
      if (o.step != agreed || o.rank == rank || o.address.empty()) continue;
      const std::string peer = str_cat("rank ", o.rank, " (node ", o.node, ")");
      std::error_code ec;
      fs::remove_all(into, ec);
      try {
        const FetchedBackup got = fetch_backup(o.address, peer, o.name, into.string());
        ckpt.restore(got.prefix);
        if (const int64_t step = restored_step(); step != agreed) {
          throw DataLossError(str_cat("BackupAndRestore: ", o.name, " from ", peer, " holds step ",
                                      step, ", not the agreed step ", agreed));
        }
        restored = got.prefix;
        report = {{"source", "peer_disk"}, {"step", agreed},      {"checkpoint", o.name},
                  {"from_node", o.node},   {"from_rank", o.rank}, {"bytes", got.bytes}};
        std::cerr << "BackupAndRestore: rank " << rank << " fetched " << o.name << " (step "
                  << agreed << ", " << got.files << " files, " << got.bytes
                  << " bytes, sizes and CRC-32C checked) from " << peer
                  << "'s disk over TCP: this host's directory " << dir << " lacked it\n";
        error.clear();
        failure = nullptr;
        break;
      } catch (const ResourceExhaustedError& e) {
        error = e.what();  // this host's disk is full: another peer would not help
        failure = std::current_exception();
        break;
      } catch (const Error& e) {
        error = e.what();
        failure = std::current_exception();
        std::cerr << "BackupAndRestore: " << e.what() << "\n";
      }
    }
    std::error_code ec;
    fs::remove_all(into, ec);  // restored into memory; the next backup writes this host's copy
    if (!restored && error.empty()) {
      error = str_cat("no worker could send backup step ", agreed);
    }
  }

  // 3. Everyone learns whether everyone restored the agreed step (the servers stay up until
  // then); one failure stops every worker, with the reason.
  const std::vector<std::string> outcomes = all_gather_bytes(strategy, error);
  server.reset();
  std::string failed;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!outcomes[r].empty())
      failed += str_cat(failed.empty() ? "" : "; ", "rank ", r, ": ", outcomes[r]);
  }
  if (!error.empty()) {
    std::cerr << "BackupAndRestore: rank " << rank << " could not restore the job's newest "
              << "backup (step " << agreed << "): " << error << "\n";
    if (failure) std::rethrow_exception(failure);
    throw UnavailableError(str_cat("BackupAndRestore: rank ", rank, ": ", error));
  }
  if (!failed.empty()) {
    throw FailedPreconditionError(str_cat("BackupAndRestore: not every worker could restore the ",
                                          "job's newest backup (step ", agreed, "): ", failed));
  }
  report_to_launcher(report);
  return restored;
}

}  // namespace dtrain::train
