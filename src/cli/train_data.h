// The data flags of fit / evaluate / predict and the data they name: Fashion-MNIST (the
// default), IDX files or CSV files, with the labels checked (private to src/cli; docs/cli.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtrain/core/tensor.h"

namespace CLI {
class App;
}

namespace dtrain::cli {

struct DataFlags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string train_images, train_labels, test_images, test_labels;
  std::string train_csv, test_csv;
  std::optional<int> label_column;  // unset: the last column
};

struct Split {
  Tensor x, y;
};
struct Data {
  Split train, test;
  int64_t classes = 0;  // implied by the labels: the largest + 1 (checked: data::kMaxClasses)
};

// Registers --data-dir, the IDX pairs and the CSV flags on `cmd` (the three sources exclude
// each other).
void add_data_flags(CLI::App* cmd, DataFlags& f);
// Reads the data the flags name. Throws InvalidArgumentError naming the file for bad labels, a
// CSV without a label column, or inputs and labels of different lengths; "no training data
// given" when need_train and there is none.
Data load_data(const DataFlags& f, bool need_train);
// The classes the default model's output layer needs (at least 2).
int64_t num_classes(const Data& d);

}  // namespace dtrain::cli
