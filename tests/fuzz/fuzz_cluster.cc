// The cluster resolvers on arbitrary values: TF_CONFIG JSON, a Slurm node list, and the
// launcher's and MPI's variables (an input's first byte picks which; the rest is the value).
// Any dtrain::Error is an expected answer, anything else a bug.
#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/distribute/cluster_resolver.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 4;
  const std::string value(reinterpret_cast<const char*>(data) + 1, size - 1);
  namespace d = dtrain::distribute;
  try {
    switch (which) {
      case 0:
        (void)d::parse_tf_config(value);
        break;
      case 1:
        (void)d::expand_slurm_hostlist(value);
        (void)d::resolve_slurm([&](const std::string& name) -> std::optional<std::string> {
          if (name == "SLURM_JOB_NODELIST" || name == "SLURM_STEP_NODELIST") return value;
          if (name == "SLURM_PROCID" || name == "SLURM_NTASKS") return std::string("1");
          return std::nullopt;
        });
        break;
      case 2:
        (void)d::resolve_launcher([&](const std::string& name) -> std::optional<std::string> {
          if (name == "DTRAIN_RANK" || name == "DTRAIN_WORLD_SIZE") return value;
          if (name == "DTRAIN_RDZV") return std::string("127.0.0.1:1");
          return std::nullopt;
        });
        break;
      default:
        (void)d::resolve_mpi([&](const std::string& name) -> std::optional<std::string> {
          if (name == "OMPI_COMM_WORLD_RANK" || name == "OMPI_COMM_WORLD_SIZE") return value;
          return std::nullopt;
        });
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
