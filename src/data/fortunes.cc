// The fortunes corpus: a directory listing with the index files filtered out.
#include "dtrain/data/fortunes.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>

#include "dtrain/core/error.h"
#include "dtrain/data/text.h"

namespace dtrain::data::fortunes {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

[[noreturn]] void not_installed(const std::string& dir, const char* why) {
  throw NotFoundError(
      str_cat("fortunes: ", dir, " ", why,
              "; install the corpus with `apt-get install fortunes` (Debian's "
              "fortunes package), or pass the directory that holds the text files"));
}

}  // namespace

std::vector<std::string> list_files(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) not_installed(dir, "does not exist");
  const std::string prefix = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::vector<std::string> files;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) {
      continue;
    }
    struct stat st;  // stat follows links: a link to a text file counts, a directory does not
    if (::stat((prefix + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    files.push_back(prefix + name);
  }
  if (files.empty()) not_installed(dir, "holds no fortune text files");
  std::sort(files.begin(), files.end());
  return files;
}

std::string load_text(const std::string& dir) {
  std::string text;
  for (const std::string& path : list_files(dir)) {
    const std::string data = read_file(path);
    check_utf8_text(data, path);
    text += data;
    if (!data.empty() && data.back() != '\n') text += '\n';
  }
  return text;
}

}  // namespace dtrain::data::fortunes
