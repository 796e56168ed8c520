// Fashion-MNIST loading: four IDX reads and a uint8 -> float32 scaling loop the compiler
// vectorizes.
#include "dtrain/data/fashion_mnist.h"

#include <sys/stat.h>

#include "dtrain/core/error.h"
#include "dtrain/data/idx.h"

namespace dtrain::data::fashion_mnist {
namespace {

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The path of `name` in `dir`, preferring the .gz file Keras and Debian ship.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
  if (is_file(base + ".gz")) return base + ".gz";
  if (is_file(base)) return base;
  throw NotFoundError(str_cat("fashion_mnist::load_data: ", base,
                              ".gz not found; install the data set with "
                              "`apt-get install dataset-fashion-mnist`, or pass the directory "
                              "that holds the Fashion-MNIST IDX files"));
}

// uint8 [N, 28, 28] -> float32 [N, 28, 28] in [0, 1]. x / 255.0f equals NumPy's
// float32(x / 255.0) for every uint8 x (division is correctly rounded in both).
Tensor load_images(const std::string& path) {
  const Tensor raw = read_idx(path);
  if (raw.dtype() != DType::kUInt8 || raw.rank() != 3 || raw.dim(1) != 28 || raw.dim(2) != 28) {
    throw DataLossError(str_cat("fashion_mnist::load_data: ", path,
                                ": expected uint8 [N, 28, 28] images, got ",
                                dtype_name(raw.dtype()), " ", raw.shape().to_string()));
  }
  // 188 MB for the training images, read by every process forked from this one (a hot spare
  // from its fork server): huge pages (Tensor::with_huge_pages).
  Tensor x = Tensor::with_huge_pages(DType::kFloat32, raw.shape());
  const uint8_t* src = raw.data<uint8_t>();
  float* dst = x.data<float>();
  const int64_t count = x.num_elements();
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
  return x;
}

Tensor load_labels(const std::string& path, int64_t n) {
  Tensor y = read_idx(path);
  if (y.dtype() != DType::kUInt8 || y.shape() != Shape{n}) {
    throw DataLossError(str_cat("fashion_mnist::load_data: ", path, ": expected uint8 [", n,
                                "] labels (one per image), got ", dtype_name(y.dtype()), " ",
                                y.shape().to_string()));
  }
  return y;
}

}  // namespace

FashionMnist load_data(const std::string& dir) {
  // Resolve every path first, so a missing file is reported before any slow read.
  const std::string train_images = find_file(dir, "train-images-idx3-ubyte");
  const std::string train_labels = find_file(dir, "train-labels-idx1-ubyte");
  const std::string test_images = find_file(dir, "t10k-images-idx3-ubyte");
  const std::string test_labels = find_file(dir, "t10k-labels-idx1-ubyte");
  FashionMnist data;
  data.x_train = load_images(train_images);
  data.y_train = load_labels(train_labels, data.x_train.dim(0));
  data.x_test = load_images(test_images);
  data.y_test = load_labels(test_labels, data.x_test.dim(0));
  return data;
}

}  // namespace dtrain::data::fashion_mnist
