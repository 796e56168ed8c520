// The Keras progress bar as a person sees it: `dtrain fit` runs in a real pseudo-terminal
// (forkpty), so it draws the bar (verbose defaults to 1 on a terminal); the test reads what the
// terminal got and interprets carriage returns as a terminal does (each \r returns to the start
// of the line, so a line shows what was drawn after its last \r).
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Terminal {
  int code = -1;
  std::string raw;  // every byte the terminal received
};

// Runs `dtrain ARGS` on a pseudo-terminal and collects its output (at most `limit_s` seconds).
Terminal run_on_terminal(const std::vector<std::string>& args, int limit_s = 240) {
  std::vector<std::string> argv = {std::string(DTRAIN_BINARY_DIR) + "/dtrain"};
  argv.insert(argv.end(), args.begin(), args.end());
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  Terminal t;
  if (pid < 0) return t;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  char buf[4096];
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      break;
    }
    if (poll(&p, 1, 200) <= 0) continue;
    const ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child has exited and closed the terminal
    t.raw.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  t.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return t;
}

// What the screen shows, line by line: "\r\n" (the terminal's newline) ends a line, and a bare
// "\r" returns to the line's start, so later text overwrites earlier text.
std::vector<std::string> screen_lines(const std::string& raw, std::vector<std::string>* frames) {
  std::vector<std::string> lines;
  std::string line;
  size_t col = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == '\r' && i + 1 < raw.size() && raw[i + 1] == '\n') continue;
    if (c == '\n') {
      if (frames) frames->push_back(line);
      lines.push_back(line);
      line.clear();
      col = 0;
    } else if (c == '\r') {
      if (frames && !line.empty()) frames->push_back(line);
      col = 0;
    } else if (c == '\b') {
      if (col > 0) --col;
    } else {
      if (col < line.size()) {
        line[col] = c;
      } else {
        line.push_back(c);
      }
      ++col;
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

TEST(ProgressBar, ATerminalSeesEpochLinesAGrowingBarAndTheFinalLogs) {
  const Terminal t = run_on_terminal(
      {"fit", "--steps-per-epoch", "20", "--epochs", "2", "--batch-size", "32", "--seed", "1"});
  ASSERT_EQ(t.code, 0) << t.raw;
  std::vector<std::string> frames;
  const std::vector<std::string> lines = screen_lines(t.raw, &frames);
  std::string screen;
  for (const auto& l : lines) screen += l + "\n";
  // The epoch headers, each followed by the finished bar with loss and accuracy.
  const std::regex final_bar(
      R"(^20/20 \[==============================\] - \d+s \d+[mu]?s/step - loss: \d+\.\d{4} - accuracy: \d\.\d{4} *$)");
  for (int epoch = 1; epoch <= 2; ++epoch) {
    const std::string header = "Epoch " + std::to_string(epoch) + "/2";
    size_t i = 0;
    while (i < lines.size() && lines[i] != header) ++i;
    ASSERT_LT(i, lines.size()) << "no line '" << header << "' on the screen:\n" << screen;
    ASSERT_LT(i + 1, lines.size()) << screen;
    EXPECT_TRUE(std::regex_match(lines[i + 1], final_bar))
        << "line after " << header << ": '" << lines[i + 1] << "'\n"
        << screen;
  }
  // No line on the screen carries a leftover of an earlier frame or a control character.
  for (const auto& l : lines) {
    for (char c : l) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "control character in '" << l << "'";
    EXPECT_EQ(l.find("ETA"), std::string::npos) << "a stale frame remains: '" << l << "'";
  }
  // The bar grew: frames of epoch 1 count up to 20 and the '=' part never shrinks.
  const std::regex frame(R"(^\s*(\d+)/20 \[(=*)>?\.*\].*)");
  std::vector<std::pair<int, size_t>> seen;
  for (const auto& f : frames) {
    std::smatch m;
    if (f == "Epoch 2/2") break;
    if (std::regex_match(f, m, frame)) seen.emplace_back(std::stoi(m[1]), m[2].length());
  }
  ASSERT_GE(seen.size(), 2u) << "the bar was drawn " << seen.size() << " times:\n" << t.raw;
  EXPECT_LT(seen.front().first, 20);
  EXPECT_EQ(seen.back().first, 20);
  for (size_t i = 1; i < seen.size(); ++i) {
    EXPECT_GE(seen[i].first, seen[i - 1].first);
    EXPECT_GE(seen[i].second, seen[i - 1].second);
  }
}

}  // namespace
