// Text input: whole files (tf.io.read_file), lines of text files (tf.data.TextLineDataset) and
// sliding windows over a token stream for next-token prediction. Tensors hold no strings, so a
// piece of text travels through a Dataset as a uint8 [n] tensor of its UTF-8 bytes
// (string_tensor / tensor_string convert). Token ids are int32, the dtype Keras's Embedding
// examples and tf.data pipelines use for ids. Thread-safe (Datasets are immutable values).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/data/dataset.h"

namespace dtrain::data {

// The bytes of the file at `path` (tf.io.read_file). Throws NotFoundError naming the path when it
// does not exist or is not a regular file, PermissionDeniedError when it cannot be read,
// DataLossError when a read fails part-way.
std::string read_file(const std::string& path);

// Throws DataLossError unless `text` is valid UTF-8 without NUL bytes (a binary file), naming
// `where` (a path, "the corpus"), the byte offset and its line and column (1-based).
void check_utf8_text(std::string_view text, std::string_view where);

// `s` as a uint8 [s.size()] tensor (a fresh buffer).
Tensor string_tensor(std::string_view s);
// The bytes of a uint8 rank-1 tensor as a string; throws InvalidArgumentError for any other
// dtype or rank.
std::string tensor_string(const Tensor& t);

// tf.data.TextLineDataset(paths): one element per line of the files, in file order, each a
// single uint8 [n] component holding the line without its "\n" (and without a "\r" before it,
// as TF's line reader). A last line without a newline is still a line; an empty file yields no
// elements. Cardinality is unknown. Resumable like every dataset: iterator_from(state) reopens
// the files and skips state.position lines without building their tensors. Throws
// InvalidArgumentError when `paths` is empty and NotFoundError naming a path that is missing
// (checked here and again when a pass opens the file).
Dataset text_line_dataset(std::vector<std::string> paths);

// Sliding windows for next-token prediction over `tokens` (int32 [N] ids, e.g. a tokenizer's
// encode_tensor): element i is (x, y) with x = tokens[s, s + T) and y = tokens[s + 1, s + T + 1),
// s = i * stride, both int32 [T] views of `tokens` (no copy until batch() stacks them into
// int32 [batch, T]). There are (N - T - 1) / stride + 1 windows; a tail shorter than a window
// is dropped. Shuffle, batch, shard, repeat and resuming work as on any dataset, and skipping
// is O(1). Throws InvalidArgumentError when tokens is not int32 rank 1, T < 1, stride < 1, or
// N < T + 1 (the stream is shorter than one window; the message gives both lengths).
struct TokenWindowsOptions {
  int64_t sequence_length = 128;  // T
  int64_t stride = 1;             // tokens between the starts of consecutive windows
};
Dataset token_windows(Tensor tokens, const TokenWindowsOptions& options);

}  // namespace dtrain::data
