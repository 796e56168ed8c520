// Reading Keras HDF5 files (read_keras_h5, list_h5_objects): string attributes in both of h5py's
// encodings, weight datasets at "<group>/<weight name>" paths, sizes checked against the file
// before allocating. The layout is described in docs/keras-h5.md.
#include "h5_reader.h"

namespace dtrain::checkpoint {
using namespace h5;
KerasH5Contents read_keras_h5(const std::string& path) {
  QuietErrors quiet;
  Reader reader(path);
  return reader.read();
}

std::vector<H5ObjectInfo> list_h5_objects(const std::string& path) {
  QuietErrors quiet;
  Reader reader(path);
  struct Visit {
    const Reader* reader;
    std::vector<H5ObjectInfo> out;
  } visit{&reader, {}};
  const herr_t r = H5Ovisit(
      reader.file(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t loc, const char* name, const H5O_info_t* info, void* data) -> herr_t {
        auto* v = static_cast<Visit*>(data);
        H5ObjectInfo o;
        o.path = std::string(name) == "." ? "/" : "/" + std::string(name);
        o.is_group = info->type == H5O_TYPE_GROUP;
        Handle obj = object_handle(H5Oopen(loc, name, H5P_DEFAULT));
        if (!obj.valid()) return -1;
        if (info->type == H5O_TYPE_DATASET) {
          Handle type = type_handle(H5Dget_type(obj.get()));
          Handle space = space_handle(H5Dget_space(obj.get()));
          const auto [dtype, mem] = dtype_of(type.get());
          (void)mem;
          o.dtype =
              dtype != DType::kInvalid ? dtype_name(dtype) : describe_type(type.get(), space.get());
          const int rank = H5Sget_simple_extent_ndims(space.get());
          std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
          if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
          o.shape = Shape(std::vector<int64_t>(dims.begin(), dims.end()));
        }
        H5Aiterate2(
            obj.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
            [](hid_t owner, const char* attr_name, const H5A_info_t*, void* out) -> herr_t {
              Handle a = attribute_handle(H5Aopen(owner, attr_name, H5P_DEFAULT));
              Handle t = type_handle(H5Aget_type(a.get()));
              Handle s = space_handle(H5Aget_space(a.get()));
              static_cast<H5ObjectInfo*>(out)->attributes.emplace_back(
                  attr_name, describe_type(t.get(), s.get()));
              return 0;
            },
            &o);
        v->out.push_back(std::move(o));
        return 0;
      },
      &visit);
  if (r < 0) reader.corrupt("cannot list the objects of the file");
  return std::move(visit.out);
}

}  // namespace dtrain::checkpoint
