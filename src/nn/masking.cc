// Mask helpers.
#include "masking.h"

#include "dtrain/core/error.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/ops/tensor_ops.h"

namespace dtrain::nn {
namespace {

// The model whose output mask this thread's call_with_output_mask waits for, and the mask.
struct OutputMaskRecorder {
  const Layer* model = nullptr;
  Tensor mask;
};
thread_local OutputMaskRecorder recorder;

}  // namespace

std::pair<Tensor, Tensor> call_with_output_mask(Model& model, const Tensor& x, bool training) {
  const OutputMaskRecorder saved = recorder;
  recorder = {.model = &model, .mask = Tensor()};
  Tensor y;
  try {
    y = model(x, training);
  } catch (...) {
    recorder = saved;
    throw;
  }
  Tensor mask = std::move(recorder.mask);
  recorder = saved;
  return {std::move(y), std::move(mask)};
}

namespace detail {

void report_output_mask(const Layer* model, const Tensor& mask) {
  if (recorder.model == model) recorder.mask = mask;
}

}  // namespace detail
}  // namespace dtrain::nn

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
