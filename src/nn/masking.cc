// Mask helpers.
#include "masking.h"

#include "dtrain/core/error.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::nn::detail {

Tensor nonzero_mask(const Tensor& ids) {
  const Tensor f = ids.dtype() == DType::kFloat32 ? ids : ops::cast(ids, DType::kFloat32);
  Tensor out(f.shape());
  const float* p = f.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < f.num_elements(); ++i) o[i] = p[i] != 0.0f ? 1.0f : 0.0f;
  return out;
}

Tensor sequence_mask(const Tensor& mask, int64_t batch, int64_t time, const Layer& layer) {
  DTRAIN_CHECK(mask.defined() && mask.rank() == 2 && mask.dim(0) == batch && mask.dim(1) == time,
               layer.class_name(), " '", layer.name(), "': the mask must be [batch, time] = [",
               batch, ", ", time, "], got ",
               mask.defined() ? mask.shape().to_string() : std::string("undefined"));
  return nonzero_mask(mask);
}

Tensor mask_and(const Tensor& a, const Tensor& b, const Layer& layer) {
  DTRAIN_CHECK(a.shape() == b.shape(), layer.class_name(), " '", layer.name(),
               "': cannot combine masks of shapes ", a.shape().to_string(), " and ",
               b.shape().to_string());
  const Tensor fa = nonzero_mask(a), fb = nonzero_mask(b);
  Tensor out(fa.shape());
  const float* pa = fa.data<float>();
  const float* pb = fb.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < fa.num_elements(); ++i) o[i] = pa[i] * pb[i];
  return out;
}

}  // namespace dtrain::nn::detail
