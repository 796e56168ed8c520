// Runs `dtrain launch` on small shell programs as a user would: rank prefixes, the environment
// contract, exit codes, signal forwarding, and two launchers forming one job on 127.0.0.1.
// Every wait is bounded and every worker script ends by itself within 30 s.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#include "testutil/free_port.h"
#include "testutil/launcher_process.h"
#include "testutil/run_dtrain.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A worker loop that ends by itself (30 s) even if nobody stops it.
constexpr const char* kIdle = "for i in $(seq 600); do sleep 0.05; done";

using dtrain::testutil::free_port;
using Outcome = dtrain::testutil::LaunchOutcome;
using Launcher = dtrain::testutil::LauncherProcess;

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dtrain_launch_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Outcome launch(const std::vector<std::string>& args, const std::string& name = "out") {
    Launcher l(args, dir_ / name);
    return l.wait();
  }

  fs::path dir_;
};

TEST_F(LaunchTest, PrefixesEveryLineWithTheRank) {
  const Outcome r = launch({"--nproc-per-node", "3", "--", "sh", "-c",
                            "echo out-line; echo err-line >&2; echo second; printf no-newline"});
  ASSERT_EQ(r.code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    for (const char* text : {"out-line", "err-line", "second", "no-newline"}) {
      EXPECT_NE(r.output.find(p + text + "\n"), std::string::npos) << p << text << "\n" << r.output;
    }
  }
  for (const auto& line : lines_of(r.output)) {
    EXPECT_TRUE(line.rfind("[rank ", 0) == 0 || line.rfind("[launch] ", 0) == 0) << line;
  }
}

TEST_F(LaunchTest, WorkersGetDistinctRanksAndTheEnvironmentContract) {
  const Outcome r = launch(
      {"--nproc-per-node", "3", "--run-id", "job42", "--", "sh", "-c",
       "echo ENV $DTRAIN_RANK $DTRAIN_WORLD_SIZE $DTRAIN_LOCAL_RANK $DTRAIN_LOCAL_WORLD_SIZE "
       "$DTRAIN_NODE_RANK $DTRAIN_NNODES $DTRAIN_RDZV $DTRAIN_RDZV_GENERATION "
       "$DTRAIN_MASTER_ADDR $DTRAIN_MASTER_PORT $DTRAIN_RUN_ID"});
  ASSERT_EQ(r.code, 0) << r.output;
  std::set<std::string> ranks;
  for (const auto& line : lines_of(r.output)) {
    std::istringstream in(line);
    std::string prefix, num, env, rank, world, local, local_world, node, nnodes, rdzv, gen, addr,
        port, run_id;
    in >> prefix >> num >> env >> rank >> world >> local >> local_world >> node >> nnodes >> rdzv >>
        gen >> addr >> port >> run_id;
    if (env != "ENV") continue;
    EXPECT_EQ(num, rank + "]");  // the prefix is the worker's rank
    ranks.insert(rank);
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local, rank);
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(node, "0");
    EXPECT_EQ(nnodes, "1");
    EXPECT_EQ(rdzv, addr + ":" + port);  // the coordination service inside the launcher
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(port), 0);
    EXPECT_EQ(gen, "1");
    EXPECT_EQ(run_id, "job42");
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"})) << r.output;
}

TEST_F(LaunchTest, TheCoordinationServiceListensWhileWorkersRun) {
  if (!fs::exists("/bin/bash")) GTEST_SKIP() << "needs bash for /dev/tcp";
  const Outcome r =
      launch({"--nproc-per-node", "2", "--", "bash", "-c",
              "exec 3<>/dev/tcp/$DTRAIN_MASTER_ADDR/$DTRAIN_MASTER_PORT && echo open"});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] open"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] open"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, ExitsWithTheFirstFailuresCodeAndStopsTheOthers) {
  const Outcome r =
      launch({"--nproc-per-node", "3", "--", "sh", "-c",
              std::string("if [ $DTRAIN_RANK = 1 ]; then sleep 0.2; exit 7; fi; ") + kIdle});
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;  // the others were stopped, not waited for
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, AWorkerKilledBySignalGives128PlusSignal) {
  const Outcome r = launch({"--nproc-per-node", "2", "--", "sh", "-c",
                            std::string("if [ $DTRAIN_RANK = 0 ]; then kill -9 $$; fi; ") + kIdle});
  EXPECT_EQ(r.code, 128 + 9) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
}

