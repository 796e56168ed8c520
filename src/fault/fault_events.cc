// FaultRecorder: JSON lines through summary::EventLog, TensorBoard entries through
// summary::SummaryWriter. Thread-safe (one mutex).
#include "dtrain/fault/fault_events.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/summary/event_log.h"
#include "dtrain/summary/summary_writer.h"

namespace dtrain::fault {

std::string to_json(const FaultEvent& e, double unix_time) {
  nlohmann::ordered_json j;
  j["time"] = e.time != 0 ? e.time : unix_time;
  j["generation"] = e.generation;
  j["kind"] = e.kind;
  const auto opt = [&](const char* name, const auto& v) {
    if (v) j[name] = *v;
  };
  const auto str = [&](const char* name, const std::string& v) {
    if (!v.empty()) j[name] = v;
  };
  opt("rank", e.rank);
  opt("node", e.node);
  opt("slot", e.slot);
  opt("pid", e.pid);
  opt("exit_code", e.exit_code);
  opt("signal", e.signal);
  str("detector", e.detector);
  opt("cause_rank", e.cause_rank);
  opt("last_step", e.last_step);
  opt("resumed_step", e.resumed_step);
  str("checkpoint", e.checkpoint);
  opt("lost_steps", e.lost_steps);
  opt("lost_seconds", e.lost_seconds);
  opt("detection_latency_seconds", e.detection_latency_seconds);
  opt("recovery_seconds", e.recovery_seconds);
  opt("restarts", e.restarts);
  opt("world_size", e.world_size);
  for (const auto& [k, v] : e.extra) j[k] = v;
  str("message", e.message);
  str("stack", e.stack);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

FaultRecorder::FaultRecorder(const FaultRecorderOptions& options) : options_(options) {
  if (!options.event_log.empty()) log_ = std::make_unique<summary::EventLog>(options.event_log);
  if (!options.logdir.empty()) {
    writer_ = std::make_unique<summary::SummaryWriter>(
        options.logdir, summary::SummaryWriterOptions{.flush_secs = 1, .max_queue = 4});
  }
}

FaultRecorder::~FaultRecorder() {
  try {
    if (writer_) writer_->close();
  } catch (const std::exception&) {
  }
}

void FaultRecorder::record(const FaultEvent& e) {
  std::lock_guard lock(mu_);
  if (options_.echo && !e.message.empty()) {
    const std::string line = "[launch] " + e.message + "\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
  }
  try {
    if (log_) log_->append(to_json(e, summary::wall_time_now()));
    if (writer_) {
      const int64_t step = e.last_step.value_or(e.resumed_step.value_or(0));
      std::string text = str_cat("**", e.kind, "** (generation ", e.generation, "): ", e.message);
      if (!e.stack.empty()) text += "\n\n```\n" + e.stack + "\n```";
      writer_->text("launcher/events", text, step);
      if (e.restarts) writer_->scalar("launcher/restarts", *e.restarts, step);
      if (e.detection_latency_seconds) {
        writer_->scalar("launcher/detection_latency_s", *e.detection_latency_seconds, step);
      }
      if (e.recovery_seconds) writer_->scalar("launcher/recovery_s", *e.recovery_seconds, step);
      if (e.lost_steps) writer_->scalar("launcher/lost_steps", *e.lost_steps, step);
      if (e.lost_seconds) writer_->scalar("launcher/lost_s", *e.lost_seconds, step);
      if (e.world_size) writer_->scalar("launcher/world_size", *e.world_size, step);
    }
  } catch (const std::exception& ex) {
    // The job goes on (its workers and checkpoints do not depend on the record); later events
    // are tried again, and the log keeps whole lines only.
    if (!warned_) {
      warned_ = true;
      const auto* err = dynamic_cast<const Error*>(&ex);
      const std::string line =
          str_cat("[launch] warning: cannot record fault events: ",
                  err != nullptr ? str_cat(error_code_name(err->code()), ": ") : std::string(),
                  ex.what(), "; the job goes on\n");
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    }
  }
}

void FaultRecorder::flush() {
  std::lock_guard lock(mu_);
  try {
    if (writer_) writer_->flush();
  } catch (const std::exception&) {
  }
}

}  // namespace dtrain::fault
