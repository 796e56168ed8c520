// usable_cpus() and cgroup_cpu_quota(): the affinity mask and the cgroup quota, read from /proc
// and the cgroup file systems (v2's unified hierarchy and v1's `cpu` controller, hybrid setups
// included).
#include "dtrain/core/cpus.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// A cgroup hierarchy that can hold a CPU quota: where it is mounted, the group of the hierarchy
// that the mount shows at its root, and this process's group in it.
struct Hierarchy {
  bool v2 = false;
  std::string mount_point;
  std::string mount_root;
  std::string group;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 2])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 3]))) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<double> to_number(const std::string& s) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v)) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

// The quota set on one group's directory, in CPUs: nullopt when none (or unreadable).
std::optional<double> quota_at(const fs::path& dir, bool v2) {
  if (v2) {
    const auto line = read_line(dir / "cpu.max");  // "max 100000" or "<quota> <period>"
    if (!line) return std::nullopt;
    const auto parts = split(*line, ' ');
    if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
    const auto quota = to_number(parts[0]), period = to_number(parts[1]);
    if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
    return *quota / *period;
  }
  const auto q = read_line(dir / "cpu.cfs_quota_us"), p = read_line(dir / "cpu.cfs_period_us");
  if (!q || !p) return std::nullopt;
  const auto quota = to_number(*q), period = to_number(*p);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: none
  return *quota / *period;
}

// The hierarchies that can limit the CPU: from mountinfo, matched with the process's groups.
std::vector<Hierarchy> cpu_hierarchies(const fs::path& proc) {
  // /proc/self/cgroup: "<id>:<controllers>:<path>"; v2's line is "0::<path>".
  std::string v2_group, v1_group;
  bool have_v2 = false, have_v1 = false;
  {
    std::ifstream in(proc / "cgroup");
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      if (line.substr(0, a) == "0" && controllers.empty()) {
        v2_group = path;
        have_v2 = true;
      } else {
        const auto names = split(controllers, ',');
        if (std::find(names.begin(), names.end(), "cpu") != names.end()) {
          v1_group = path;
          have_v1 = true;
        }
      }
    }
  }
  // mountinfo: "<id> <parent> <dev> <root> <mount point> <options> [optional...] - <fstype>
  // <source> <super options>".
  std::vector<Hierarchy> out;
  std::ifstream in(proc / "mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || dash + 3 > fields.end()) continue;
    const std::string& type = *(dash + 1);
    Hierarchy h{.mount_point = unescape(fields[4]), .mount_root = unescape(fields[3]), .group = {}};
    if (type == "cgroup2" && have_v2) {
      h.v2 = true;
      h.group = v2_group;
    } else if (type == "cgroup" && have_v1) {
      const auto options = split(*(dash + 3), ',');
      if (std::find(options.begin(), options.end(), "cpu") == options.end()) continue;
      h.group = v1_group;
    } else {
      continue;
    }
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

std::optional<double> cgroup_cpu_quota(const std::string& proc) {
  std::optional<double> smallest;
  for (const Hierarchy& h : cpu_hierarchies(proc)) {
    // The group's directory under the mount: its path relative to the mount's root (a container
    // sees its own group as the root of the mount). A group outside the mount's root (another
    // namespace's view) leaves the mount point itself.
    const fs::path top = fs::path(h.mount_point).lexically_normal();
    const fs::path rel = fs::path(h.group).lexically_normal().lexically_relative(
        fs::path(h.mount_root).lexically_normal());
    const bool inside = !rel.empty() && *rel.begin() != "..";
    // Every group from the process's up to the mount point may limit it: the smallest holds.
    for (fs::path d = inside ? (top / rel).lexically_normal() : top;; d = d.parent_path()) {
      if (const auto q = quota_at(d, h.v2)) smallest = smallest ? std::min(*smallest, *q) : *q;
      if (d == top || d == d.parent_path()) break;
    }
  }
  return smallest;
}

int usable_cpus() {
  static const int cpus = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (const auto quota = cgroup_cpu_quota()) {
      n = std::min(n, static_cast<int>(std::ceil(*quota - 1e-9)));
    }
    return std::max(1, n);
  }();
  return cpus;
}

}  // namespace dtrain
