// dtrain events FILE|DIR [--json] [--skip-corrupt]: dumps every record of TensorBoard event files
// (TensorFlow's, PyTorch's, dtrain's), one line per record, and names the offset of a corrupt
// record. Single-threaded.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "dtrain/core/error.h"
#include "dtrain/summary/event_reader.h"

namespace dtrain::cli {
namespace {

namespace fs = std::filesystem;
using summary::Event;
using summary::EventKind;
using summary::SummaryValue;
using summary::ValueKind;

struct EventsFlags {
  std::string path;
  bool json = false;
  bool skip_corrupt = false;
};

// Shortest text that reads back to the same value; float32 values print as float32 ("0.1").
std::string number(double v, bool as_float) {
  char buf[64];
  const auto r = as_float ? std::to_chars(buf, buf + sizeof buf, static_cast<float>(v))
                          : std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

bool is_float32(const SummaryValue& v) {
  return v.kind == ValueKind::kSimpleValue || v.dtype == DType::kFloat32;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// "scalar", "text" or "tensor"/"histo"/... : how a value is shown.
std::string value_type(const SummaryValue& v) {
  if (v.is_scalar()) return "scalar";
  if (v.kind == ValueKind::kTensor && v.dtype == DType::kString) return "text";
  return summary::value_kind_name(v.kind);
}

nlohmann::json value_json(const SummaryValue& v) {
  nlohmann::json j = {{"tag", v.tag}, {"type", value_type(v)}};
  if (v.is_scalar()) {
    j["value"] = v.value;
  } else if (v.kind == ValueKind::kTensor && v.dtype == DType::kString) {
    j["text"] = v.text();
  }
  if (v.kind == ValueKind::kTensor) {
    j["dtype"] = dtype_name(v.dtype);
    j["shape"] = v.shape;
  }
  if (!v.metadata.plugin_name.empty()) j["plugin"] = v.metadata.plugin_name;
  return j;
}

std::string value_text(const SummaryValue& v) {
  std::string s = value_type(v) + " tag=" + nlohmann::json(v.tag).dump();
  if (v.is_scalar()) {
    s += " value=" + number(v.value, is_float32(v));
  } else if (v.kind == ValueKind::kTensor && v.dtype == DType::kString) {
    s += " text=" + nlohmann::json(v.text()).dump();
  }
  if (v.kind == ValueKind::kTensor) {
    s += std::string(" dtype=") + dtype_name(v.dtype);
    if (!v.shape.empty()) s += " shape=" + shape_string(v.shape);
  }
  if (!v.metadata.plugin_name.empty()) s += " plugin=" + v.metadata.plugin_name;
  return s;
}

void print_event(const Event& e, uint64_t offset, bool json) {
  const char* kind = summary::event_kind_name(e.kind);
  if (json) {
    nlohmann::json j = {
        {"offset", offset}, {"wall_time", e.wall_time}, {"step", e.step}, {"kind", kind}};
    switch (e.kind) {
      case EventKind::kFileVersion:
        j["file_version"] = e.file_version;
        break;
      case EventKind::kSummary: {
        nlohmann::json values = nlohmann::json::array();
        for (const SummaryValue& v : e.values) values.push_back(value_json(v));
        j["values"] = values;
        break;
      }
      case EventKind::kSessionLog:
        j["status"] = static_cast<int>(e.session_status);
        j["checkpoint_path"] = e.checkpoint_path;
        j["message"] = e.message;
        break;
      case EventKind::kLogMessage:
        j["level"] = e.log_level;
        j["message"] = e.message;
        break;
      default:
        if (!e.blob.empty()) j["bytes"] = e.blob.size();
        break;
    }
    std::cout << j.dump() << "\n";
    return;
  }
  const std::string head = "@" + std::to_string(offset) +
                           " wall_time=" + number(e.wall_time, false) +
                           " step=" + std::to_string(e.step) + " ";
  switch (e.kind) {
    case EventKind::kFileVersion:
      std::cout << head << "file_version=" << nlohmann::json(e.file_version).dump() << "\n";
      break;
    case EventKind::kSummary:
      if (e.values.empty()) std::cout << head << "summary (empty)\n";
      for (const SummaryValue& v : e.values) std::cout << head << value_text(v) << "\n";
      break;
    case EventKind::kSessionLog: {
      static const char* kStatus[] = {"UNSPECIFIED", "START", "STOP", "CHECKPOINT"};
      const int s = static_cast<int>(e.session_status);
      std::cout << head << "session_log status=" << (s >= 0 && s <= 3 ? kStatus[s] : "?")
                << " checkpoint_path=" << nlohmann::json(e.checkpoint_path).dump()
                << " msg=" << nlohmann::json(e.message).dump() << "\n";
      break;
    }
    case EventKind::kLogMessage:
      std::cout << head << "log_message level=" << e.log_level
                << " message=" << nlohmann::json(e.message).dump() << "\n";
      break;
    default:
      std::cout << head << kind << " (" << e.blob.size() << " bytes)\n";
      break;
  }
}

// Dumps one file; returns the number of events.
uint64_t dump_file(const std::string& path, const EventsFlags& flags, bool header) {
  if (header && !flags.json) std::cout << "# " << path << "\n";
  summary::EventReader reader(path, {.skip_corrupt = flags.skip_corrupt});
  size_t reported = 0;
  auto report_skips = [&] {
    for (; reported < reader.corrupt_regions().size(); ++reported) {
      const auto& r = reader.corrupt_regions()[reported];
      std::cout.flush();
      std::cerr << "dtrain events: warning: " << path << ": skipped " << r.length
                << " corrupt bytes at offset " << r.offset << ": " << r.reason << "\n";
    }
  };
  while (auto e = reader.next()) {
    report_skips();
    print_event(*e, reader.record_offset(), flags.json);
  }
  report_skips();
  std::cout.flush();
  if (reader.truncated()) {
    std::cerr << "dtrain events: warning: " << path << ": " << reader.truncation()
              << " (a torn last write; the records before it are complete)\n";
  }
  return reader.count();
}

int run_events(const EventsFlags& flags) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(flags.path, ec)) {
    // Like TensorBoard: every file whose name contains "tfevents", in lexicographic order.
    for (const auto& entry : fs::recursive_directory_iterator(flags.path)) {
      if (entry.is_regular_file() &&
          entry.path().filename().string().find("tfevents") != std::string::npos) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      throw NotFoundError(
          str_cat("no event files (names containing \"tfevents\") under ", flags.path));
    }
  } else {
    files.push_back(flags.path);
  }
  uint64_t total = 0;
  for (const std::string& f : files) total += dump_file(f, flags, files.size() > 1);
  if (!flags.json) std::cout << total << " records in " << files.size() << " file(s)\n";
  return 0;
}

}  // namespace

void add_events_command(CLI::App& app, std::function<int()>& run) {
  static EventsFlags flags;
  CLI::App* cmd = app.add_subcommand(
      "events", "Dump the records of TensorBoard event files (TensorFlow's, PyTorch's, dtrain's)");
  cmd->add_option("path", flags.path, "An event file, or a log directory (every *tfevents* file)")
      ->required();
  cmd->add_flag("--json", flags.json, "One JSON object per record");
  cmd->add_flag("--skip-corrupt", flags.skip_corrupt,
                "Skip records that fail their CRC (with a warning) instead of stopping with a "
                "DATA_LOSS error");
  cmd->callback([&run] { run = [] { return run_events(flags); }; });
}

}  // namespace dtrain::cli
