// The gradient all-reduce overlapped with the backward pass, for MultiWorkerMirroredStrategy
// (MultiWorkerOptions::overlap_gradients), like PyTorch DDP's Reducer: the gradients are grouped
// into buckets in reverse variable order (the order backward finishes them), each of up to
// bucket_bytes; the tape reports each gradient as soon as it is final (GradientTape::gradient's
// on_final), and when a bucket is complete a communication thread all-reduces it while the
// backward pass goes on. finish() waits for every bucket, then reduces the extra tensors (the
// step's preemption and non-finite flags, moving statistics) the same way.
//
// Every element is summed across workers in the order the one all-reduce after backward sums it
// in (Collectives::summation_order of the gradients followed by the extras), so the result is
// bitwise that of Strategy::reduce_gradients for any bucket size and any number of workers.
// Buckets are reduced in bucket order on every worker, whatever order the gradients arrive in.
// Over the shared-memory transport there is no communication thread and nothing to overlap (a
// reduction there is the CPU's own work, and both cores run workers): finish() reduces every
// bucket and the float32 extras in one collective (as the plain step's one all-reduce), on the
// thread that ran backward.
//
//   auto overlap = strategy.make_overlapped_reduction(out, extra);   // null: not enabled
//   tape.gradient(loss, vars, grads, &on_final);   // on_final(k): overlap->gradient_ready(k, g)
//   overlap->finish();                              // out holds the sums; throws a peer's loss
//
// gradient_ready() is called from the thread running backward, finish() and abandon() from the
// thread that owns the step; nothing else may use the strategy's collectives in between.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/collectives.h"

namespace dtrain::distribute {

class OverlappedGradientReduction {
 public:
  // `out` (the reduced gradients: defined float32 tensors of the variables' shapes) and `extra`
  // (summed in place after the gradients) are kept by reference and must outlive this object.
  // Starts the communication thread (with the flush-denormals setting, core/float_env.h).
  // Throws InvalidArgumentError for a bucket_bytes of 0 or a non-float tensor, and what
  // Collectives::summation_order throws.
  OverlappedGradientReduction(Collectives& collectives, std::span<Tensor> out,
                              std::span<Tensor> extra, size_t bucket_bytes);
  // Waits for the bucket under way (bounded by the collective timeout) and stops the thread.
  ~OverlappedGradientReduction();
  OverlappedGradientReduction(const OverlappedGradientReduction&) = delete;
  OverlappedGradientReduction& operator=(const OverlappedGradientReduction&) = delete;

  // Gradient v of this step is final: `g` (undefined: no gradient, summed as zeros) is read by
  // the communication thread until finish() returns and must not change.
  void gradient_ready(size_t v, const Tensor& g);
  // Reduces the buckets whose gradients never came (a worker without rows this step: zeros),
  // then the extras; waits for all of them. Rethrows the communication thread's error
  // (UnavailableError for a lost peer, DeadlineExceededError after the timeout).
  void finish();
  // After a failed backward pass: waits for the bucket under way and drops the others.
  void abandon() noexcept;

  // The variables of each bucket, in bucket (reduction) order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  // Buckets reduced so far (all steps): shows a bucket finishing while backward still runs.
  size_t buckets_reduced() const { return reduced_.load(std::memory_order_acquire); }

 private:
  void loop();
  void reduce_bucket(size_t b);
  void add_bucket_pieces(size_t b);  // bucket b's pieces, appended to pieces_
  void add_extra_pieces(DType d);    // the extras of dtype d, appended to pieces_
  void reduce_extras();
  // Bucket `item` (counted as reduced), or the extras when item == the number of buckets.
  void reduce_item(size_t item);
  void reset_step();  // the next step's counts; drops this step's gradients

  Collectives& collectives_;
  std::span<Tensor> out_;
  std::span<Tensor> extra_;
  std::vector<std::vector<SumRange>> order_;  // out_ then extra_
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<Tensor> src_;  // this step's gradients as they arrive
  std::vector<OrderedPiece> pieces_;

  std::mutex mu_;
  std::condition_variable cv_;       // work for the thread
  std::condition_variable done_cv_;  // the thread moved on
  std::vector<size_t> remaining_;    // per bucket: gradients not arrived yet
  size_t next_ = 0;                  // the next bucket to reduce; buckets_.size(): the extras
  bool finishing_ = false;           // finish(): every bucket counts as complete
  bool busy_ = false;                // the thread is reducing
  bool dropping_ = false;            // abandon(): no more reductions this step
  bool stop_ = false;
  bool inline_ = false;  // over shared memory: no thread (every bucket reduced in finish)
  std::exception_ptr error_;
  std::atomic<size_t> reduced_{0};
  std::thread thread_;
};

}  // namespace dtrain::distribute
