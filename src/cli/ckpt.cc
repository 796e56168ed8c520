// dtrain ckpt ls|inspect|verify|diff|convert: tools for TensorFlow-format checkpoints (TensorBundle
// V2, dtrain's or TensorFlow's) and Keras .h5 files, in the spirit of tf.train.list_variables and
// TF's inspect_checkpoint (docs/checkpoint-cli.md). Flags and printing only: what is checked and
// converted lives in dtrain/checkpoint/verify.h and dtrain/train/convert_checkpoint.h.
// Single-threaded.
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

#include "ckpt_format.h"
#include "commands.h"
#include "dtrain/checkpoint/keras_h5.h"
#include "dtrain/checkpoint/keras_v3.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/checkpoint/verify.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/train/convert_checkpoint.h"

namespace dtrain::cli {
namespace {

namespace fs = std::filesystem;
using checkpoint::BundleEntry;
using checkpoint::BundleReader;
using checkpoint::CheckpointInfo;
using ckpt_format::dtype_string;
using ckpt_format::element;
using ckpt_format::format_element;
using ckpt_format::format_strings;
using ckpt_format::format_values;
using ckpt_format::hex_crc;
using ckpt_format::human_bytes;
using ckpt_format::utc_time;

// ---------------------------------------------------------------------------------------------
// Helpers

bool is_h5(const std::string& path) {
  return checkpoint::is_keras_h5_path(path) || checkpoint::is_hdf5_file(path);
}

// ---------------------------------------------------------------------------------------------
// ls

struct LsFlags {
  std::string dir;
  bool quick = false;
  bool json = false;
};

int run_ls(const LsFlags& f) {
  const checkpoint::CheckpointListing listing =
      checkpoint::list_checkpoints(f.dir, {.quick = f.quick});
  const std::vector<CheckpointInfo>& sorted = listing.checkpoints;
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const CheckpointInfo& r : sorted) {
      nlohmann::json j = {{"prefix", r.prefix},       {"time", r.time},     {"bytes", r.bytes},
                          {"committed", r.committed}, {"newest", r.newest}, {"status", r.status}};
      j["step"] = r.step ? nlohmann::json(*r.step) : nlohmann::json(nullptr);
      if (!r.detail.empty()) j["detail"] = r.detail;
      out.push_back(j);
    }
    std::cout << out.dump(2) << "\n";
  } else {
    if (!listing.state_problem.empty()) {
      std::cout << "warning: " << listing.state_problem << "\n";
    }
    if (sorted.empty()) {
      std::cout << "no checkpoints in " << f.dir << "\n";
      return 0;
    }
    size_t w = 10;
    for (const CheckpointInfo& r : sorted)
      w = std::max(w, fs::path(r.prefix).filename().string().size());
    std::printf("%-*s  %8s  %-20s  %10s  %-9s  %s\n", static_cast<int>(w), "checkpoint", "step",
                "time (UTC)", "size", "committed", "status");
    for (const CheckpointInfo& r : sorted) {
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

// A Keras 3 .keras archive: the variables of model.weights.h5 as "<path>/vars/<i>".
int inspect_keras_v3(const InspectFlags& f) {
  const checkpoint::KerasV3Contents c = checkpoint::read_keras_v3(f.path);
  std::vector<std::pair<std::string, const Tensor*>> rows;
  for (const auto& v : c.vars) {
    for (size_t i = 0; i < v.values.size(); ++i) {
      rows.emplace_back(str_cat(v.path.empty() ? "" : v.path + "/", "vars/", i), &v.values[i]);
    }
  }
  size_t width = 0;
  for (const auto& [key, t] : rows) width = std::max(width, key.size());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, t] : rows) {
    if (!f.keys.empty() && std::find(f.keys.begin(), f.keys.end(), key) == f.keys.end()) continue;
    if (f.json) {
      nlohmann::json j = {
          {"key", key}, {"dtype", dtype_name(t->dtype())}, {"shape", t->shape().to_vector()}};
      if (f.values) j["values"] = format_values(*t, f.limit);
      out.push_back(j);
    } else {
      std::printf("%-*s  %-8s  %s", static_cast<int>(width), key.c_str(), dtype_name(t->dtype()),
                  t->shape().to_string().c_str());
      if (f.values) std::printf("  %s", format_values(*t, f.limit).c_str());
      std::printf("\n");
    }
  }
  if (f.json) std::cout << out.dump(2) << "\n";
  return 0;
}

bool is_keras_archive(const std::string& path) {
  return checkpoint::is_zip_file(path) ||
         (checkpoint::is_keras_v3_path(path) && !checkpoint::is_hdf5_file(path));
}

int run_inspect(const InspectFlags& f) {
  if (is_keras_archive(f.path)) return inspect_keras_v3(f);
  if (is_h5(f.path)) return inspect_h5(f);
  const std::string prefix = checkpoint::resolve_prefix(f.path);
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
      if (e.dtype == DType::kString) {
        shown = format_strings(reader.read_strings(key), key, f.limit);
      } else {
        shown = format_values(reader.read(key), f.limit);
      }
    }
    // A partitioned tensor (a sharded checkpoint's): its full shape, then each slice with the
    // data shard holding it, its bytes and its CRC32C.
    int64_t bytes = e.size;
    nlohmann::json slices = nlohmann::json::array();
    for (const checkpoint::TensorSlice& s : e.slices) {
      const BundleEntry& se = reader.slice_entry(key, s);
      bytes += se.size;
      slices.push_back({{"slice", s.to_string()},
                        {"shape", std::vector<int64_t>(se.shape.begin(), se.shape.end())},
                        {"shard", se.shard_id},
                        {"bytes", se.size},
                        {"crc32c", hex_crc(crc32c::unmask(se.masked_crc32c))}});
    }
    if (f.json) {
      nlohmann::json j = {{"key", key},
                          {"dtype", dtype_string(e.dtype)},
                          {"shape", std::vector<int64_t>(e.shape.begin(), e.shape.end())},
                          {"bytes", bytes}};
      if (e.partitioned) j["slices"] = slices;
      if (f.values) j["values"] = shown;
      out.push_back(j);
    } else {
      std::printf("%-*s  %-8s  %s", static_cast<int>(width), key.c_str(),
                  dtype_string(e.dtype).c_str(), e.shape.to_string().c_str());
      if (e.partitioned) std::printf("  (%zu slices)", e.slices.size());
      if (f.values) std::printf("  %s", shown.c_str());
      std::printf("\n");
      for (const nlohmann::json& s : slices) {
        std::printf("%-*s    slice %s  shard %d  %lld bytes  crc32c %s\n", static_cast<int>(width),
                    "", s["slice"].get<std::string>().c_str(), s["shard"].get<int>(),
                    static_cast<long long>(s["bytes"].get<int64_t>()),
                    s["crc32c"].get<std::string>().c_str());
      }
    }
  }
  if (f.json) std::cout << out.dump(2) << "\n";
  return 0;
}

