// model_from_json on arbitrary text (Keras 2 and 3 model configs as seeds). Any dtrain::Error is
// an expected answer; anything else is a bug.
#include <cstdint>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/nn/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)dtrain::nn::model_from_json(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const dtrain::Error&) {
  }
  return 0;
}
