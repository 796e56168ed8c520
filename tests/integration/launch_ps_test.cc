// dtrain launch --ps N --workers M starts a whole ParameterServerStrategy job on this machine:
// servers, workers and the chief running `dtrain fit --strategy parameter-server`, and restarts
// a worker that is killed.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDtrain = DTRAIN_BINARY;

// n rows of 8 features and a label in the last column, two separable classes.
void write_csv(const fs::path& path, int n) {
  std::ofstream f(path);
  for (int i = 0; i < n; ++i) {
    const int label = i % 2;
    for (int d = 0; d < 8; ++d)
      f << ((d % 2 == label) ? 1.0 : 0.0) + 0.1 * ((i * 7 + d) % 5) << ",";
    f << label << "\n";
  }
}

// Pids of the direct children of `parent` whose command line contains `needle`.
std::vector<pid_t> children_with(pid_t parent, const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    std::string cmd = read_file(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

TEST(LaunchPs, RunsAParameterServerJobAndRestartsAKilledWorker) {
  const fs::path dir = make_temp_dir();
  write_csv(dir / "train.csv", 2048);
  Process p = spawn({kDtrain,
                     "launch",
                     "--ps",
                     "2",
                     "--workers",
                     "2",
                     "--max-restarts",
                     "2",
                     "--",
                     kDtrain,
                     "fit",
                     "--strategy",
                     "parameter-server",
                     "--train-csv",
                     (dir / "train.csv").string(),
                     "--test-csv",
                     (dir / "train.csv").string(),
                     "--epochs",
                     "40",
                     "--batch-size",
                     "32",
                     "--verbose",
                     "2"},
                    {}, (dir / "launch.log").string());
  // Once training runs, kill one of the worker processes (not a server, not the chief).
  const auto start = std::chrono::steady_clock::now();
  while (read_file(p.log).find("Epoch 2/") == std::string::npos &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<pid_t> fits = children_with(p.pid, "--strategy parameter-server");
  ASSERT_EQ(fits.size(), 3u) << read_file(p.log);  // two workers and the chief
  std::sort(fits.begin(), fits.end());
  kill(fits[0], SIGKILL);  // the first started: worker 0
  const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(180));
  const std::string log = read_file(p.log);
  EXPECT_EQ(code, 0) << log;
  EXPECT_NE(log.find("[ps 1] dtrain ps: serving on 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("[worker 0] exited with code 137; restarting it"), std::string::npos) << log;
  EXPECT_NE(log.find("Epoch 40/40"), std::string::npos) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("test_accuracy: ([0-9.]+)"))) << log;
  EXPECT_GE(std::stod(m[1]), 0.9) << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dtrain::testing
