// Fashion-MNIST (Xiao et al. 2017) as keras.datasets.fashion_mnist returns it, read from the IDX
// files Debian's dataset-fashion-mnist package installs. Thread-safe.
#pragma once

#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::data {

struct FashionMnist {
  Tensor x_train;  // float32 [60000, 28, 28], pixel / 255 in [0, 1]
  Tensor y_train;  // uint8 [60000], class ids 0..9
  Tensor x_test;   // float32 [10000, 28, 28]
  Tensor y_test;   // uint8 [10000]
};

namespace fashion_mnist {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`. Images are scaled to
// [0, 1] exactly as the Keras tutorial's `x / 255.0` does (then float32); labels stay uint8,
// as Keras returns them. Takes a fraction of a second (mostly gunzip). Throws NotFoundError
// telling the user to `apt-get install dataset-fashion-mnist` when a file is missing,
// DataLossError (see read_idx) for a corrupt file, images that are not uint8 [N, 28, 28], or
// labels that are not uint8 [N].
FashionMnist load_data(const std::string& dir = kDefaultDir);

}  // namespace fashion_mnist
}  // namespace dtrain::data
