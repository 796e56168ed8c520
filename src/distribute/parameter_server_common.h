// Private to src/distribute: conversions between dtrain values and the messages of
// proto/parameter_server.proto, and the protocol check the parameter-server server and clients
// share (their gRPC settings are in grpc_settings.h). Pure functions; thread-safe.
#pragma once

#include <cstring>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/core/tensor.h"
#include "dtrain/optim/optimizer.h"
#include "parameter_server.grpc.pb.h"

namespace dtrain::distribute::ps_detail {

namespace pb = ::dtrain::ps;

inline void to_proto(const Tensor& t, const std::string& name, pb::TensorProto* out) {
  out->set_name(name);
  out->set_dtype(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) out->add_shape(d);
  out->set_data(static_cast<const char*>(t.raw_data()), t.nbytes());
}

inline Shape shape_of(const google::protobuf::RepeatedField<int64_t>& dims) {
  return Shape(std::vector<int64_t>(dims.begin(), dims.end()));
}

// A tensor of the message's dtype and shape holding its bytes. Throws InvalidArgumentError when
// the byte count does not match (naming `what`).
inline Tensor from_proto(const pb::TensorProto& p, const std::string& what) {
  Tensor t(static_cast<DType>(p.dtype()), shape_of(p.shape()));
  DTRAIN_CHECK(static_cast<size_t>(t.nbytes()) == p.data().size(), what, ": tensor '", p.name(),
               "' of shape ", t.shape().to_string(), " carries ", p.data().size(),
               " bytes, expected ", t.nbytes());
  std::memcpy(t.raw_data(), p.data().data(), p.data().size());
  return t;
}

// Copies the message's bytes into `dst` (same dtype and element count, else
// InvalidArgumentError naming `what`).
inline void copy_into(const pb::TensorProto& p, Tensor& dst, const std::string& what) {
  DTRAIN_CHECK(static_cast<size_t>(dst.nbytes()) == p.data().size() &&
                   p.dtype() == static_cast<int32_t>(dst.dtype()),
               what, ": tensor '", p.name(), "' carries ", p.data().size(), " bytes of dtype ",
               p.dtype(), ", expected ", dst.nbytes(), " bytes of ", dtype_name(dst.dtype()));
  std::memcpy(dst.raw_data(), p.data().data(), p.data().size());
}

inline void to_proto(const optim::OptimizerConfig& c, pb::OptimizerConfigProto* out) {
  out->set_class_name(c.class_name);
  out->set_name(c.name);
  for (const auto& [k, v] : c.hyperparameters) {
    out->add_hyperparameter_keys(k);
    out->add_hyperparameter_values(v);
  }
  if (c.learning_rate_schedule) {
    DTRAIN_CHECK(
        c.learning_rate_schedule->lists.empty() && c.learning_rate_schedule->schedules.empty(),
        "ParameterServerStrategy: learning-rate schedule ", c.learning_rate_schedule->class_name,
        " has list or schedule arguments, which parameter servers do not support");
    out->set_schedule_class(c.learning_rate_schedule->class_name);
    for (const auto& [k, v] : c.learning_rate_schedule->scalars) {
      out->add_schedule_keys(k);
      out->add_schedule_values(v);
    }
  }
}

inline optim::OptimizerConfig from_proto(const pb::OptimizerConfigProto& p) {
  optim::OptimizerConfig c;
  c.class_name = p.class_name();
  c.name = p.name();
  DTRAIN_CHECK(p.hyperparameter_keys_size() == p.hyperparameter_values_size(),
               "ParameterServer: malformed optimizer config");
  for (int i = 0; i < p.hyperparameter_keys_size(); ++i) {
    c.hyperparameters.emplace_back(p.hyperparameter_keys(i), p.hyperparameter_values(i));
  }
  if (!p.schedule_class().empty()) {
    auto s = std::make_shared<optim::ScheduleConfig>();
    s->class_name = p.schedule_class();
    for (int i = 0; i < p.schedule_keys_size() && i < p.schedule_values_size(); ++i) {
      s->scalars.emplace_back(p.schedule_keys(i), p.schedule_values(i));
    }
    c.learning_rate_schedule = std::move(s);
  }
  return c;
}

inline void check_protocol(int32_t protocol, int32_t ours, const char* who) {
  if (protocol != ours) {
    throw FailedPreconditionError(str_cat(who, ": protocol version ", protocol,
                                          " from the peer, this process speaks ", ours,
                                          " (mixed dtrain versions in one job?)"));
  }
}

}  // namespace dtrain::distribute::ps_detail
