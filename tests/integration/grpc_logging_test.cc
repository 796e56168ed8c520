// gRPC's own log lines ("E1201 12:00:00.000 123 chttp2_server.cc:1181] ...") do not reach the
// user: `dtrain ps` on a port another process holds prints dtrain's one-line error and nothing
// else, unless GRPC_VERBOSITY asks gRPC for its logs.
#include <gtest/gtest.h>

#include <regex>

#include "distribute_process.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;

// A listening socket on 127.0.0.1 (an ephemeral port): the port is taken while it lives.
class TakenPort {
 public:
  TakenPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(fd_, 1) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1: " << std::strerror(errno);
    }
    port_ = ntohs(a.sin_port);
  }
  ~TakenPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class GrpcLogging : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("dtrain_grpc_logging"); }
  void TearDown() override { fs::remove_all(dir_); }

  // `dtrain ps --port PORT` with `env`; returns (exit code, stdout and stderr).
  std::pair<int, std::string> ps(int port, const std::map<std::string, std::string>& env) {
    const std::string log = (fs::path(dir_) / "ps.log").string();
    Process p = spawn({DTRAIN_BINARY, "ps", "--port", std::to_string(port)}, env, log);
    const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(60));
    return {code, read_file(log)};
  }

  std::string dir_;
};

// A gRPC log line: severity letter, MMDD, time ("E1201 11:02:48.123456 ...").
const std::regex kGrpcLine(R"((^|\n)[DIWE]\d{4} \d\d:\d\d:\d\d)");

TEST_F(GrpcLogging, PsOnATakenPortPrintsOnlyOurOneLineError) {
  TakenPort taken;
  const auto [code, output] = ps(taken.port(), {});
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(code, -1) << "did not exit\n" << output;
  EXPECT_LT(code, 128) << "killed by a signal\n" << output;
  EXPECT_EQ(output.rfind("dtrain: error: ", 0), 0u) << output;
  EXPECT_NE(output.find(std::to_string(taken.port())), std::string::npos) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << "not one line:\n" << output;
  EXPECT_EQ(output.find("chttp2"), std::string::npos) << output;
  EXPECT_FALSE(std::regex_search(output, kGrpcLine)) << output;
}

// The knob for gRPC's own logs: with GRPC_VERBOSITY set, gRPC logs as usual (which also shows
// that the test above would see its lines).
TEST_F(GrpcLogging, GrpcVerbosityBringsGrpcsLogsBack) {
  TakenPort taken;
  const auto [code, output] = ps(taken.port(), {{"GRPC_VERBOSITY", "ERROR"}});
  EXPECT_NE(code, 0) << output;
  EXPECT_TRUE(std::regex_search(output, kGrpcLine)) << output;
  EXPECT_NE(output.find("dtrain: error: "), std::string::npos) << output;
}

}  // namespace
}  // namespace dtrain::testing
