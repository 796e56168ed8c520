// dtrain fit --arch gpt, run as a user would: a tiny GPT trains on a text corpus with a
// validation split, under one device and under mirrored replicas with checkpoints, and saves a
// .keras that carries its tokenizer, also with SentencePiece tokenizers (in this gRPC binary, and
// under dtrain launch); bad corpora and tokenizer flags are refused with clear messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "testutil/run_dtrain.h"
#include "testutil/temp_dir.h"

namespace {

using dtrain::testutil::contains;
using dtrain::testutil::run_dtrain;

std::string write_corpus(const std::string& dir) {
  const std::string path = dir + "/corpus.txt";
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog " << i << "\n";
  return path;
}

const std::string kTiny =
    " --context 16 --layers 1 --d-model 16 --heads 2 --batch-size 8 --epochs 1 "
    "--steps-per-epoch 3 --seed 1 --verbose 2";

TEST(ArchGpt, FitsWithValidationAndSavesTheTokenizer) {
  dtrain::testutil::TempDir dir("arch_gpt");
  const std::string corpus = write_corpus(dir.path());
  const std::string keras = dir.path() + "/lm.keras";
  const auto fit = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny + " --dropout 0.1 " +
                              "--optimizer adamw --save " + keras);
  ASSERT_EQ(fit.code, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "vocabulary 38")) << fit.output;
  EXPECT_TRUE(contains(fit.output, "val_loss")) << fit.output;
  EXPECT_TRUE(contains(fit.output, "block_0 (TransformerBlock)")) << fit.output;
  ASSERT_TRUE(std::filesystem::exists(keras));
  // The archive holds the tokenizer under assets/ (unzip -l lists members).
  const auto list = dtrain::testutil::run_shell("unzip -l " + keras);
  EXPECT_TRUE(contains(list.output, "assets/tokenizer/tokenizer.json")) << list.output;
}

// --global-clipnorm is Keras's global_clipnorm: saved in the optimizer's config; bad values are
// usage errors.
TEST(ArchGpt, GlobalClipnormIsTheOptimizers) {
  dtrain::testutil::TempDir dir("arch_gpt_clip");
  const std::string corpus = write_corpus(dir.path());
  const std::string keras = dir.path() + "/lm.keras";
  auto r = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny +
                      " --optimizer adamw --global-clipnorm 0.5 --save " + keras);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto config = dtrain::testutil::run_shell("unzip -p " + keras + " config.json");
  EXPECT_TRUE(contains(config.output, "\"global_clipnorm\":0.5")) << config.output;
  for (const char* bad : {"0", "-1", "nan"}) {
    r = run_dtrain("fit --arch gpt --corpus " + corpus + " --global-clipnorm " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "--global-clipnorm")) << r.output;
  }
}

TEST(ArchGpt, MirroredReplicasWithCheckpoints) {
  dtrain::testutil::TempDir dir("arch_gpt_mirrored");
  const std::string corpus = write_corpus(dir.path());
  const auto fit = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny +
                              " --strategy mirrored --replicas 2 " + "--checkpoint-dir " +
                              dir.path() + "/ckpt --checkpoint-every 2");
  ASSERT_EQ(fit.code, 0) << fit.output;
  EXPECT_TRUE(contains(fit.output, "2 replicas in sync")) << fit.output;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/ckpt/checkpoint")) << fit.output;
}

// Under dtrain launch: two MultiWorkerMirrored workers (Gloo on 127.0.0.1) with dropout and
// backups, and a parameter-server job (one server, two workers, the chief).
TEST(ArchGpt, MultiWorkerAndParameterServerJobs) {
  dtrain::testutil::TempDir dir("arch_gpt_launch");
  const std::string corpus = write_corpus(dir.path());
  const std::string dtrain = std::string(DTRAIN_BINARY_DIR) + "/dtrain";
  auto r = run_dtrain("launch --nproc-per-node 2 -- " + dtrain + " fit --strategy multi-worker " +
                      "--arch gpt --corpus " + corpus + kTiny + " --dropout 0.1 --checkpoint-dir " +
                      dir.path() + "/mw --checkpoint-every 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2 replicas in sync (2 workers x 1 local)")) << r.output;
  EXPECT_TRUE(contains(r.output, "val_loss")) << r.output;
  r = run_dtrain("launch --ps 1 --workers 2 -- " + dtrain + " fit --strategy parameter-server " +
                 "--arch gpt --corpus " + corpus + kTiny + " --checkpoint-dir " + dir.path() +
                 "/ps");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "closures on 2 workers")) << r.output;
  EXPECT_TRUE(contains(r.output, "test_loss")) << r.output;
}

