#include "dtrain/core/cpus.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

namespace dtrain {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory laid out as /proc/self (`cgroup`, `mountinfo`) with the cgroup mounts it names.
class FakeProc : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("cpus_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "proc");
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string proc() const { return (root_ / "proc").string(); }
  fs::path mount(const std::string& name) const { return root_ / name; }
  void mountinfo(const std::string& lines) { write(root_ / "proc" / "mountinfo", lines); }
  void cgroup(const std::string& lines) { write(root_ / "proc" / "cgroup", lines); }

  fs::path root_;
};

TEST_F(FakeProc, CgroupV2CpuMaxOfTheGroupAndItsAncestors) {
  const fs::path m = mount("unified");
  mountinfo("30 22 0:27 / " + m.string() + " rw,nosuid - cgroup2 cgroup2 rw\n");
  cgroup("0::/job/worker\n");
  write(m / "job" / "worker" / "cpu.max", "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);  // "max": no quota
  write(m / "job" / "cpu.max", "250000 100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 2.5);  // the parent's holds
  write(m / "job" / "worker" / "cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 0.5);  // the smallest along the path
  write(m / "cpu.max", "10000 100000\n");                   // the mount's own group too
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 0.1);
}

TEST_F(FakeProc, CgroupV1CfsQuotaWithCombinedControllers) {
  const fs::path m = mount("cpu,cpuacct");
  // A v1 hierarchy (cpu with cpuacct, as systemd mounts it) beside others without `cpu`.
  mountinfo("31 30 0:28 / " + m.string() + " rw - cgroup cgroup rw,cpu,cpuacct\n" +
            "33 30 0:30 / " + mount("cpuset").string() + " rw - cgroup cgroup rw,cpuset\n");
  cgroup("3:cpuset:/\n2:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n");
  write(m / "docker" / "abc" / "cpu.cfs_quota_us", "-1\n");
  write(m / "docker" / "abc" / "cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);
  write(m / "docker" / "abc" / "cpu.cfs_quota_us", "150000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 1.5);
  // A cpuset hierarchy's files are not a quota.
  write(mount("cpuset") / "cpu.cfs_quota_us", "10000\n");
  write(mount("cpuset") / "cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 1.5);
}

TEST_F(FakeProc, AContainersMountShowsItsOwnGroupAsTheRoot) {
  // Docker without a cgroup namespace: /proc/self/cgroup names the host's path, and the
  // container's mount has that group at its root.
  const fs::path m = mount("sys fs cgroup");
  std::string escaped = m.string();  // mountinfo escapes a space as \040
  for (size_t at; (at = escaped.find(' ')) != std::string::npos;) escaped.replace(at, 1, "\\040");
  mountinfo("40 30 0:37 /docker/abc " + escaped + " rw - cgroup2 cgroup2 rw\n");
  cgroup("0::/docker/abc\n");
  write(m / "cpu.max", "300000 100000\n");
  EXPECT_DOUBLE_EQ(cgroup_cpu_quota(proc()).value(), 3.0);
}

TEST_F(FakeProc, NothingReadableIsNoQuota) {
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);  // no files at all
  const fs::path m = mount("unified");
  mountinfo("garbage\n30 22 0:27 / " + m.string() + " rw - cgroup2 cgroup2 rw\n");
  cgroup("0::/a\n");
  write(m / "a" / "cpu.max", "lots 100000\n");
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);
  write(m / "a" / "cpu.max", "100000 0\n");
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);
  write(m / "a" / "cpu.max", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota(proc()), std::nullopt);
}

TEST(UsableCpus, AtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(usable_cpus(), 1);
  EXPECT_LE(usable_cpus(), CPU_COUNT(&set));
}

// Run by UsableCpus.FollowsARealCgroupQuota in a process it started inside a cgroup: reports
// what that process sees.
TEST(CpusChild, Report) {
  const char* out = std::getenv("DTRAIN_CPUS_TEST_REPORT");
  if (out == nullptr) GTEST_SKIP() << "run by UsableCpus.FollowsARealCgroupQuota";
  std::ofstream(out) << usable_cpus() << " " << cgroup_cpu_quota().value_or(-1) << "\n";
}

// A real cgroup (v1's cpu controller or v2 with cpu enabled, as root): a process started in a
// group limited to half a CPU sees one usable CPU and the quota 0.5.
TEST(UsableCpus, FollowsARealCgroupQuota) {
  fs::path group;
  std::string quota_file, quota_text;
  for (const auto& [mount, file, text] :
       {std::tuple{"/sys/fs/cgroup/cpu", "cpu.cfs_quota_us", "50000"},
        std::tuple{"/sys/fs/cgroup/cpu,cpuacct", "cpu.cfs_quota_us", "50000"},
        std::tuple{"/sys/fs/cgroup", "cpu.max", "50000 100000"},
        std::tuple{"/sys/fs/cgroup/unified", "cpu.max", "50000 100000"}}) {
    const fs::path g = fs::path(mount) / ("dtrain-cpus-test-" + std::to_string(::getpid()));
    std::error_code ec;
    if (!fs::create_directory(g, ec)) continue;
    if (fs::exists(g / file)) {
      std::ofstream(g / file) << text;
      std::ifstream check(g / file);
      std::string got;
      std::getline(check, got);
      if (got == text) {
        group = g;
        break;
      }
    }
    fs::remove(g, ec);
  }
  if (group.empty()) GTEST_SKIP() << "no writable cgroup with a CPU quota here (needs root)";
  const fs::path report = fs::path(::testing::TempDir()) / "cpus_child_report";
  fs::remove(report);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::ofstream procs(group / "cgroup.procs");
    procs << ::getpid() << std::flush;
    if (!procs) ::_exit(77);  // the kernel refused the move (a delegation rule): skipped
    ::setenv("DTRAIN_CPUS_TEST_REPORT", report.c_str(), 1);
    ::execl("/proc/self/exe", "cpus_test", "--gtest_filter=CpusChild.Report", nullptr);
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::error_code ec;
  fs::remove(group, ec);  // empty again: its one process has exited
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) GTEST_SKIP() << "cannot join " << group;
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(slurp(report), "1 0.5\n");
}

}  // namespace
}  // namespace dtrain
