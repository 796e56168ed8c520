// What this binary is, as far as its numbers are concerned: the dtrain version, the compiler,
// the instruction set it was compiled for and the flags that change code generation, and the
// process's flush-denormals setting. Workers of one multi-worker job must agree on it: two
// builds (or two settings) can round the same step differently, and mirrored variables would
// drift apart. Thread-safe.
#pragma once

#include <string>

namespace dtrain {

struct BuildInfo {
  std::string version;          // "0.1.0"
  std::string compiler;         // "GCC 12.2.0"
  std::string arch;             // -march as configured: "native", "x86-64-v3", "" (default)
  std::string arch_resolved;    // what it resolved to at configure time: "znver4", "x86-64-v3"
  std::string isa;              // the extensions the compiler targeted: "sse4.2 avx avx2 fma ..."
  std::string flags;            // code-generation flags: "-O3 -DNDEBUG -fno-math-errno ..."
  bool flush_denormals = true;  // flush_denormals_enabled() when build_info() was called
};

// This binary's BuildInfo, with the current flush-denormals setting. Throws
// InvalidArgumentError as flush_denormals_enabled() does.
BuildInfo build_info();

// build_info() on one line, the form workers compare and error messages quote:
// "dtrain 0.1.0; GCC 12.2.0; -march=native (znver4): sse4.2 avx avx2 fma ...; -O3 -DNDEBUG
// -fno-math-errno -march=native; flush_denormals=on".
std::string build_fingerprint();

}  // namespace dtrain
