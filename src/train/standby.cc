// A hot spare's wait for its rank (dtrain/train/standby.h).
#include "dtrain/train/standby.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"

namespace dtrain::train {
namespace {

// One wait on the service; a spare waits again after it (the launcher kills its spares when it
// exits, and the kernel does when it dies: PR_SET_PDEATHSIG).
constexpr std::chrono::hours kWaitChunk(1);

std::string required(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw InvalidArgumentError(
        str_cat("standby: ", name, " is not set (", kEnvSpare, " is; the launcher sets both)"));
  }
  return v;
}

}  // namespace

bool is_standby() {
  const char* v = std::getenv(kEnvSpare);
  return v != nullptr && *v != '\0';
}

std::optional<StandbyAssignment> await_standby_assignment() {
  if (!is_standby()) return std::nullopt;
  const std::string id_text = required(kEnvSpare);
  int id = -1;
  try {
    size_t used = 0;
    id = std::stoi(id_text, &used);
    if (used != id_text.size() || id < 0) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw InvalidArgumentError(
        str_cat("standby: ", kEnvSpare, "='", id_text, "' is not a spare id (an integer >= 0)"));
  }
  const std::string service = required(kEnvSpareService);
  const std::string key = required(kEnvSpareKey);
  StandbyAssignment a{.spare = id};
  std::vector<std::string> unset, set;
  auto assigned = std::chrono::steady_clock::now();
  {
    distribute::CoordinationClient client(
        service, {.connect_timeout = std::chrono::seconds(30),
                  .rpc_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kWaitChunk) +
                                 std::chrono::seconds(30)});
    client.set(key + "/ready", std::to_string(::getpid()));
    std::cerr << "standby: spare " << id << " is ready (data loaded, model built); waiting for a "
              << "rank\n";
    std::string text;
    while (text.empty()) {
      try {
        text = client.get(key + "/assign", kWaitChunk);
        assigned = std::chrono::steady_clock::now();
      } catch (const DeadlineExceededError&) {
        // Nobody failed for an hour: keep standing by.
      }
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    try {
      a.rank = j.at("rank").get<int>();
      a.generation = j.at("generation").get<int64_t>();
      unset = j.at("unset").get<std::vector<std::string>>();
      set = j.at("set").get<std::vector<std::string>>();
    } catch (const std::exception&) {
      throw DataLossError(str_cat("standby: the launcher's assignment ", key, "/assign = '", text,
                                  "' is not {\"rank\", \"generation\", \"unset\", \"set\"}"));
    }
  }  // the client (and its threads' use of the environment) ends before the environment changes
  for (const std::string& name : unset) ::unsetenv(name.c_str());
  for (const std::string& kv : set) {
    const size_t eq = kv.find('=');
    DTRAIN_CHECK(eq != std::string::npos && eq > 0, "standby: the launcher's assignment sets '", kv,
                 "', not NAME=value");
    ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  // When the assignment arrived, for the newcomer's report of the recovery's phases
  // (memory_snapshots.h: DTRAIN_STANDBY_ASSIGNED_AT, CLOCK_MONOTONIC seconds).
  ::setenv(
      "DTRAIN_STANDBY_ASSIGNED_AT",
      std::to_string(std::chrono::duration<double>(assigned.time_since_epoch()).count()).c_str(),
      1);
  ::unsetenv(kEnvSpare);
  ::unsetenv(kEnvSpareService);
  ::unsetenv(kEnvSpareKey);
  std::cerr << "standby: spare " << id << " takes over rank " << a.rank << " in generation "
            << a.generation << "\n";
  return a;
}

}  // namespace dtrain::train
