// Keras 3 .keras archives (keras_v3.h): the zip container through libzip, model.weights.h5 through
// the in-memory HDF5 reader and writer shared with the .h5 code (h5_reader.h, h5_writer.h). The
// layout follows keras/src/saving/saving_lib.py (H5IOStore); docs/keras-files.md describes it.
#include "dtrain/checkpoint/keras_v3.h"

#include <zip.h>

#include <ctime>
#include <map>

#include "h5_reader.h"
#include "h5_writer.h"

namespace dtrain::checkpoint {
using namespace h5;
namespace {

constexpr const char* kMetadataName = "metadata.json";
constexpr const char* kConfigName = "config.json";
constexpr const char* kWeightsName = "model.weights.h5";

// Deflate's best ratio is about 1032:1; a member claiming more is corrupt (or a zip bomb).
constexpr uint64_t kMaxExpansion = 1032;

std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string out = zip_error_strerror(&e);
  zip_error_fini(&e);
  return out;
}

// An open archive, closed (discarding nothing: it is read-only) on destruction.
class ZipReader {
 public:
  ZipReader(const std::string& path, uint64_t file_size) : path_(path), file_size_(file_size) {
    int err = 0;
    zip_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (zip_ == nullptr) {
      throw DataLossError(str_cat(path, ": cannot open the .keras zip archive (truncated or ",
                                  "corrupt): ", zip_error_text(err)));
    }
  }
  ~ZipReader() {
    if (zip_ != nullptr) zip_discard(zip_);
  }
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    const zip_int64_t n = zip_get_num_entries(zip_, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), 0);
      if (name != nullptr) out.emplace_back(name);
    }
    return out;
  }

  bool has(const std::string& name) const { return zip_name_locate(zip_, name.c_str(), 0) >= 0; }

  std::string read(const std::string& name) const {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat(zip_, name.c_str(), 0, &st) != 0) {
      throw DataLossError(str_cat(path_, ": cannot stat member ", name, ": ", zip_strerror(zip_)));
    }
    DTRAIN_CHECK((st.valid & ZIP_STAT_SIZE) != 0, path_, ": member ", name, " has no size");
    const uint64_t comp = (st.valid & ZIP_STAT_COMP_SIZE) != 0 ? st.comp_size : st.size;
    if (comp > file_size_ || st.size > comp * kMaxExpansion + 4096) {
      throw DataLossError(str_cat(path_, ": member ", name, " claims ", st.size,
                                  " bytes from a compressed size of ", comp, " in a file of ",
                                  file_size_, " bytes (corrupt, or a zip bomb)"));
    }
    zip_file_t* f = zip_fopen(zip_, name.c_str(), 0);
    if (f == nullptr) {
      throw DataLossError(str_cat(path_, ": cannot open member ", name, ": ", zip_strerror(zip_)));
    }
    std::string out(static_cast<size_t>(st.size), '\0');
    uint64_t got = 0;
    std::string problem;
    while (got < st.size) {
      const zip_int64_t r = zip_fread(f, out.data() + got, st.size - got);
      if (r < 0) {
        problem = zip_file_strerror(f);
        break;
      }
      if (r == 0) {
        problem = str_cat("ends after ", got, " of ", st.size, " bytes");
        break;
      }
      got += static_cast<uint64_t>(r);
    }
    if (problem.empty()) {
      // Reading past the end makes libzip verify the CRC.
      char extra = 0;
      if (zip_fread(f, &extra, 1) < 0) problem = zip_file_strerror(f);
    }
    zip_fclose(f);
    if (!problem.empty()) {
      throw DataLossError(str_cat(path_, ": cannot read member ", name, ": ", problem));
    }
    return out;
  }

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  zip_t* zip_ = nullptr;
};

