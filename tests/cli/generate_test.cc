// dtrain generate, run as a user would: a tiny GPT trained by `dtrain fit --arch gpt` continues a
// prompt from its .keras and its .h5; greedy output is the same with and without the key/value
// cache and the same seed samples the same text; a prompt outside the vocabulary, one longer
// than the context, a model without a tokenizer and bad flag values are clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

using dtrain::testutil::contains;
using dtrain::testutil::run_dtrain;

// One tiny language model for every test (trained once per process).
class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new dtrain::testutil::TempDir("generate");
    const std::string corpus = dir_->path() + "/corpus.txt";
    {
      std::ofstream out(corpus);
      for (int i = 0; i < 100; ++i) out << "the quick brown fox jumps over the lazy dog\n";
    }
    for (const char* ext : {".keras", ".h5"}) {
      const auto fit = run_dtrain("fit --arch gpt --corpus " + corpus +
                                  " --context 16 --layers 1 --d-model 16 --heads 2 --batch-size 8"
                                  " --epochs 1 --steps-per-epoch 20 --seed 1 --verbose 0"
                                  " --save " +
                                  dir_->path() + "/lm" + ext);
      ASSERT_EQ(fit.code, 0) << fit.output;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string lm(const char* ext = ".keras") { return dir_->path() + "/lm" + ext; }
  static dtrain::testutil::TempDir* dir_;
};
dtrain::testutil::TempDir* Generate::dir_ = nullptr;

// The text a run printed: its stdout (errors go to stderr).
std::string stdout_of(const std::string& args) {
  const auto r = run_dtrain(args, /*with_stderr=*/false);
  EXPECT_EQ(r.code, 0) << args;
  return r.output;
}

TEST_F(Generate, ContinuesThePromptByTheRequestedTokens) {
  const std::string out =
      stdout_of("generate --model " + lm() + " --prompt 'the qu' --tokens 30 --temperature 0");
  ASSERT_EQ(out.size(), 6u + 30u + 1u) << out;  // prompt, 30 characters, newline
  EXPECT_EQ(out.substr(0, 6), "the qu");
  for (char c : out.substr(6, 30)) {
    EXPECT_TRUE(contains("thequickbrownfxjmpsvlazydg \n", std::string(1, c))) << out;
  }
}

TEST_F(Generate, CacheAndSeedsAreExact) {
  const std::string base = "generate --model " + lm() + " --prompt 'the lazy' --tokens 40";
  // Greedy: the cache changes nothing (40 tokens pass the 16-token context: the window slides).
  EXPECT_EQ(stdout_of(base + " --temperature 0"), stdout_of(base + " --temperature 0 --no-cache"));
  // Sampling: the same seed gives the same text.
  EXPECT_EQ(stdout_of(base + " --temperature 1 --top-k 5 --seed 3"),
            stdout_of(base + " --temperature 1 --top-k 5 --seed 3"));
  // The .h5 holds the same model and tokenizer.
  EXPECT_EQ(stdout_of(base + " --temperature 0"),
            stdout_of("generate --model " + lm(".h5") +
                      " --prompt 'the lazy' --tokens 40 --temperature 0"));
}

TEST_F(Generate, BadPromptsModelsAndFlagsAreClearErrors) {
  // 'Z' never occurs in the corpus.
  auto r = run_dtrain("generate --model " + lm() + " --prompt 'the Zebra'");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(contains(r.output, "--prompt")) << r.output;
  // 20 tokens do not fit a 16-token context.
  r = run_dtrain("generate --model " + lm() + " --prompt 'the quick brown fox '");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(contains(r.output, "--prompt has 20 tokens, more than the model's context of 16"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "the quick brown fox dtrain")) << "printed before refusing";
  // A classifier saved without a tokenizer.
  const std::string mlp = dir_->path() + "/mlp.keras";
  r = run_dtrain("fit --epochs 1 --steps-per-epoch 2 --verbose 0 --save " + mlp);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_dtrain("generate --model " + mlp + " --prompt 'the'");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(contains(r.output, "GPT")) << r.output;
  // Flag values are usage errors before anything loads.
  for (const char* bad : {"--temperature -1", "--tokens 0", "--top-k -2"}) {
    r = run_dtrain("generate --model " + lm() + " --prompt 'the' " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "INVALID_ARGUMENT")) << bad << ": not refused while parsing";
  }
  r = run_dtrain("generate --model " + dir_->path() + "/missing.keras --prompt 'the'");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "missing.keras")) << r.output;
}

}  // namespace
