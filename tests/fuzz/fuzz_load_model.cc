// load_model on arbitrary files: the first byte picks .keras (odd) or .h5 (even), the rest is
// the file (the fixtures of ../shared/fixtures/keras3 and keras_h5 as seeds). Any dtrain::Error
// is an expected answer; anything else is a bug (also one inside libhdf5 or libzip that a check
// of ours could have prevented, as for the global heap in h5_support.h).
#include <cstdint>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/train/saving.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string path =
      dtrain::fuzz::write_input(data + 1, size - 1, (data[0] & 1) != 0 ? ".keras" : ".h5");
  try {
    (void)dtrain::train::load_model(path);
  } catch (const dtrain::Error&) {
  }
  return 0;
}