bool all_digits(std::string_view s) {
  return !s.empty() && s.size() < 10 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The "<path>/vars" groups of model.weights.h5, with their datasets.
std::vector<KerasV3Vars> read_vars(const std::string& label, const std::string& image) {
  QuietErrors quiet;
  Reader reader(label, image);
  std::vector<std::string> groups;  // full paths of the vars groups, without the leading '/'
  const herr_t r = H5Ovisit(
      reader.file(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t, const char* name, const H5O_info_t* info, void* out) -> herr_t {
        const std::string_view n(name);
        if (info->type == H5O_TYPE_GROUP &&
            (n == "vars" || (n.size() > 5 && n.substr(n.size() - 5) == "/vars"))) {
          static_cast<std::vector<std::string>*>(out)->emplace_back(n);
        }
        return 0;
      },
      &groups);
  if (r < 0) reader.corrupt("cannot list the objects of the file");
  std::vector<KerasV3Vars> out;
  for (const std::string& full : groups) {
    KerasV3Vars v;
    v.path = full == "vars" ? std::string() : full.substr(0, full.size() - 5);
    const std::string where = "/" + full;
    Handle g = reader.open_group(reader.file(), full, where);
    v.name = reader.read_scalar(g.get(), "name", where);
    std::vector<std::string> links;
    if (H5Literate(
            g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
            [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
              static_cast<std::vector<std::string>*>(out)->emplace_back(name);
              return 0;
            },
            &links) < 0) {
      reader.corrupt(str_cat("cannot list group ", where));
    }
    std::map<size_t, std::string> by_index;
    for (const std::string& l : links) {
      H5O_info_t info;
      if (!all_digits(l) || H5Oget_info_by_name(g.get(), l.c_str(), &info, H5P_DEFAULT) < 0 ||
          info.type != H5O_TYPE_DATASET) {
        throw DataLossError(str_cat(label, ": ", where, "/", l,
                                    " is not a variable (Keras stores datasets named 0, 1, ...)"));
      }
      by_index[std::stoul(l)] = l;
    }
    size_t expect = 0;
    for (const auto& [index, l] : by_index) {
      if (index != expect) {
        throw DataLossError(str_cat(label, ": ", where, " has variables up to ", l, " but no ",
                                    expect, " (Keras numbers them 0..n-1)"));
      }
      v.values.push_back(reader.read_dataset(g.get(), l, str_cat(where, "/", l)));
      ++expect;
    }
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(),
            [](const KerasV3Vars& a, const KerasV3Vars& b) { return a.path < b.path; });
  return out;
}

std::string build_weights_image(const std::string& path, const KerasV3Contents& c) {
  static std::atomic<uint64_t> counter{0};
  size_t bytes = size_t{1} << 20;
  for (const KerasV3Vars& v : c.vars) {
    for (const Tensor& t : v.values) bytes += t.nbytes() + 1024;
  }
  QuietErrors quiet;
  Writer w(str_cat(path, ".weights-in-memory.", ::getpid(), ".", counter++), path, bytes,
           KerasH5WriteOptions{});
  for (const KerasV3Vars& v : c.vars) {
    const std::string group = v.path.empty() ? "vars" : v.path + "/vars";
    Handle g = w.create_group(w.root(), group, "/" + group);
    // Keras writes the name as a Python str: a variable-length UTF-8 string.
    if (!v.name.empty()) w.write_string(g.get(), "name", v.name, /*utf8=*/true, "/" + group);
    for (size_t i = 0; i < v.values.size(); ++i) {
      w.write_dataset(g.get(), std::to_string(i), v.values[i], str_cat("/", group, "/", i));
    }
  }
  return w.finish();
}

void validate(const std::string& path, const KerasV3Contents& c) {
  std::set<std::string> assets;
  for (const KerasV3Asset& a : c.assets) {
    DTRAIN_CHECK(!a.path.empty() && a.path.front() != '/' && a.path.back() != '/' &&
                     a.path.find("..") == std::string::npos && assets.insert(a.path).second,
                 "write_keras_v3: ", path, ": bad or repeated asset path '", a.path, "'");
  }
  std::set<std::string> seen;
  for (const KerasV3Vars& v : c.vars) {
    DTRAIN_CHECK(seen.insert(v.path).second, "write_keras_v3: ", path, ": two vars groups at '",
                 v.path, "'");
    if (!v.path.empty()) {
      size_t begin = 0;
      while (begin <= v.path.size()) {
        size_t end = v.path.find('/', begin);
        if (end == std::string::npos) end = v.path.size();
        const std::string part = v.path.substr(begin, end - begin);
        DTRAIN_CHECK(!part.empty() && part != "vars", "write_keras_v3: ", path, ": bad vars path '",
                     v.path, "' (empty components and components named 'vars' are not allowed)");
        begin = end + 1;
      }
    }
    for (size_t i = 0; i < v.values.size(); ++i) {
      DTRAIN_CHECK(v.values[i].defined(), "write_keras_v3: ", path, ": ", v.path, "/vars/", i,
                   " is undefined");
      if (h5_types_for(v.values[i].dtype()).first < 0) {
        throw UnimplementedError(str_cat("write_keras_v3: ", path, ": ", v.path, "/vars/", i,
                                         " is ", dtype_name(v.values[i].dtype()),
                                         "; .keras weights are written as float32/float64 and "
                                         "integers only"));
      }
    }
  }
}

// The bytes of a zip archive holding `members` (name, bytes, modification time), stored
// uncompressed.
std::string build_zip(const std::string& path,
                      const std::vector<std::tuple<const char*, const std::string*, time_t>>& m) {
  zip_error_t ze;
  zip_error_init(&ze);
  auto fail = [&](const std::string& what, const std::string& detail) {
    const std::string msg = str_cat(path, ": ", what, ": ", detail);
    zip_error_fini(&ze);
    throw InternalError(msg);
  };
  zip_source_t* src = zip_source_buffer_create(nullptr, 0, 0, &ze);
  if (src == nullptr) fail("cannot create an in-memory zip archive", zip_error_strerror(&ze));
  zip_t* za = zip_open_from_source(src, ZIP_TRUNCATE, &ze);
  if (za == nullptr) {
    zip_source_free(src);
    fail("cannot create an in-memory zip archive", zip_error_strerror(&ze));
  }
  zip_source_keep(src);
  std::string problem;
  for (const auto& [name, data, mtime] : m) {
    zip_source_t* s = zip_source_buffer(za, data->data(), data->size(), 0);
    const zip_int64_t idx =
        s == nullptr ? -1 : zip_file_add(za, name, s, ZIP_FL_ENC_UTF_8 | ZIP_FL_OVERWRITE);
    if (idx < 0) {
      if (s != nullptr) zip_source_free(s);
      problem = str_cat("cannot add ", name, ": ", zip_strerror(za));
      break;
    }
    if (zip_set_file_compression(za, static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0) != 0 ||
        zip_file_set_mtime(za, static_cast<zip_uint64_t>(idx), mtime, 0) != 0) {
      problem = str_cat("cannot set up ", name, ": ", zip_strerror(za));
      break;
    }
  }
  if (problem.empty() && zip_close(za) != 0) problem = str_cat("cannot finish: ", zip_strerror(za));
  if (!problem.empty()) {
    zip_discard(za);
    zip_source_free(src);
    fail("cannot build the zip archive", problem);
  }
  std::string out;
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_source_stat(src, &st) != 0 || zip_source_open(src) != 0) {
    zip_source_free(src);
    fail("cannot read back the in-memory zip archive", "zip_source_open failed");
  }
  out.resize(static_cast<size_t>(st.size));
  const zip_int64_t got = zip_source_read(src, out.data(), out.size());
  zip_source_close(src);
  zip_source_free(src);
  zip_error_fini(&ze);
  if (got < 0 || static_cast<uint64_t>(got) != st.size) {
    throw InternalError(str_cat(path, ": cannot read back the in-memory zip archive"));
  }
  return out;
}

}  // namespace

