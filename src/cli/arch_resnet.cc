// The built-in residual CNN of `dtrain fit --arch resnet` (arch_resnet.h).
#include "arch_resnet.h"

#include "dtrain/distribute/parameter_server_strategy.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/nn/activations.h"
#include "dtrain/nn/convolutional.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/merging.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/pooling.h"

namespace dtrain::cli {

// --arch resnet: stem Conv2D(16, 3, same) -> BN -> ReLU, then two residual blocks
// [Conv2D(16, 3, same) -> BN -> ReLU -> Conv2D(16, 3, same) -> BN] + skip -> ReLU, then
// GlobalAveragePooling2D -> Dense(classes) (logits). The convolutions have no bias (BN's beta
// shifts). Under a strategy with several synchronous replicas (mirrored, multi-worker) the BN
// layers are synchronized (Keras's synchronized=True): their batch moments are those of the
// global batch, so that the model trains as one process with the global batch does; otherwise
// they are plain BatchNormalization (which fit refuses under parameter servers).
// docs/functional-api.md.
std::unique_ptr<nn::Model> make_resnet(const Shape& example, int64_t classes) {
  DTRAIN_CHECK(example.rank() == 2 || example.rank() == 3,
               "--arch resnet: needs image inputs [height, width] or [height, width, channels], "
               "got examples of shape ",
               example.to_string());
  const Shape image = example.rank() == 2 ? Shape{example[0], example[1], 1} : example;
  const distribute::Strategy* strategy = distribute::current_strategy();
  const bool sync = strategy != nullptr && strategy->num_replicas_in_sync() > 1 &&
                    dynamic_cast<const distribute::ParameterServerStrategy*>(strategy) == nullptr;
  auto conv_bn = [&](const nn::KerasTensor& x) {
    nn::KerasTensor h = nn::call(nn::Conv2D(16, {3}, {.padding = "same", .use_bias = false}), x);
    return nn::call(nn::BatchNormalization({.synchronized = sync}), h);
  };
  nn::KerasTensor x = nn::Input(image);
  nn::KerasTensor h = nn::call(nn::ReLU(), conv_bn(x));
  for (int block = 0; block < 2; ++block) {
    nn::KerasTensor r = conv_bn(nn::call(nn::ReLU(), conv_bn(h)));
    h = nn::call(nn::ReLU(), nn::call(nn::Add(), {h, r}));
  }
  nn::KerasTensor y = nn::call(nn::Dense(classes), nn::call(nn::GlobalAveragePooling2D(), h));
  return std::make_unique<nn::Functional>(std::vector<nn::KerasTensor>{x},
                                          std::vector<nn::KerasTensor>{y},
                                          nn::FunctionalOptions{.name = "resnet"});
}

}  // namespace dtrain::cli
