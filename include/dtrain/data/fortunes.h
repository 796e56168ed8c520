// The default text corpus: the English fortunes of Debian's `fortunes` package (about 2.5 MB of
// UTF-8 text, 113 distinct characters), as files of fortunes separated by "%" lines. Thread-safe.
#pragma once

#include <string>
#include <vector>

namespace dtrain::data::fortunes {

// Where Debian's fortunes package puts the files.
inline constexpr const char* kDefaultDir = "/usr/share/games/fortunes";

// The corpus's text files in `dir`, sorted by name: every regular file (or link to one) except
// the `.dat` and `.u8` index files, hidden files and subdirectories (such as `off/`, the
// offensive fortunes some packages install). Throws NotFoundError telling the user to
// `apt-get install fortunes` when `dir` does not exist or holds no text file.
std::vector<std::string> list_files(const std::string& dir = kDefaultDir);

// The files of list_files(dir) concatenated in that order (each ends with a newline). Throws
// what list_files throws, and DataLossError (naming the file) for one that is not UTF-8 text.
std::string load_text(const std::string& dir = kDefaultDir);

}  // namespace dtrain::data::fortunes