TEST_F(LaunchTest, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const Outcome r = launch({"--nproc-per-node", "3", "--grace-period", "0.5", "--", "sh", "-c",
                            std::string("if [ $DTRAIN_RANK = 2 ]; then sleep 0.2; exit 4; fi; "
                                        "trap '' TERM; ") +
                                kIdle});
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
  EXPECT_NE(r.output.find("killing it"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, ForwardsSigtermToTheWorkers) {
  Launcher l({"--nproc-per-node", "3", "--", "sh", "-c",
              std::string("trap 'echo got TERM; exit 0' TERM; echo ready; ") + kIdle},
             dir_ / "out");
  ASSERT_TRUE(l.wait_for_output("ready", 3, 30s)) << l.output();
  kill(l.pid(), SIGTERM);
  const Outcome r = l.wait();
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.output;  // the launcher was terminated
  EXPECT_LT(r.seconds, 15) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(rank) + "] got TERM"), std::string::npos)
        << r.output;
  }
}

TEST_F(LaunchTest, AMissingProgramIsNotFound) {
  const Outcome r = launch({"--nproc-per-node", "2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/program"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, UsageErrorsExitWith2) {
  EXPECT_EQ(launch({"--nproc-per-node", "2"}).code, 2);  // no program
  EXPECT_EQ(launch({"--nproc-per-node", "0", "--", "true"}).code, 2);
  const Outcome multi = launch({"--nnodes", "2", "--node-rank", "0", "--", "true"});
  EXPECT_EQ(multi.code, 2);
  EXPECT_NE(multi.output.find("--rdzv must be host:port"), std::string::npos) << multi.output;
  EXPECT_EQ(
      launch({"--nnodes", "2", "--node-rank", "2", "--rdzv", "127.0.0.1:1", "--", "true"}).code, 2);
  EXPECT_EQ(launch({"--rdzv", "nohostport", "--", "true"}).code, 2);
}

// Values no job can run with are usage errors (exit 2) before anything starts, naming the flag
// and the limit; none of them starts a worker (a worker would print "started").
TEST_F(LaunchTest, AbsurdValuesAreUsageErrorsBeforeAnythingStarts) {
  const std::string started = "echo started";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc-per-node", "100000"}, "at most 1024 processes"},
      {{"--nproc-per-node", "-3"}, "--nproc-per-node"},
      {{"--ps", "-1"}, "--ps must be >= 1"},
      {{"--ps", "0"}, "--ps must be >= 1"},
      {{"--ps", "1", "--workers", "-1"}, "--workers must be >= 0"},
      {{"--ps", "100000"}, "at most 1024 processes"},
      {{"--ps", "1", "--max-restarts", "-1"}, "--max-restarts must be >= 0"},
      {{"--ps", "1", "--nproc-per-node", "2"}, "excludes"},
      {{"--workers", "2"}, "requires --ps"},
      {{"--max-restarts", "-1"}, "--max-restarts must be >= 0"},
      {{"--nnodes", "4:2", "--rdzv", "127.0.0.1:1"}, "MIN is larger than MAX"},
      {{"--nnodes", "0"}, "--nnodes"},
      {{"--nnodes", "100000", "--rdzv", "127.0.0.1:1"}, "more than 65536 nodes"},
      {{"--node-rank", "-1"}, "--node-rank -1"},
      {{"--grace-period", "-1"}, "--grace-period"},
      {{"--grace-period", "inf"}, "--grace-period inf must be >= 0"},
      {{"--rdzv-timeout", "0"}, "--rdzv-timeout"},
      {{"--heartbeat-timeout", "1e300"}, "--heartbeat-timeout"},
      {{"--watchdog-timeout", "nan"}, "timeouts and intervals"},
      {{"--exclude-after", "-2"}, "--exclude-after"},
      {{"--preemption-exit-code", "300"}, "not an exit code in [1, 255]"},
      {{"--snapshot-commit", "fsync"}, "--snapshot-commit must be journal or files"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), {"--", "sh", "-c", started});
    const Outcome r = launch(args);
    std::string shown;
    for (const auto& f : flags) shown += f + " ";
    EXPECT_EQ(r.code, 2) << shown << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << shown << "\n" << r.output;
    EXPECT_EQ(r.output.find("started"), std::string::npos) << shown << "\n" << r.output;
    std::cout << "[ measured ] launch " << shown << "exited with " << r.code << " after "
              << r.seconds << " s\n";
  }
}