const KerasV3Vars* KerasV3Contents::find(std::string_view p) const {
  for (const KerasV3Vars& v : vars) {
    if (v.path == p) return &v;
  }
  return nullptr;
}

bool is_keras_v3_path(std::string_view path) {
  constexpr std::string_view ext = ".keras";
  return path.size() > ext.size() && path.substr(path.size() - ext.size()) == ext;
}

bool is_zip_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char sig[4] = {};
  const ssize_t n = ::read(fd, sig, sizeof(sig));
  ::close(fd);
  return n == 4 && sig[0] == 'P' && sig[1] == 'K' &&
         ((sig[2] == 3 && sig[3] == 4) || (sig[2] == 5 && sig[3] == 6));
}

KerasV3Contents read_keras_v3(const std::string& path) {
  const uint64_t size = check_readable_file(path);
  if (!is_zip_file(path)) {
    throw DataLossError(str_cat(path,
                                ": not a zip archive (a .keras file is a zip of metadata.json, "
                                "config.json and model.weights.h5)",
                                is_hdf5_file(path) ? "; it is an HDF5 file: load it as .h5" : ""));
  }
  ZipReader zip(path, size);
  for (const char* required : {kConfigName, kWeightsName}) {
    if (!zip.has(required)) {
      std::string names;
      for (const std::string& n : zip.names()) names += (names.empty() ? "" : ", ") + n;
      throw InvalidArgumentError(
          str_cat(path, ": the .keras archive has no ", required,
                  " (it holds: ", names.empty() ? std::string("nothing") : names, ")",
                  zip.has("model.weights.npz") ? "; npz weights are not supported" : ""));
    }
  }
  KerasV3Contents c;
  if (zip.has(kMetadataName)) c.metadata_json = zip.read(kMetadataName);
  c.config_json = zip.read(kConfigName);
  c.vars = read_vars(str_cat(path, ": ", kWeightsName), zip.read(kWeightsName));
  for (const std::string& n : zip.names()) {
    if (n.size() > 7 && n.compare(0, 7, "assets/") == 0 && n.back() != '/') {
      c.assets.push_back({n.substr(7), zip.read(n)});
    }
  }
  return c;
}

