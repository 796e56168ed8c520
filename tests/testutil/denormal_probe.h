// denormal_times_big(): a subnormal float times a large one, computed on the calling thread at
// run time (volatile operands: no constant folding). 0 when the thread treats denormal inputs
// as zero (DAZ), about 1e-10 with exact IEEE arithmetic. tiny_product(): 1e-30 * 1e-10, a
// subnormal result: 0 when the thread flushes results to zero (FTZ).
#pragma once

namespace dtrain::testutil {

inline float denormal_times_big() {
  volatile float denormal = 1e-40f;
  volatile float big = 1e30f;
  return denormal * big;
}

inline float tiny_product() {
  volatile float a = 1e-30f;
  volatile float b = 1e-10f;
  return a * b;
}

}  // namespace dtrain::testutil
