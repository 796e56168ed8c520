// dtrain ckpt ls|inspect|verify|diff|convert: tools for TensorFlow-format checkpoints (TensorBundle
// V2, dtrain's or TensorFlow's) and Keras .h5 files, in the spirit of tf.train.list_variables and
// TF's inspect_checkpoint (docs/checkpoint-cli.md). Single-threaded.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_state.h"
#include "checkpoint/object_graph.h"
#include "commands.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/nn/model.h"
#include "dtrain/train/saving.h"

namespace dtrain::cli {
namespace {

namespace fs = std::filesystem;
using checkpoint::BundleEntry;
using checkpoint::BundleReader;

// ---------------------------------------------------------------------------------------------
// Helpers

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "ckpt-12" → 12; nullopt when the name does not end in "-<digits>".
std::optional<int64_t> number_suffix(const std::string& prefix) {
  const size_t dash = prefix.find_last_of('-');
  if (dash == std::string::npos || dash + 1 == prefix.size()) return std::nullopt;
  int64_t n = 0;
  const char* b = prefix.data() + dash + 1;
  const char* e = prefix.data() + prefix.size();
  const auto r = std::from_chars(b, e, n);
  if (r.ec != std::errc() || r.ptr != e) return std::nullopt;
  return n;
}

// A checkpoint prefix from what a user may type: the prefix itself, its `.index` or a data
// file, or a directory (its newest committed checkpoint, as tf.train.list_variables does).
std::string resolve_prefix(const std::string& arg) {
  std::error_code ec;
  if (fs::is_directory(arg, ec)) {
    if (auto latest = checkpoint::latest_checkpoint(arg)) return *latest;
    throw NotFoundError(str_cat("no committed checkpoint in directory ", arg,
                                " (no 'checkpoint' state file naming an existing .index)"));
  }
  if (ends_with(arg, ".index")) return arg.substr(0, arg.size() - 6);
  const size_t data = arg.rfind(".data-");
  if (data != std::string::npos && arg.find("-of-", data) != std::string::npos) {
    return arg.substr(0, data);
  }
  return arg;
}

bool is_h5(const std::string& path) {
  return checkpoint::is_keras_h5_path(path) || checkpoint::is_hdf5_file(path);
}

// Total size of `<prefix>.index` and its data shards; 0 for files that are missing.
uint64_t checkpoint_bytes(const std::string& prefix) {
  std::error_code ec;
  uint64_t total = 0;
  const fs::path p(prefix);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string base = p.filename().string();
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == base + ".index" ||
        (name.rfind(base + ".data-", 0) == 0 && name.find(".tmp.") == std::string::npos)) {
      const auto size = entry.file_size(ec);
      if (!ec) total += size;
    }
  }
  return total;
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  } else if (n < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  } else if (n < (1u << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
  }
  return buf;
}

std::string utc_time(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double mtime_seconds(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Element i of a numeric tensor as a double.
double element(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.raw_data()) + i * dtype_size(t.dtype());
  auto get = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<double>(v);
  };
  switch (t.dtype()) {
    case DType::kFloat32:
      return get(float{});
    case DType::kFloat64:
      return get(double{});
    case DType::kInt32:
      return get(int32_t{});
    case DType::kUInt8:
      return get(uint8_t{});
    case DType::kInt16:
      return get(int16_t{});
    case DType::kInt8:
      return get(int8_t{});
    case DType::kInt64:
      return get(int64_t{});
    case DType::kBool:
      return *p != 0 ? 1.0 : 0.0;
    case DType::kUInt16:
      return get(uint16_t{});
    case DType::kUInt32:
      return get(uint32_t{});
    case DType::kUInt64:
      return get(uint64_t{});
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t bits = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_float(h);
    }
    default:
      throw UnimplementedError(str_cat("no element access for dtype ", dtype_name(t.dtype())));
  }
}

// Shortest text that reads back to the same value (float32 values as float32).
std::string format_element(const Tensor& t, int64_t i) {
  const double v = element(t, i);
  if (t.dtype() == DType::kBool) return v != 0 ? "true" : "false";
  char buf[64];
  std::to_chars_result r;
  switch (t.dtype()) {
    case DType::kFloat64:
      r = std::to_chars(buf, buf + sizeof buf, v);
      break;
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v));
      break;
    case DType::kUInt64: {
      uint64_t u;
      std::memcpy(&u, static_cast<const char*>(t.raw_data()) + i * 8, 8);
      r = std::to_chars(buf, buf + sizeof buf, u);
      break;
    }
    case DType::kInt64: {
      int64_t s;
      std::memcpy(&s, static_cast<const char*>(t.raw_data()) + i * 8, 8);
      r = std::to_chars(buf, buf + sizeof buf, s);
      break;
    }
    default:
      r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
      break;
  }
  return std::string(buf, r.ptr);
}

