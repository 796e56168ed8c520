// evaluate() and predict(): inference over batched datasets.
#include "evaluation.h"

#include <cstring>

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/distribute/input.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/train/training.h"
#include "progress_bar.h"
#include "training_state.h"

namespace dtrain::train {
namespace {

void test_step(nn::Model& model, TrainingState& s, const Tensor& x, const Tensor& y) {
  const auto [y_pred, mask] = nn::call_with_output_mask(model, x, /*training=*/false);
  const Tensor loss = (*s.loss)(y, y_pred, mask);
  s.loss_tracker.update_state(loss.item(), x.rank() > 0 ? static_cast<double>(x.dim(0)) : 1.0);
  for (const auto& m : s.metrics) m->update_state(y, y_pred, mask);
}

}  // namespace

nn::Logs run_evaluation(nn::Model& model, const data::Dataset& dataset,
                        std::optional<int64_t> steps, int verbose,
                        const std::vector<std::shared_ptr<Callback>>& callbacks,
                        const std::string& prefix) {
  TrainingState& s = state_of(model, "evaluate");
  NoGradGuard no_grad;
  s.reset_metrics();
  nn::Logs logs;
  for (const auto& cb : callbacks) cb->on_test_begin(logs);
  distribute::Strategy* st = s.strategy;
  const bool split = st != nullptr && st->num_workers() > 1;
  const int64_t card = dataset.cardinality();
  detail::ProgressBar bar(verbose, steps ? *steps : (card >= 0 ? card : -1));
  data::Iterator it = dataset.iterator();
  data::Element e;
  int64_t step = 0;
  while ((!steps || step < *steps) && it.next(e)) {
    DTRAIN_CHECK(e.size() >= 2, "evaluate: dataset elements must be (x, y) pairs, got ", e.size(),
                 " component(s)");
    if (split) {
      // Each worker evaluates its part of every batch; the totals are summed below.
      const auto [b, end] = distribute::worker_rows(e[0].dim(0), *st);
      if (end > b) test_step(model, s, e[0].slice(b, end), e[1].slice(b, end));
    } else {
      test_step(model, s, e[0], e[1]);
    }
    ++step;
    s.fill_logs(logs);
    for (const auto& cb : callbacks) cb->on_test_batch_end(step - 1, logs);
    bar.update(step, logs);
  }
  DTRAIN_CHECK(step > 0, "evaluate: the dataset is empty");
  s.all_reduce_metrics();
  s.fill_logs(logs);
  bar.update(step, logs, true);
  for (const auto& cb : callbacks) cb->on_test_end(logs);
  if (prefix.empty()) return logs;
  nn::Logs prefixed;
  for (const auto& [k, v] : logs) prefixed[prefix + k] = v;
  return prefixed;
}

}  // namespace dtrain::train

namespace dtrain::nn {

Logs Model::evaluate(const data::Dataset& dataset, const train::EvaluateOptions& options) {
  return train::run_evaluation(*this, dataset, options.steps, options.verbose, options.callbacks,
                               "");
}

Logs Model::evaluate(const Tensor& x, const Tensor& y, const train::EvaluateOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "evaluate: batch_size must be positive");
  return evaluate(data::Dataset::from_tensor_slices({x, y}).batch(options.batch_size), options);
}

Tensor Model::predict(const data::Dataset& dataset, const train::PredictOptions&) {
  NoGradGuard no_grad;
  std::vector<Tensor> outputs;
  data::Iterator it = dataset.iterator();
  data::Element e;
  int64_t rows = 0;
  while (it.next(e)) {
    DTRAIN_CHECK(!e.empty(), "predict: empty dataset element");
    outputs.push_back((*this)(e[0], false));
    rows += outputs.back().dim(0);
  }
  DTRAIN_CHECK(!outputs.empty(), "predict: the dataset is empty");
  Tensor out(outputs[0].dtype(), outputs[0].shape().without_first().with_first(rows));
  char* dst = static_cast<char*>(out.raw_data());
  for (const Tensor& o : outputs) {
    std::memcpy(dst, o.raw_data(), o.nbytes());
    dst += o.nbytes();
  }
  return out;
}

Tensor Model::predict(const Tensor& x, const train::PredictOptions& options) {
  DTRAIN_CHECK(options.batch_size > 0, "predict: batch_size must be positive");
  return predict(data::Dataset::from_tensor_slices({x}).batch(options.batch_size), options);
}

}  // namespace dtrain::nn
