// Tests that judge dtrain's HDF5 files with h5py (Debian's python3-h5py), never with dtrain.
#pragma once

#include <cstdlib>

#include "testutil/run_dtrain.h"

namespace dtrain::testutil {

inline bool have_h5py() { return run_shell("/usr/bin/python3 -c 'import h5py' 2>&1").code == 0; }

}  // namespace dtrain::testutil

// Skips the test where /usr/bin/python3 has no h5py; under CI (CI set) fails instead:
// scripts/install_deps.sh brings python3-h5py, and a skip once hid that it did not.
#define DTRAIN_REQUIRE_H5PY()                                                            \
  do {                                                                                   \
    if (!::dtrain::testutil::have_h5py()) {                                              \
      if (std::getenv("CI") != nullptr) {                                                \
        FAIL() << "CI is set and /usr/bin/python3 has no h5py (scripts/install_deps.sh " \
                  "installs python3-h5py)";                                              \
      }                                                                                  \
      GTEST_SKIP() << "/usr/bin/python3 has no h5py (apt-get install python3-h5py)";     \
    }                                                                                    \
  } while (false)