// ---------------------------------------------------------------------------------------------
// verify

int run_verify(const std::string& path) {
  if (is_keras_archive(path)) {
    const checkpoint::KerasV3Contents c = checkpoint::read_keras_v3(path);  // DataLossError
    size_t n = 0;
    for (const auto& v : c.vars) n += v.values.size();
    std::printf("OK %s: %zu variables readable, every zip member's CRC-32 matches\n", path.c_str(),
                n);
    return 0;
  }
  if (is_h5(path)) {
    const size_t n = checkpoint::verify_keras_h5(path);  // DataLossError
    std::printf("OK %s: %zu weights readable (HDF5 files carry no per-tensor checksums)\n",
                path.c_str(), n);
    return 0;
  }
  const std::string prefix = checkpoint::resolve_prefix(path);
  const checkpoint::BundleVerification r = checkpoint::verify_bundle(prefix);
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
  const std::string pa = checkpoint::resolve_prefix(f.a), pb = checkpoint::resolve_prefix(f.b);
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
  train::ConvertCheckpointOptions options;
};

int run_convert(const ConvertFlags& f) {
  const train::ConvertCheckpointResult r = train::convert_checkpoint(f.src, f.dst, f.options);
  for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (checkpoint::is_keras_h5_path(f.dst)) {
    std::printf("wrote %s: model%s from %s (%zu values restored)\n", r.destination.c_str(),
                r.optimizer ? " and optimizer" : "", r.source.c_str(), r.restored);
  } else {
    std::printf("wrote %s: %zu tensors (model%s) from %s\n", r.destination.c_str(), r.tensors,
                r.optimizer ? " and optimizer" : "", r.source.c_str());
  }
  return 0;
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
      "--model", convert->options.model,
      "The architecture: Keras model JSON or an .h5 written by model.save (needed to write .h5 "
      "and to read a weights-only .h5)");
  convert_cmd->add_flag("--skip-optimizer", convert->options.skip_optimizer,
                        "Convert the model's weights only");
  convert_cmd->add_flag(
      "--overwrite", convert->options.overwrite,
      "Replace DST when it is an existing checkpoint or file (refused otherwise)");
  convert_cmd->callback([convert, &run] { run = [convert] { return run_convert(*convert); }; });
}

}  // namespace dtrain::cli