std::vector<KerasV3Vars> read_keras_v3_weights(const std::string& path) {
  check_readable_file(path);
  if (!is_hdf5_file(path)) {
    throw DataLossError(str_cat(path,
                                ": not an HDF5 file (no HDF5 signature: empty, truncated or "
                                "overwritten)"));
  }
  return read_vars(path, read_file(path));
}

bool is_keras_v3_weights_file(const std::string& path) {
  if (!is_hdf5_file(path)) return false;
  QuietErrors quiet;
  Handle f = file_handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) return false;
  return !attribute_exists(f.get(), "layer_names") && !attribute_exists(f.get(), "layer_names0") &&
         !link_exists(f.get(), "model_weights") &&
         (link_exists(f.get(), "vars") || link_exists(f.get(), "layers"));
}

void write_keras_v3(const std::string& path, const KerasV3Contents& contents) {
  DTRAIN_CHECK(!path.empty() && path.back() != '/', "write_keras_v3: bad path '", path, "'");
  validate(path, contents);
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw NotFoundError(str_cat(path, ": directory '", dir, "' does not exist"));
  }
  const std::string weights = build_weights_image(path, contents);
  // Keras's zf.open(name, "w") members carry the zip epoch (1980-01-01 00:00 local time),
  // writestr's model.weights.h5 the time of saving.
  std::tm epoch{};
  epoch.tm_year = 80;
  epoch.tm_mday = 1;
  epoch.tm_isdst = -1;
  const time_t t1980 = std::mktime(&epoch);
  const time_t now = std::time(nullptr);
  std::vector<std::tuple<const char*, const std::string*, time_t>> members = {
      {kMetadataName, &contents.metadata_json, t1980},
      {kConfigName, &contents.config_json, t1980},
      {kWeightsName, &weights, now}};
  std::vector<std::string> asset_names;
  asset_names.reserve(contents.assets.size());
  for (const KerasV3Asset& a : contents.assets) asset_names.push_back("assets/" + a.path);
  for (size_t i = 0; i < contents.assets.size(); ++i) {
    members.emplace_back(asset_names[i].c_str(), &contents.assets[i].bytes, t1980);
  }
  const std::string archive = build_zip(path, members);
  write_file_atomically(path, archive);
}

}  // namespace dtrain::checkpoint
