// ParameterServerStrategy's checkpoints and recovery: save (every server writes its shard, the
// chief its training position, then one merged TensorFlow checkpoint), restore, restore_latest
// (the newest valid checkpoint of a directory) and recover / recover_latest, which retry until
// every server is back and holds the restored state. Thread-safe as the header says.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <thread>

#include "distribute/coordination_common.h"
#include "distribute/parameter_server_strategy_impl.h"
#include "dtrain/checkpoint/merge_bundles.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/file.h"

namespace dtrain::distribute {
namespace {

using namespace ps_detail;  // NOLINT

// The training position save() records, as int64 scalars in the chief's shard.
constexpr const char* kEpochKey = "dtrain/epoch";
constexpr const char* kStepKey = "dtrain/step_in_epoch";

}  // namespace

void ParameterServerStrategy::save(const std::string& prefix, const TrainingPosition& position) {
  DTRAIN_CHECK(!prefix.empty(), "ParameterServerStrategy::save: empty prefix");
  DTRAIN_CHECK(position.epoch >= 0 && position.step >= 0,
               "ParameterServerStrategy::save: position (epoch ", position.epoch, ", step ",
               position.step, ") must be non-negative");
  const std::string temp = prefix + "_temp";
  std::vector<std::string> parts;
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    parts.push_back(str_cat(temp, "/part-", i));
    pb::SaveRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_prefix(parts.back());
    pb::SaveResponse resp;
    impl_->call(i, "save", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Save(c, req, &resp);
                });
  }
  // The chief's own shard: where training stood.
  parts.push_back(str_cat(temp, "/part-chief"));
  {
    checkpoint::BundleWriter writer(parts.back());
    Tensor epoch(DType::kInt64, Shape{}), step(DType::kInt64, Shape{});
    epoch.data<int64_t>()[0] = position.epoch;
    step.data<int64_t>()[0] = position.step;
    writer.add(kEpochKey, epoch);
    writer.add(kStepKey, step);
    writer.finish();
  }
  checkpoint::merge_bundles(parts, prefix);
  std::error_code ec;
  std::filesystem::remove_all(temp, ec);
  // The state file names the merged checkpoint, as tf.train.CheckpointManager writes it.
  const std::filesystem::path p(prefix);
  const std::string base = p.filename().string();
  write_file_atomically((p.parent_path() / "checkpoint").string(),
                        str_cat("model_checkpoint_path: \"", base,
                                "\"\nall_model_checkpoint_paths: \"", base, "\"\n"));
}

void ParameterServerStrategy::restore(const std::string& prefix) {
  for (size_t i = 0; i < impl_->ps.size(); ++i) {
    pb::RestoreRequest req;
    req.set_protocol(kParameterServerProtocol);
    req.set_prefix(prefix);
    pb::RestoreResponse resp;
    impl_->call(i, "restore", options_.rpc_timeout,
                [&](grpc::ClientContext* c, pb::ParameterServer::Stub* s) {
                  return s->Restore(c, req, &resp);
                });
  }
}

namespace {

struct Candidate {
  ParameterServerCheckpoint checkpoint;
  std::filesystem::file_time_type written;
};

void warn_skipped(const std::string& prefix, const std::string& why) {
  std::fprintf(stderr, "ParameterServerStrategy: skipping checkpoint %s: %s\n", prefix.c_str(),
               why.c_str());
  std::fflush(stderr);
}

int64_t read_int64_scalar(const checkpoint::BundleReader& r, const char* key) {
  const Tensor t = r.read(key);
  if (t.dtype() != DType::kInt64 || t.num_elements() != 1) {
    throw DataLossError(str_cat(r.prefix(), ": '", key, "' is ", dtype_name(t.dtype()), " ",
                                t.shape().to_string(), ", expected an int64 scalar"));
  }
  return t.data<int64_t>()[0];
}

// The checkpoints save() wrote into `dir` (those with a recorded position), newest first.
std::vector<Candidate> position_checkpoints(const std::string& dir) {
  std::vector<Candidate> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return out;  // no directory: no checkpoint
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    constexpr std::string_view kIndex = ".index";
    if (name.size() <= kIndex.size() || !name.ends_with(kIndex)) continue;
    const std::string prefix =
        (entry.path().parent_path() / name.substr(0, name.size() - kIndex.size())).string();
    try {
      const checkpoint::BundleReader r(prefix);
      if (!r.contains(kEpochKey) || !r.contains(kStepKey)) continue;  // not a save() of ours
      const TrainingPosition at{.epoch = read_int64_scalar(r, kEpochKey),
                                .step = read_int64_scalar(r, kStepKey)};
      if (at.epoch < 0 || at.step < 0) {
        throw DataLossError(
            str_cat("recorded position (epoch ", at.epoch, ", step ", at.step, ") is negative"));
      }
      std::error_code tec;
      const auto written = std::filesystem::last_write_time(entry.path(), tec);
      out.push_back({{.prefix = prefix, .position = at}, written});
    } catch (const Error& e) {
      warn_skipped(prefix, e.what());
    }
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    const auto& x = a.checkpoint.position;
    const auto& y = b.checkpoint.position;
    if (x.epoch != y.epoch) return x.epoch > y.epoch;
    if (x.step != y.step) return x.step > y.step;
    if (a.written != b.written) return a.written > b.written;
    return a.checkpoint.prefix > b.checkpoint.prefix;
  });
  return out;
}

}  // namespace

