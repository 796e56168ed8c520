#include "train_data.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "dtrain/core/error.h"
#include "dtrain/data/csv.h"
#include "dtrain/data/fashion_mnist.h"
#include "dtrain/data/idx.h"
#include "dtrain/data/labels.h"
#include "dtrain/ops/tensor_ops.h"
#include "flag_checks.h"

namespace dtrain::cli {
namespace {

// IDX inputs of uint8 are scaled to [0, 1] as the Keras tutorial does; others are cast.
Tensor idx_inputs(const std::string& path) {
  Tensor t = data::read_idx(path);
  if (t.dtype() == DType::kUInt8)
    return ops::affine(ops::cast(t, DType::kFloat32), 1.0f / 255.0f, 0.0f);
  return ops::cast(t, DType::kFloat32);
}

Split csv_split(const std::string& path, std::optional<int> label_column) {
  const Tensor table = data::read_csv(path);
  DTRAIN_CHECK(table.rank() == 2 && table.dim(1) >= 2, path,
               ": need at least two columns (features and a label)");
  const int64_t cols = table.dim(1);
  const int64_t lc = label_column.value_or(cols - 1);
  DTRAIN_CHECK(lc < cols, path, ": --label-column ", lc, " but the file has ", cols, " columns");
  data::LabeledTable t = data::split_label_column(table, lc, DType::kFloat32);
  // Labels are class indices: 2.5, nan or -1 in the label column is an error naming the row.
  data::check_class_labels(t.y, str_cat(path, " (label column ", lc, ")"));
  return {t.x, ops::cast(t.y, DType::kInt64)};
}

}  // namespace

Data load_data(const DataFlags& f, bool need_train) {
  Data d;
  if (!f.train_csv.empty() || !f.test_csv.empty()) {
    if (!f.train_csv.empty()) d.train = csv_split(f.train_csv, f.label_column);
    if (!f.test_csv.empty()) d.test = csv_split(f.test_csv, f.label_column);
  } else if (!f.train_images.empty() || !f.test_images.empty()) {
    if (!f.train_images.empty()) {
      DTRAIN_CHECK(!f.train_labels.empty(), "--train-images needs --train-labels");
      d.train = {idx_inputs(f.train_images), data::read_idx(f.train_labels)};
      data::check_class_labels(d.train.y, f.train_labels);
    }
    if (!f.test_images.empty()) {
      DTRAIN_CHECK(!f.test_labels.empty(), "--test-images needs --test-labels");
      d.test = {idx_inputs(f.test_images), data::read_idx(f.test_labels)};
      data::check_class_labels(d.test.y, f.test_labels);
    }
  } else {
    data::FashionMnist fm = data::fashion_mnist::load_data(f.data_dir);
    d.train = {fm.x_train, fm.y_train};
    d.test = {fm.x_test, fm.y_test};
  }
  DTRAIN_CHECK(!need_train || d.train.x.defined(), "no training data given");
  for (const Split* s : {&d.train, &d.test}) {
    if (!s->x.defined()) continue;
    DTRAIN_CHECK(s->x.dim(0) == s->y.dim(0), "inputs have ", s->x.dim(0), " examples but labels ",
                 s->y.dim(0));
    // Every source's labels were checked above (the Fashion-MNIST files are uint8); the largest
    // sizes the default model's output layer.
    d.classes = std::max(d.classes, data::check_class_labels(s->y, "labels"));
  }
  return d;
}

int64_t num_classes(const Data& d) { return std::max<int64_t>(d.classes, 2); }

void add_data_flags(CLI::App* cmd, DataFlags& f) {
  CLI::Option* dir =
      cmd->add_option("--data-dir", f.data_dir,
                      "Fashion-MNIST directory with the four IDX .gz files (the default data set)")
          ->capture_default_str();
  CLI::Option* idx[] = {
      cmd->add_option("--train-images", f.train_images,
                      "IDX file of training inputs (.gz or plain)"),
      cmd->add_option("--train-labels", f.train_labels, "IDX file of training labels"),
      cmd->add_option("--test-images", f.test_images, "IDX file of test inputs"),
      cmd->add_option("--test-labels", f.test_labels, "IDX file of test labels"),
  };
  CLI::Option* csv[] = {
      cmd->add_option("--train-csv", f.train_csv, "CSV file of training rows (numeric)"),
      cmd->add_option("--test-csv", f.test_csv, "CSV file of test rows (numeric)"),
      cmd->add_option("--label-column", f.label_column,
                      "CSV column holding the label, counted from 0 (default: the last)")
          ->check(int_at_least(0)),
  };
  // Images and their labels come in pairs; the three sources of data exclude each other (a
  // usage error names the two flags), rather than one silently winning.
  idx[0]->needs(idx[1]);
  idx[1]->needs(idx[0]);
  idx[2]->needs(idx[3]);
  idx[3]->needs(idx[2]);
  for (CLI::Option* i : idx) {
    dir->excludes(i);
    for (CLI::Option* c : csv) i->excludes(c);
  }
  for (CLI::Option* c : csv) dir->excludes(c);
}

}  // namespace dtrain::cli
