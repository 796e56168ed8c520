#include "dtrain/data/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/data/tokenizer.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::data {
namespace {

using testutil::expect_throws;

// Every line of one pass, as strings.
std::vector<std::string> lines(const Dataset& ds, const IteratorState& from = {}) {
  std::vector<std::string> out;
  Iterator it = ds.iterator_from(from);
  Element e;
  while (it.next(e)) {
    EXPECT_EQ(e.size(), 1u);
    out.push_back(tensor_string(e[0]));
  }
  return out;
}

TEST(ReadFile, ReturnsTheBytesAndNamesAMissingPath) {
  testutil::TempDir dir("dtrain_text_test");
  const std::string bytes = std::string("a\0b\nc", 5);
  testutil::write_bytes(dir.file("f"), bytes);
  EXPECT_EQ(read_file(dir.file("f")), bytes);
  testutil::write_bytes(dir.file("empty"), "");
  EXPECT_EQ(read_file(dir.file("empty")), "");
  const std::string msg = expect_throws<NotFoundError>([&] { read_file(dir.file("nope")); });
  EXPECT_NE(msg.find(dir.file("nope")), std::string::npos) << msg;
  EXPECT_THROW(read_file(dir.path()), NotFoundError);  // a directory is not a file
}

TEST(CheckUtf8Text, AcceptsTextAndLocatesNulAndInvalidBytes) {
  check_utf8_text("plain\nt\xc3\xa9xt \xe2\x82\xac \xf0\x9f\x98\x80\n", "ok");
  std::string msg = expect_throws<DataLossError>(
      [] { check_utf8_text(std::string("ab\ncd\0e", 7), "corpus.txt"); });
  EXPECT_NE(msg.find("corpus.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NUL"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset 5 (line 2, column 3)"), std::string::npos) << msg;
  msg = expect_throws<DataLossError>([] { check_utf8_text("ok\xff", "f"); });
  EXPECT_NE(msg.find("offset 2"), std::string::npos) << msg;
  EXPECT_THROW(check_utf8_text("\xc3", "f"), DataLossError);          // truncated
  EXPECT_THROW(check_utf8_text("\xc0\xaf", "f"), DataLossError);      // overlong '/'
  EXPECT_THROW(check_utf8_text("\xed\xa0\x80", "f"), DataLossError);  // a surrogate
}

TEST(StringTensor, RoundTripsBytes) {
  const Tensor t = string_tensor("h\xc3\xa9");
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  EXPECT_EQ(t.shape(), Shape{3});
  EXPECT_EQ(tensor_string(t), "h\xc3\xa9");
  EXPECT_EQ(tensor_string(string_tensor("")), "");
  EXPECT_THROW(tensor_string(Tensor::zeros(Shape{2})), InvalidArgumentError);
}

TEST(TextLineDataset, YieldsLinesOfEveryFileInOrder) {
  testutil::TempDir dir("dtrain_text_test");
  testutil::write_bytes(dir.file("a"), "one\ntwo\r\n\nthree");  // no final newline
  testutil::write_bytes(dir.file("empty"), "");
  testutil::write_bytes(dir.file("b"), "four\n");
  const Dataset ds = text_line_dataset({dir.file("a"), dir.file("empty"), dir.file("b")});
  EXPECT_EQ(ds.cardinality(), kUnknownCardinality);
  const std::vector<std::string> want = {"one", "two", "", "three", "four"};
  EXPECT_EQ(lines(ds), want);
  EXPECT_EQ(lines(ds), want);  // every pass reads the files again
}

TEST(TextLineDataset, ResumesFromAnIteratorState) {
  testutil::TempDir dir("dtrain_text_test");
  testutil::write_bytes(dir.file("a"), "l0\nl1\nl2\n");
  testutil::write_bytes(dir.file("b"), "l3\nl4\n");
  const Dataset ds = text_line_dataset({dir.file("a"), dir.file("b")}).repeat(2);
  Iterator it = ds.iterator();
  Element e;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(it.next(e));
  EXPECT_EQ(it.state(), (IteratorState{0, 4}));
  std::vector<std::string> rest;
  while (it.next(e)) rest.push_back(tensor_string(e[0]));
  EXPECT_EQ(lines(ds, IteratorState{0, 4}), rest);
  EXPECT_EQ(rest.front(), "l4");
  EXPECT_EQ(rest.size(), 6u);
  EXPECT_THROW(ds.iterator_from(IteratorState{0, 11}), InvalidArgumentError);
}

TEST(TextLineDataset, RejectsMissingFilesAndNoPaths) {
  testutil::TempDir dir("dtrain_text_test");
  EXPECT_THROW(text_line_dataset({}), InvalidArgumentError);
  const std::string msg =
      expect_throws<NotFoundError>([&] { text_line_dataset({dir.file("missing.txt")}); });
  EXPECT_NE(msg.find("missing.txt"), std::string::npos) << msg;
  // A file removed after the dataset was made is reported when a pass reaches it.
  testutil::write_bytes(dir.file("a"), "x\n");
  testutil::write_bytes(dir.file("b"), "y\n");
  const Dataset ds = text_line_dataset({dir.file("a"), dir.file("b")});
  std::filesystem::remove(dir.file("b"));
  Iterator it = ds.iterator();
  Element e;
  ASSERT_TRUE(it.next(e));
  EXPECT_THROW(it.next(e), NotFoundError);
}

Tensor iota_tokens(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return Tensor::from_vector<int32_t>(v, Shape{n});
}

TEST(TokenWindows, XIsTheWindowAndYIsItShiftedByOne) {
  const Dataset ds = token_windows(iota_tokens(10), {.sequence_length = 3, .stride = 2});
  // Starts 0, 2, 4, 6 (6 + 3 + 1 = 10 tokens); start 8 would need token 11.
  EXPECT_EQ(ds.cardinality(), 4);
  Iterator it = ds.iterator();
  Element e;
  for (int32_t w = 0; w < 4; ++w) {
    ASSERT_TRUE(it.next(e));
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].dtype(), DType::kInt32);
    EXPECT_EQ(e[0].to_vector<int32_t>(), (std::vector<int32_t>{2 * w, 2 * w + 1, 2 * w + 2}));
    EXPECT_EQ(e[1].to_vector<int32_t>(), (std::vector<int32_t>{2 * w + 1, 2 * w + 2, 2 * w + 3}));
  }
  EXPECT_FALSE(it.next(e));
  EXPECT_EQ(token_windows(iota_tokens(4), {.sequence_length = 3}).cardinality(), 1);
}

TEST(TokenWindows, ShufflesBatchesAndResumes) {
  const Dataset ds = token_windows(iota_tokens(100), {.sequence_length = 8, .stride = 1})
                         .shuffle(50, 7)
                         .batch(4, /*drop_remainder=*/true);
  EXPECT_EQ(ds.cardinality(), 92 / 4);
  Iterator it = ds.iterator();
  Element e;
  std::vector<std::vector<int32_t>> xs;
  while (it.next(e)) {
    ASSERT_EQ(e[0].shape(), (Shape{4, 8}));
    ASSERT_EQ(e[1].shape(), (Shape{4, 8}));
    const int32_t* x = e[0].data<int32_t>();
    const int32_t* y = e[1].data<int32_t>();
    for (int r = 0; r < 4; ++r) {
      for (int t = 0; t < 8; ++t) {
        EXPECT_EQ(x[r * 8 + t], x[r * 8] + t);
        EXPECT_EQ(y[r * 8 + t], x[r * 8 + t] + 1);
      }
    }
    xs.push_back(e[0].to_vector<int32_t>());
  }
  ASSERT_EQ(xs.size(), 23u);
  EXPECT_NE(xs[0][0], 0);  // shuffled (seed 7 does not start with window 0)
  Iterator resumed = ds.iterator_from(IteratorState{0, 20});
  for (size_t i = 20; i < xs.size(); ++i) {
    ASSERT_TRUE(resumed.next(e));
    EXPECT_EQ(e[0].to_vector<int32_t>(), xs[i]);
  }
  EXPECT_FALSE(resumed.next(e));
}

TEST(TokenWindows, RejectsBadArguments) {
  std::string msg = expect_throws<InvalidArgumentError>(
      [] { token_windows(iota_tokens(5), {.sequence_length = 5}); });
  EXPECT_NE(msg.find("5 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("6"), std::string::npos) << msg;
  EXPECT_THROW(token_windows(iota_tokens(5), {.sequence_length = 0}), InvalidArgumentError);
  EXPECT_THROW(token_windows(iota_tokens(5), {.sequence_length = 2, .stride = 0}),
               InvalidArgumentError);
  msg = expect_throws<InvalidArgumentError>(
      [] { token_windows(Tensor::zeros(Shape{10}), {.sequence_length = 2}); });
  EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
  EXPECT_THROW(token_windows(Tensor::zeros(Shape{2, 5}, DType::kInt32), {.sequence_length = 2}),
               InvalidArgumentError);
}

// A SentencePiece tokenizer's bytes that are no model are DataLoss (SentencePiece is reached
// through its shim in every program).
TEST(TokenizerFromBytes, ASentencePieceConfigThatIsNoModelIsDataLoss) {
  const std::string msg = expect_throws<DataLossError>([] {
    tokenizer_from_bytes(R"({"format": "dtrain.tokenizer", "version": 1,
        "class_name": "SentencePieceTokenizer", "config": {"model_proto": "AAAA"}})");
  });
  EXPECT_NE(msg.find("not a SentencePiece model"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dtrain::data
