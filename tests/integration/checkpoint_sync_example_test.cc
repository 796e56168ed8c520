// The first tutorial end to end: examples/checkpoint_sync trains under MirroredStrategy and
// saves a checkpoint after every step; a second process restores latest_checkpoint(dir) and
// must hold exactly the same variables (compared through their CRC-32C).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd << "\n" << out;
  return out;
}

// The lines after the first (the variable checksums and the optimizer's iteration count).
std::string variables_part(const std::string& out) { return out.substr(out.find('\n') + 1); }

TEST(CheckpointSyncExample, SecondProcessRestoresIdenticalVariables) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("dtrain_sync_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string exe = DTRAIN_CHECKPOINT_SYNC_EXAMPLE;
  const std::string trained = run(exe + " train " + dir + " 12");
  EXPECT_NE(trained.find("saved " + dir + "/model.ckpt-12"), std::string::npos) << trained;
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.ckpt-12.index"));
  const std::string restored = run(exe + " restore " + dir);
  EXPECT_NE(restored.find("restored " + dir + "/model.ckpt-12"), std::string::npos) << restored;
  EXPECT_NE(variables_part(trained).find("optimizer iterations 12"), std::string::npos);
  EXPECT_EQ(variables_part(trained), variables_part(restored));
  std::filesystem::remove_all(dir);
}

}  // namespace