// "[0.5, 2, ...]" with at most `limit` elements (0: all), flattened row-major.
std::string format_values(const Tensor& t, int64_t limit) {
  const int64_t n = t.num_elements();
  const int64_t shown = limit > 0 ? std::min(n, limit) : n;
  std::string s = t.rank() == 0 ? "" : "[";
  for (int64_t i = 0; i < shown; ++i) s += (i ? ", " : "") + format_element(t, i);
  if (shown < n) s += str_cat(", ... (", n - shown, " more)");
  return t.rank() == 0 ? s : s + "]";
}

std::string format_strings(const std::vector<std::string>& values, std::string_view key,
                           int64_t limit) {
  if (key == checkpoint::kObjectGraphKey) {
    return str_cat("<serialized TrackableObjectGraph, ", values.empty() ? 0 : values[0].size(),
                   " bytes>");
  }
  const size_t shown =
      limit > 0 ? std::min(values.size(), static_cast<size_t>(limit)) : values.size();
  std::string s = "[";
  for (size_t i = 0; i < shown; ++i) {
    s += (i ? ", " : "") +
         nlohmann::json(values[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (shown < values.size()) s += str_cat(", ... (", values.size() - shown, " more)");
  return s + "]";
}

std::string dtype_string(DType d) { return d == DType::kString ? "string" : dtype_name(d); }

// Reads (and so CRC-verifies) one tensor of any dtype; the object graph is also parsed.
void verify_tensor(const BundleReader& reader, const std::string& key) {
  const BundleEntry& e = reader.entry(key);
  if (e.dtype == DType::kString) {
    const std::vector<std::string> values = reader.read_strings(key);
    if (key == checkpoint::kObjectGraphKey && values.size() == 1) {
      checkpoint::ObjectGraph::parse(values[0], checkpoint::index_filename(reader.prefix()));
    }
  } else {
    reader.read(key);
  }
}

struct VerifyResult {
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> errors;  // one per corrupt tensor (DataLossError messages)
};

// Opens the bundle and reads every tensor. DataLossError from the index propagates; per-tensor
// data losses are collected so that every corrupt tensor is named.
VerifyResult verify_bundle(const std::string& prefix) {
  BundleReader reader(prefix);
  VerifyResult r;
  for (const std::string& key : reader.keys()) {
    const BundleEntry& e = reader.entry(key);
    if (e.partitioned) continue;  // slices: nothing dtrain can check
    try {
      verify_tensor(reader, key);
      ++r.tensors;
      r.bytes += static_cast<uint64_t>(e.size);
    } catch (const DataLossError& err) {
      r.errors.push_back(err.what());
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// ls

struct LsFlags {
  std::string dir;
  bool quick = false;
  bool json = false;
};

struct LsRow {
  std::string prefix;
  std::optional<int64_t> step;
  double time = 0;
  uint64_t bytes = 0;
  bool committed = false;
  bool newest = false;
  std::string status;  // "valid", "corrupt", "missing", "unchecked"
  std::string detail;  // why it is corrupt or missing
};

int run_ls(const LsFlags& f) {
  std::error_code ec;
  if (!fs::is_directory(f.dir, ec)) {
    if (!fs::exists(f.dir, ec)) throw NotFoundError(str_cat("ckpt ls: no such directory ", f.dir));
    throw InvalidArgumentError(str_cat("ckpt ls: ", f.dir, " is not a directory"));
  }
  std::optional<checkpoint::CheckpointState> state;
  std::string state_problem;
  try {
    state = checkpoint::read_checkpoint_state(f.dir);
  } catch (const DataLossError& e) {
    state_problem = e.what();
  }
  std::map<std::string, LsRow> rows;  // by file name
  auto row_for = [&](const std::string& prefix) -> LsRow& {
    const std::string name = fs::path(prefix).filename().string();
    LsRow& r = rows[name];
    if (r.prefix.empty()) r.prefix = (fs::path(f.dir) / name).string();
    return r;
  };
  for (const auto& entry : fs::directory_iterator(f.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".index") && name.find(".tmp.") == std::string::npos) {
      row_for(name.substr(0, name.size() - 6));
    }
  }
  if (ec) throw_file_error(ec.value(), "list directory", f.dir);
  if (state) {
    const auto& paths = state->all_model_checkpoint_paths;
    for (size_t i = 0; i < paths.size(); ++i) {
      LsRow& r = row_for(paths[i]);
      r.committed = true;
      if (i < state->all_model_checkpoint_timestamps.size()) {
        r.time = state->all_model_checkpoint_timestamps[i];
      }
    }
    if (!state->model_checkpoint_path.empty()) {
      LsRow& r = row_for(state->model_checkpoint_path);
      r.committed = true;
      r.newest = true;
    }
  }
  std::vector<LsRow> sorted;
  for (auto& [name, r] : rows) {
    r.step = number_suffix(name);
    const std::string index = checkpoint::index_filename(r.prefix);
    if (!fs::exists(index, ec)) {
      r.status = "missing";
      r.detail = str_cat("named by the state file but ", index, " does not exist");
    } else {
      if (r.time == 0) r.time = mtime_seconds(index);
      r.bytes = checkpoint_bytes(r.prefix);
      try {
        if (f.quick) {
          BundleReader reader(r.prefix);  // index checksums and data file sizes only
          r.status = "unchecked";
        } else {
          const VerifyResult v = verify_bundle(r.prefix);
          r.status = v.errors.empty() ? "valid" : "corrupt";
          if (!v.errors.empty()) r.detail = v.errors.front();
          if (v.errors.size() > 1) r.detail += str_cat(" (and ", v.errors.size() - 1, " more)");
        }
      } catch (const DataLossError& e) {
        r.status = "corrupt";
        r.detail = e.what();
      } catch (const Error& e) {
        r.status = "unreadable";
        r.detail = e.what();
      }
    }
    sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end(), [](const LsRow& a, const LsRow& b) {
    if (a.step.has_value() != b.step.has_value()) return a.step.has_value();
    if (a.step && *a.step != *b.step) return *a.step < *b.step;
    return a.prefix < b.prefix;
  });

  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const LsRow& r : sorted) {
      nlohmann::json j = {{"prefix", r.prefix},       {"time", r.time},     {"bytes", r.bytes},
                          {"committed", r.committed}, {"newest", r.newest}, {"status", r.status}};
      j["step"] = r.step ? nlohmann::json(*r.step) : nlohmann::json(nullptr);
      if (!r.detail.empty()) j["detail"] = r.detail;
      out.push_back(j);
    }
    std::cout << out.dump(2) << "\n";
  } else {
    if (!state_problem.empty()) std::cout << "warning: " << state_problem << "\n";
    if (sorted.empty()) {
      std::cout << "no checkpoints in " << f.dir << "\n";
      return 0;
    }
    size_t w = 10;
    for (const LsRow& r : sorted) w = std::max(w, fs::path(r.prefix).filename().string().size());
    std::printf("%-*s  %8s  %-20s  %10s  %-9s  %s\n", static_cast<int>(w), "checkpoint", "step",
                "time (UTC)", "size", "committed", "status");
    for (const LsRow& r : sorted) {
      const std::string name = fs::path(r.prefix).filename().string();
      const std::string step = r.step ? std::to_string(*r.step) : "-";
      const std::string committed = r.newest ? "newest" : (r.committed ? "yes" : "no");
      std::string status = r.status;
      if (!r.detail.empty()) status += ": " + r.detail;
      std::printf("%-*s  %8s  %-20s  %10s  %-9s  %s\n", static_cast<int>(w), name.c_str(),
                  step.c_str(), r.time > 0 ? utc_time(r.time).c_str() : "-",
                  r.status == "missing" ? "-" : human_bytes(r.bytes).c_str(), committed.c_str(),
                  status.c_str());
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// inspect

struct InspectFlags {
  std::string path;
  bool values = false;
  int64_t limit = 20;
  std::vector<std::string> keys;
  bool json = false;
};

int inspect_h5(const InspectFlags& f) {
  const std::vector<checkpoint::H5ObjectInfo> objects = checkpoint::list_h5_objects(f.path);
  std::map<std::string, Tensor> values;  // by dataset path
  if (f.values) {
    const checkpoint::KerasH5Contents c = checkpoint::read_keras_h5(f.path);
    const std::string root = c.weights_only ? "/" : "/model_weights/";
    for (const auto& layer : c.layers) {
      for (const auto& w : layer.weights) values[root + layer.name + "/" + w.name] = w.value;
    }
    for (const auto& w : c.top_level_weights) {
      values[root + "top_level_model_weights/" + w.name] = w.value;
    }
    for (const auto& w : c.optimizer_weights) values["/optimizer_weights/" + w.name] = w.value;
  }
  nlohmann::json out = nlohmann::json::array();
  size_t width = 0;
  for (const auto& o : objects) {
    if (!o.is_group) width = std::max(width, o.path.size());
  }
  for (const auto& o : objects) {
    if (o.is_group) continue;
    if (!f.keys.empty() && std::find(f.keys.begin(), f.keys.end(), o.path) == f.keys.end()) {
      continue;
    }
    auto it = values.find(o.path);
    if (f.json) {
      nlohmann::json j = {{"key", o.path}, {"dtype", o.dtype}, {"shape", std::vector<int64_t>()}};
      for (int64_t d : o.shape) j["shape"].push_back(d);
      if (it != values.end()) j["values"] = format_values(it->second, f.limit);
      out.push_back(j);
    } else {
      std::printf("%-*s  %-8s  %s", static_cast<int>(width), o.path.c_str(), o.dtype.c_str(),
                  o.shape.to_string().c_str());
      if (it != values.end()) std::printf("  %s", format_values(it->second, f.limit).c_str());
      std::printf("\n");
    }
  }
  if (f.json) std::cout << out.dump(2) << "\n";
  return 0;
}

int run_inspect(const InspectFlags& f) {
  if (is_h5(f.path)) return inspect_h5(f);
  const std::string prefix = resolve_prefix(f.path);
  BundleReader reader(prefix);
  std::vector<std::string> keys = reader.keys();
  for (const std::string& k : f.keys) {
    reader.entry(k);  // NotFoundError naming the key
  }
  if (!f.keys.empty()) keys = f.keys;
  size_t width = 0;
  for (const std::string& k : keys) width = std::max(width, k.size());
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& key : keys) {
    const BundleEntry& e = reader.entry(key);
    std::string shown;
    if (f.values) {
      if (e.partitioned) {
        shown = "<partitioned>";
      } else if (e.dtype == DType::kString) {
        shown = format_strings(reader.read_strings(key), key, f.limit);
      } else {
        shown = format_values(reader.read(key), f.limit);
      }
    }
    if (f.json) {
      nlohmann::json j = {{"key", key},
                          {"dtype", dtype_string(e.dtype)},
                          {"shape", std::vector<int64_t>(e.shape.begin(), e.shape.end())},
                          {"bytes", e.size}};
      if (f.values) j["values"] = shown;
      out.push_back(j);
    } else {
      std::printf("%-*s  %-8s  %s", static_cast<int>(width), key.c_str(),
                  dtype_string(e.dtype).c_str(), e.shape.to_string().c_str());
      if (f.values) std::printf("  %s", shown.c_str());
      std::printf("\n");
    }
  }
  if (f.json) std::cout << out.dump(2) << "\n";
  return 0;
}

// ---------------------------------------------------------------------------------------------
// verify

int run_verify(const std::string& path) {
  if (is_h5(path)) {
    const checkpoint::KerasH5Contents c = checkpoint::read_keras_h5(path);  // DataLossError
    size_t n = c.top_level_weights.size() + c.optimizer_weights.size();
    for (const auto& l : c.layers) n += l.weights.size();
    std::printf("OK %s: %zu weights readable (HDF5 files carry no per-tensor checksums)\n",
                path.c_str(), n);
    return 0;
  }
  const std::string prefix = resolve_prefix(path);
  const VerifyResult r = verify_bundle(prefix);
  if (!r.errors.empty()) {
    std::string msg = r.errors.front();
    if (r.errors.size() > 1) {
      msg += str_cat(" (", r.errors.size(), " of ", r.tensors + r.errors.size(),
                     " tensors are corrupt)");
    }
    throw DataLossError(msg);
  }
  std::printf("OK %s: %zu tensors, %llu bytes, every CRC32C matches\n", prefix.c_str(), r.tensors,
              static_cast<unsigned long long>(r.bytes));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// diff

struct DiffFlags {
  std::string a, b;
  double atol = 0;
  double rtol = 0;
  bool exit_code = false;
};

int run_diff(const DiffFlags& f) {
  const std::string pa = resolve_prefix(f.a), pb = resolve_prefix(f.b);
  BundleReader ra(pa), rb(pb);
  const std::vector<std::string> ka = ra.keys(), kb = rb.keys();
  const std::set<std::string> sa(ka.begin(), ka.end()), sb(kb.begin(), kb.end());
  std::set<std::string> all(sa);
  all.insert(sb.begin(), sb.end());
  size_t same = 0, differ = 0;
  for (const std::string& key : all) {
    if (!sb.count(key)) {
      const BundleEntry& e = ra.entry(key);
      std::printf("- %s  %s %s (only in A)\n", key.c_str(), dtype_string(e.dtype).c_str(),
                  e.shape.to_string().c_str());
      ++differ;
      continue;
    }
    if (!sa.count(key)) {
      const BundleEntry& e = rb.entry(key);
      std::printf("+ %s  %s %s (only in B)\n", key.c_str(), dtype_string(e.dtype).c_str(),
                  e.shape.to_string().c_str());
      ++differ;
      continue;
    }
    const BundleEntry& ea = ra.entry(key);
    const BundleEntry& eb = rb.entry(key);
    if (ea.dtype != eb.dtype || ea.shape != eb.shape) {
      std::printf("~ %s  %s %s -> %s %s\n", key.c_str(), dtype_string(ea.dtype).c_str(),
                  ea.shape.to_string().c_str(), dtype_string(eb.dtype).c_str(),
                  eb.shape.to_string().c_str());
      ++differ;
      continue;
    }
    if (ea.partitioned || eb.partitioned) {
      std::printf("? %s  partitioned, not compared\n", key.c_str());
      continue;
    }
    if (ea.dtype == DType::kString) {
      const bool eq = ra.read_strings(key) == rb.read_strings(key);
      if (eq) {
        ++same;
      } else {
        std::printf("~ %s  string values differ\n", key.c_str());
        ++differ;
      }
      continue;
    }
    const Tensor a = ra.read(key), b = rb.read(key);
    if (a.equals(b)) {
      ++same;
      continue;
    }
    int64_t changed = 0, first = -1;
    double max_abs = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      const double x = element(a, i), y = element(b, i);
      const double d = std::fabs(x - y);
      const bool close = d <= f.atol + f.rtol * std::fabs(y) || (std::isnan(x) && std::isnan(y));
      if (!close) {
        ++changed;
        if (first < 0) first = i;
      }
      if (!std::isnan(d)) max_abs = std::max(max_abs, d);
    }
    if (changed == 0) {
      ++same;
      continue;
    }
    ++differ;
    std::printf(
        "~ %s  %s %s: %lld of %lld values differ, max |a-b| = %g, first at [%lld] (%s -> "
        "%s)\n",
        key.c_str(), dtype_string(ea.dtype).c_str(), ea.shape.to_string().c_str(),
        static_cast<long long>(changed), static_cast<long long>(a.num_elements()), max_abs,
        static_cast<long long>(first), format_element(a, first).c_str(),
        format_element(b, first).c_str());
  }
  std::printf("%zu tensors differ, %zu identical%s\n", differ, same,
              f.atol > 0 || f.rtol > 0 ? " (within tolerance)" : "");
  return differ > 0 && f.exit_code ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// convert

struct ConvertFlags {
  std::string src, dst;
  std::string model;  // model.json or an .h5 with model_config: the architecture
  bool skip_optimizer = false;
};

// The architecture from --model: Keras model JSON, or an .h5 written by model.save (compiled
// when `compile`, with its optimizer).
std::unique_ptr<nn::Model> model_from_flag(const std::string& path, bool compile) {
  if (is_h5(path)) return train::load_model(path, {.compile = compile});
  std::unique_ptr<nn::Model> model = nn::model_from_json(read_file(path));
  if (!model->built()) {
    throw InvalidArgumentError(str_cat("ckpt convert: the model in ", path,
                                       " declares no input shape (an InputLayer or "
                                       "batch_input_shape), so its weights cannot be created"));
  }
  return model;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// .h5 → TF checkpoint: tf.train.Checkpoint(model=model, optimizer=optimizer).write(dst).
int convert_h5_to_prefix(const ConvertFlags& f) {
  const checkpoint::KerasH5Contents c = checkpoint::read_keras_h5(f.src);
  std::unique_ptr<nn::Model> model;
  if (c.weights_only || c.model_config.empty()) {
    if (f.model.empty()) {
      throw InvalidArgumentError(str_cat(
          "ckpt convert: ", f.src,
          " holds weights only (save_weights) and no architecture; pass --model model.json or "
          "--model x.h5 to supply it"));
    }
    model = model_from_flag(f.model, /*compile=*/false);
    train::load_weights(*model, f.src);
  } else {
    model = train::load_model(f.src, {.compile = !f.skip_optimizer});
  }
  std::vector<std::pair<std::string, checkpoint::Trackable>> children = {{"model", *model}};
  optim::Optimizer* opt = model->compiled() ? model->optimizer() : nullptr;
  if (opt != nullptr && !c.optimizer_weights.empty()) children.emplace_back("optimizer", *opt);
  checkpoint::Checkpoint ckpt(children);
  ckpt.write(f.dst);
  std::printf("wrote %s: %zu tensors (model%s) from %s\n", f.dst.c_str(), ckpt.keys().size(),
              children.size() > 1 ? " and optimizer" : "", f.src.c_str());
  return 0;
}

// TF checkpoint → .h5: restores the checkpoint into the --model architecture, then model.save.
int convert_prefix_to_h5(const ConvertFlags& f) {
  const std::string prefix = resolve_prefix(f.src);
  if (f.model.empty()) {
    throw InvalidArgumentError(str_cat(
        "ckpt convert: writing ", f.dst, " needs the model's architecture, which a TF checkpoint ",
        "does not hold; pass --model model.json or --model x.h5 (written by model.save)"));
  }
  std::vector<std::string> keys;
  {
    BundleReader reader(prefix);  // NotFoundError / DataLossError before building anything
    keys = reader.keys();
  }
  auto has_prefix = [&](std::string_view p) {
    return std::any_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return starts_with(k, p); });
  };
  // tf.train.Checkpoint(model=..., optimizer=...) puts the model under "model/"; Keras's
  // save_weights(prefix) makes the model the root.
  const bool model_child = has_prefix("model/");
  const bool has_optimizer = model_child && has_prefix("optimizer/") && !f.skip_optimizer;
  std::unique_ptr<nn::Model> model = model_from_flag(f.model, /*compile=*/has_optimizer);
  optim::Optimizer* opt = has_optimizer && model->compiled() ? model->optimizer() : nullptr;
  std::unique_ptr<checkpoint::Checkpoint> ckpt;
  if (model_child) {
    std::vector<std::pair<std::string, checkpoint::Trackable>> children = {{"model", *model}};
    if (opt != nullptr) children.emplace_back("optimizer", *opt);
    ckpt = std::make_unique<checkpoint::Checkpoint>(children);
  } else {
    ckpt = std::make_unique<checkpoint::Checkpoint>(checkpoint::Trackable(*model));
  }
  const checkpoint::CheckpointLoadStatus status = ckpt->restore(prefix);
  status.expect_partial();
  std::vector<std::string> missing_model, missing_optimizer;
  for (const std::string& k : status.missing_keys()) {
    const bool optimizer_key =
        starts_with(k, "optimizer/") || k.find("/.OPTIMIZER_SLOT/") != std::string::npos;
    (optimizer_key ? missing_optimizer : missing_model).push_back(k);
  }
  if (!missing_model.empty()) {
    throw InvalidArgumentError(
        str_cat("ckpt convert: ", prefix, " has no value for '", missing_model.front(), "'",
                missing_model.size() > 1 ? str_cat(" and ", missing_model.size() - 1, " more") : "",
                " of the model in ", f.model, ": the architecture does not match the checkpoint"));
  }
  bool include_optimizer = opt != nullptr;
  if (include_optimizer && !missing_optimizer.empty()) {
    std::fprintf(stderr,
                 "warning: ckpt convert: %s lacks '%s' of the optimizer from %s; writing %s "
                 "without optimizer state\n",
                 prefix.c_str(), missing_optimizer.front().c_str(), f.model.c_str(), f.dst.c_str());
    include_optimizer = false;
  }
  train::save_model(*model, f.dst, {.include_optimizer = include_optimizer});
  std::printf("wrote %s: model%s from %s (%zu values restored)\n", f.dst.c_str(),
              include_optimizer ? " and optimizer" : "", prefix.c_str(), status.restored_count());
  return 0;
}

int run_convert(const ConvertFlags& f) {
  const bool src_h5 = is_h5(f.src);
  const bool dst_h5 = checkpoint::is_keras_h5_path(f.dst);
  if (src_h5 == dst_h5) {
    throw InvalidArgumentError(str_cat(
        "ckpt convert: converts between an .h5 file and a TF checkpoint prefix; got ", f.src,
        " and ", f.dst, src_h5 ? " (both .h5)" : " (neither ends in .h5, .hdf5 or .keras)"));
  }
  return src_h5 ? convert_h5_to_prefix(f) : convert_prefix_to_h5(f);
}

}  // namespace

void add_ckpt_command(CLI::App& app, std::function<int()>& run) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "Inspect, verify, compare and convert checkpoints (TF format and Keras .h5)");
  ckpt->require_subcommand(1);

  auto ls = std::make_shared<LsFlags>();
  CLI::App* ls_cmd = ckpt->add_subcommand(
      "ls", "List the checkpoints of a directory: step, time, size, committed, valid or corrupt");
  ls_cmd->add_option("dir", ls->dir, "Checkpoint directory")->required();
  ls_cmd->add_flag("--quick", ls->quick,
                   "Check only the index and the data file sizes, not every tensor's CRC32C");
  ls_cmd->add_flag("--json", ls->json, "One JSON array");
  ls_cmd->callback([ls, &run] { run = [ls] { return run_ls(*ls); }; });

  auto inspect = std::make_shared<InspectFlags>();
  CLI::App* inspect_cmd = ckpt->add_subcommand(
      "inspect", "Keys, dtypes and shapes of a checkpoint (like tf.train.list_variables) or .h5");
  inspect_cmd
      ->add_option("path", inspect->path,
                   "Checkpoint prefix, its .index, a directory (its newest checkpoint) or an .h5")
      ->required();
  inspect_cmd->add_flag("--values", inspect->values, "Print values too");
  inspect_cmd
      ->add_option("--limit", inspect->limit, "Values shown per tensor with --values (0: all)")
      ->capture_default_str();
  inspect_cmd->add_option("--key", inspect->keys, "Only these keys (repeatable)");
  inspect_cmd->add_flag("--json", inspect->json, "One JSON array");
  inspect_cmd->callback([inspect, &run] { run = [inspect] { return run_inspect(*inspect); }; });

  auto verify_path = std::make_shared<std::string>();
  CLI::App* verify_cmd = ckpt->add_subcommand(
      "verify", "Read every tensor and check its CRC32C; exit 4 (DATA_LOSS) naming a corrupt one");
  verify_cmd->add_option("path", *verify_path, "Checkpoint prefix, directory or .h5")->required();
  verify_cmd->callback(
      [verify_path, &run] { run = [verify_path] { return run_verify(*verify_path); }; });

  auto diff = std::make_shared<DiffFlags>();
  CLI::App* diff_cmd =
      ckpt->add_subcommand("diff", "Keys, dtypes, shapes and values that differ between A and B");
  diff_cmd->add_option("a", diff->a, "Checkpoint prefix or directory")->required();
  diff_cmd->add_option("b", diff->b, "Checkpoint prefix or directory")->required();
  diff_cmd->add_option("--atol", diff->atol, "Absolute tolerance for values")
      ->capture_default_str();
  diff_cmd->add_option("--rtol", diff->rtol, "Relative tolerance for values (of B)")
      ->capture_default_str();
  diff_cmd->add_flag("--exit-code", diff->exit_code, "Exit with 1 when anything differs");
  diff_cmd->callback([diff, &run] { run = [diff] { return run_diff(*diff); }; });

  auto convert = std::make_shared<ConvertFlags>();
  CLI::App* convert_cmd = ckpt->add_subcommand(
      "convert", "Convert between a Keras .h5 file and a TF checkpoint prefix");
  convert_cmd->add_option("src", convert->src, "x.h5, or a checkpoint prefix or directory")
      ->required();
  convert_cmd->add_option("dst", convert->dst, "A checkpoint prefix, or x.h5")->required();
  convert_cmd->add_option(
      "--model", convert->model,
      "The architecture: Keras model JSON or an .h5 written by model.save (needed to write .h5 "
      "and to read a weights-only .h5)");
  convert_cmd->add_flag("--skip-optimizer", convert->skip_optimizer,
                        "Convert the model's weights only");
  convert_cmd->callback([convert, &run] { run = [convert] { return run_convert(*convert); }; });
}

}  // namespace dtrain::cli