// More workers than the file-descriptor limit allows is a usage error naming RLIMIT_NOFILE, not
// a failure halfway through starting them.
TEST_F(LaunchTest, WorkersBeyondTheFileDescriptorLimitAreAUsageError) {
  const std::string cmd = "ulimit -n 256 && exec " + std::string(DTRAIN_BINARY_DIR) +
                          "/dtrain launch --nproc-per-node 100 -- sh -c 'echo started' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("RLIMIT_NOFILE"), std::string::npos) << out;
  EXPECT_NE(out.find("256"), std::string::npos) << out;
  EXPECT_EQ(out.find("started"), std::string::npos) << out;
}

TEST_F(LaunchTest, PsPortsOutsideTheRangeAreUsageErrors) {
  for (const char* port : {"-5", "70000"}) {
    const auto r = dtrain::testutil::run_dtrain(std::string("ps --port ") + port);
    EXPECT_EQ(r.code, 2) << port << "\n" << r.output;
    EXPECT_NE(r.output.find("--port"), std::string::npos) << r.output;
  }
}

TEST_F(LaunchTest, TwoNodesOnOneMachineFormOneJob) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::string program = "echo RANK $DTRAIN_RANK $DTRAIN_WORLD_SIZE $DTRAIN_NODE_RANK";
  // Node 1 starts first: it waits for node 0's service. Nodes may differ in size.
  Launcher node1({"--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv", rdzv,
                  "--rdzv-timeout", "30", "--", "sh", "-c", program},
                 dir_ / "node1");
  std::this_thread::sleep_for(200ms);
  Launcher node0({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--rdzv", rdzv,
                  "--rdzv-timeout", "30", "--", "sh", "-c", program},
                 dir_ / "node0");
  const Outcome r0 = node0.wait();
  const Outcome r1 = node1.wait();
  ASSERT_EQ(r0.code, 0) << r0.output;
  ASSERT_EQ(r1.code, 0) << r1.output;
  EXPECT_NE(r0.output.find("[rank 0] RANK 0 3 0"), std::string::npos) << r0.output;
  EXPECT_NE(r0.output.find("[rank 1] RANK 1 3 0"), std::string::npos) << r0.output;
  EXPECT_NE(r1.output.find("[rank 2] RANK 2 3 1"), std::string::npos) << r1.output;
}

TEST_F(LaunchTest, AFailureOnOneNodeStopsTheOtherNode) {
  const std::string rdzv = "127.0.0.1:" + std::to_string(free_port());
  const std::string program =
      std::string("if [ $DTRAIN_RANK = 3 ]; then sleep 0.3; exit 5; fi; ") + kIdle;
  Launcher node0({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--rdzv", rdzv,
                  "--rdzv-timeout", "30", "--", "sh", "-c", program},
                 dir_ / "node0");
  Launcher node1({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv", rdzv,
                  "--rdzv-timeout", "30", "--", "sh", "-c", program},
                 dir_ / "node1");
  const Outcome r1 = node1.wait();
  const Outcome r0 = node0.wait();
  EXPECT_EQ(r1.code, 5) << r1.output;
  EXPECT_EQ(r0.code, 5) << r0.output;
  EXPECT_LT(r0.seconds, 20) << r0.output;
  EXPECT_NE(r0.output.find("failure on another node"), std::string::npos) << r0.output;
}

}  // namespace
