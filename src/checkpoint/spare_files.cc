// SpareFiles.
#include "spare_files.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace dtrain::checkpoint::detail {

SpareFiles::~SpareFiles() {
  for (const auto& kind : spares_) {
    for (const std::string& p : kind) ::unlink(p.c_str());
  }
}

std::string SpareFiles::take(Kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string>& v = spares_[kind];
  if (v.empty()) return {};
  std::string p = std::move(v.back());
  v.pop_back();
  return p;
}

bool SpareFiles::retire(Kind kind, const std::string& path) {
  std::string spare;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spares_[kind].size() < max_per_kind_) {
      char suffix[48];
      std::snprintf(suffix, sizeof(suffix), ".tmp.%d.spare%llu", static_cast<int>(::getpid()),
                    counter_++);
      spare = path + suffix;
    }
  }
  if (!spare.empty() && ::rename(path.c_str(), spare.c_str()) == 0) {
    adopt(kind, std::move(spare));
    return true;
  }
  if (::unlink(path.c_str()) == 0) return true;
  return errno != ENOENT;
}

void SpareFiles::adopt(Kind kind, std::string path) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spares_[kind].size() < max_per_kind_) {
      spares_[kind].push_back(std::move(path));
      return;
    }
  }
  ::unlink(path.c_str());
}

}  // namespace dtrain::checkpoint::detail
