// BuildInfo from the configure-time header and the compiler's predefined macros.
#include "dtrain/core/build_info.h"

#include "build_config.h"
#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"

namespace dtrain {
namespace {

// The instruction-set extensions this translation unit was compiled for (what -march enabled).
std::string compiled_isa() {
  std::string s;
  const auto add = [&s](const char* name) {
    if (!s.empty()) s += ' ';
    s += name;
  };
#if defined(__x86_64__)
  add("x86-64");
#elif defined(__aarch64__)
  add("aarch64");
#endif
#ifdef __SSE4_2__
  add("sse4.2");
#endif
#ifdef __AVX__
  add("avx");
#endif
#ifdef __AVX2__
  add("avx2");
#endif
#ifdef __FMA__
  add("fma");
#endif
#ifdef __F16C__
  add("f16c");
#endif
#ifdef __AVX512F__
  add("avx512f");
#endif
#ifdef __AVX512BW__
  add("avx512bw");
#endif
#ifdef __AVX512DQ__
  add("avx512dq");
#endif
#ifdef __AVX512VL__
  add("avx512vl");
#endif
#ifdef __AVX512VNNI__
  add("avx512vnni");
#endif
#ifdef __AVX512BF16__
  add("avx512bf16");
#endif
#ifdef __AVX512FP16__
  add("avx512fp16");
#endif
#ifdef __AMX_TILE__
  add("amx-tile");
#endif
#ifdef __ARM_FEATURE_FMA
  add("fma");
#endif
#ifdef __ARM_FEATURE_SVE
  add("sve");
#endif
  return s;
}

std::string compiler_name() {
#if defined(__clang__)
  return str_cat("Clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  return str_cat("GCC ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

}  // namespace

BuildInfo build_info() {
  return {.version = DTRAIN_BUILD_VERSION,
          .compiler = compiler_name(),
          .arch = DTRAIN_BUILD_ARCH,
          .arch_resolved = DTRAIN_BUILD_ARCH_RESOLVED,
          .isa = compiled_isa(),
          .flags = DTRAIN_BUILD_FLAGS,
          .flush_denormals = flush_denormals_enabled()};
}

std::string build_fingerprint() {
  const BuildInfo b = build_info();
  const std::string arch = b.arch.empty() ? "compiler default" : "-march=" + b.arch;
  const std::string resolved =
      b.arch_resolved.empty() || b.arch_resolved == b.arch ? "" : " (" + b.arch_resolved + ")";
  return str_cat("dtrain ", b.version, "; ", b.compiler, "; ", arch, resolved, ": ", b.isa, "; ",
                 b.flags, "; flush_denormals=", b.flush_denormals ? "on" : "off");
}

}  // namespace dtrain