// SentencePiece in the dtrain binary, which links gRPC (its shim runs in a link-map namespace of
// its own): a BPE model trained on the corpus, saved in the .keras and used by dtrain generate;
// a unigram model under two MultiWorkerMirrored workers; a .model file given by path.
TEST(ArchGpt, SentencePieceTokenizers) {
  dtrain::testutil::TempDir dir("arch_gpt_spm");
  const std::string corpus = write_corpus(dir.path());
  const std::string keras = dir.path() + "/lm.keras";
  auto r = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny +
                      " --tokenizer bpe --vocab-size 60 --save " + keras);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 60")) << r.output;
  const auto tok =
      dtrain::testutil::run_shell("unzip -p " + keras + " assets/tokenizer/tokenizer.json");
  EXPECT_TRUE(contains(tok.output, "\"SentencePieceTokenizer\"")) << tok.output;
  r = run_dtrain("generate --model " + keras + " --prompt 'the quick' --tokens 5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "the quick")) << r.output;

  const std::string dtrain = std::string(DTRAIN_BINARY_DIR) + "/dtrain";
  r = run_dtrain("launch --nproc-per-node 2 -- " + dtrain + " fit --strategy multi-worker " +
                 "--arch gpt --corpus " + corpus + kTiny + " --tokenizer unigram --vocab-size 50");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2 replicas in sync (2 workers x 1 local)")) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 50")) << r.output;

  // --tokenizer-out writes the trained model, the one the .keras holds; --tokenizer FILE.model
  // loads it.
  const std::string model = dir.path() + "/tok.model";
  r = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny +
                 " --tokenizer bpe --vocab-size 60 --tokenizer-out " + model);
  ASSERT_EQ(r.code, 0) << r.output;
  r = dtrain::testutil::run_shell(
      "unzip -p " + keras +
      " assets/tokenizer/tokenizer.json | python3 -c 'import json, sys, base64; "
      "sys.stdout.buffer.write(base64.b64decode(json.load(sys.stdin)[\"config\"][\"model_proto\"]))"
      "' | cmp - " +
      model);
  EXPECT_EQ(r.code, 0) << "the .model differs from the saved tokenizer's: " << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny + " --tokenizer " + model);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "vocabulary 60")) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + kTiny + " --tokenizer-out " + model);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--tokenizer-out")) << r.output;
}

TEST(ArchGpt, BadCorporaAndTokenizersAreRefused) {
  dtrain::testutil::TempDir dir("arch_gpt_bad");
  const std::string corpus = write_corpus(dir.path());
  auto r = run_dtrain("fit --arch gpt --corpus " + corpus + " --tokenizer sentencepiece");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "char, bpe, unigram")) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + " --tokenizer " + dir.path() +
                 "/missing.model");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "missing.model")) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + " --tokenizer bpe --vocab-size 100000");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "Vocabulary size too high")) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + " --tokenizer bpe --vocab-size 0");
  EXPECT_EQ(r.code, 2) << r.output;
  const std::string empty = dir.path() + "/empty.txt";
  std::ofstream(empty).close();
  r = run_dtrain("fit --arch gpt --corpus " + empty);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "empty")) << r.output;
  const std::string binary = dir.path() + "/binary.bin";
  {
    std::ofstream out(binary, std::ios::binary);
    out << std::string("ab\0\xff\xfe", 5);
  }
  r = run_dtrain("fit --arch gpt --corpus " + binary);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, binary)) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + dir.path() + "/missing.txt");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "missing.txt")) << r.output;
  r = run_dtrain("fit --arch gpt --corpus " + corpus + " --context 100000");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--context")) << r.output;
}

}  // namespace