std::optional<ParameterServerCheckpoint> ParameterServerStrategy::restore_latest(
    const std::string& dir) {
  if (!is_chief()) {
    throw FailedPreconditionError(
        "ParameterServerStrategy::restore_latest: only the chief restores");
  }
  if (placement_.empty()) {
    throw FailedPreconditionError(
        "ParameterServerStrategy::restore_latest: call create_variables first");
  }
  const std::unique_ptr<optim::Optimizer> optimizer =
      optim::optimizer_from_config(impl_->optimizer);
  bool attempted = false;
  std::string last_error;
  for (const Candidate& c : position_checkpoints(dir)) {
    const std::string& prefix = c.checkpoint.prefix;
    // Check everything here first, so the servers only ever get a checkpoint they can load.
    try {
      const checkpoint::BundleReader r(prefix);
      for (const std::string& key : r.keys()) r.read(key);  // every CRC
      for (const VariablePlacement& v : placement_) {
        for (const VariableShard& shard : v.shards) {
          std::vector<std::string> keys = {shard.name};
          for (const std::string& slot : optimizer->slot_names()) {
            keys.push_back(str_cat(optimizer->name(), "/", slot, "/", shard.name));
          }
          for (const std::string& key : keys) {
            if (!r.contains(key)) {
              throw NotFoundError(str_cat("it has no '", key, "' (another model or optimizer?)"));
            }
            const checkpoint::BundleEntry& e = r.entry(key);
            if (e.shape != shard.shape || e.dtype != v.dtype) {
              throw InvalidArgumentError(
                  str_cat("'", key, "' is ", dtype_name(e.dtype), " ", e.shape.to_string(),
                          ", this model has ", dtype_name(v.dtype), " ", shard.shape.to_string()));
            }
          }
        }
      }
    } catch (const Error& e) {
      warn_skipped(prefix, e.what());
      continue;
    }
    try {
      attempted = true;
      restore(prefix);
      return c.checkpoint;
    } catch (const UnavailableError&) {
      throw;
    } catch (const DeadlineExceededError&) {
      throw;
    } catch (const Error& e) {
      // Changed under us since the check; an older checkpoint overwrites every server again.
      last_error = e.what();
      warn_skipped(prefix, e.what());
    }
  }
  if (attempted) {
    throw DataLossError(str_cat("ParameterServerStrategy::restore_latest: no checkpoint in ", dir,
                                " could be restored into every server (the servers may hold a "
                                "mix); last error: ",
                                last_error));
  }
  return std::nullopt;
}

void ParameterServerStrategy::confirm_registered(const std::vector<uint64_t>& incarnations) {
  const std::vector<ParameterServerStats> stats = server_stats();
  for (size_t i = 0; i < stats.size(); ++i) {
    if (!stats[i].initialized || stats[i].incarnation != incarnations[i]) {
      throw UnavailableError(
          str_cat(impl_->ps_names[i], " restarted while the chief was restoring it"));
    }
  }
}

void ParameterServerStrategy::with_recovery_retries(
    const char* what, const std::function<void(Clock::time_point)>& attempt) {
  const auto start = Clock::now();
  const auto deadline = start + options_.connect_timeout;
  milliseconds pause(50);
  for (int n = 1;; ++n) {
    std::string error;
    try {
      attempt(deadline);
      return;
    } catch (const UnavailableError& e) {
      error = e.what();
    } catch (const DeadlineExceededError& e) {
      error = e.what();
    }
    if (Clock::now() + pause >= deadline) {
      throw UnavailableError(str_cat("ParameterServerStrategy::", what,
                                     ": the parameter servers did not all come back within ",
                                     options_.connect_timeout.count(), " ms (", n,
                                     " attempts); last error: ", error));
    }
    std::fprintf(stderr, "ParameterServerStrategy::%s: attempt %d: %s; retrying in %lld ms\n", what,
                 n, error.c_str(), static_cast<long long>(pause.count()));
    std::fflush(stderr);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(1000));
  }
}

void ParameterServerStrategy::recover(std::span<Variable* const> vars, const std::string& prefix) {
  with_recovery_retries("recover", [&](Clock::time_point deadline) {
    const std::vector<uint64_t> incarnations = register_variables(vars, deadline);
    if (!prefix.empty()) restore(prefix);
    confirm_registered(incarnations);
  });
}

std::optional<ParameterServerCheckpoint> ParameterServerStrategy::recover_latest(
    std::span<Variable* const> vars, const std::string& dir) {
  std::optional<ParameterServerCheckpoint> restored;
  with_recovery_retries("recover_latest", [&](Clock::time_point deadline) {
    const std::vector<uint64_t> incarnations = register_variables(vars, deadline);
    restored = restore_latest(dir);
    confirm_registered(incarnations);
  });
  return restored;
}

}  // namespace dtrain::distribute
