// Keras initializers over Philox.
#include "dtrain/nn/initializers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "dtrain/core/random.h"
#include "json_text.h"

namespace dtrain::nn {
namespace {

using json = nlohmann::json;

// Keras's _compute_fans: for a kernel [fan_in, fan_out]; receptive fields for higher ranks.
void compute_fans(const Shape& s, double& fan_in, double& fan_out) {
  if (s.rank() < 1) {
    fan_in = fan_out = 1;
  } else if (s.rank() == 1) {
    fan_in = fan_out = static_cast<double>(s[0]);
  } else if (s.rank() == 2) {
    fan_in = static_cast<double>(s[0]);
    fan_out = static_cast<double>(s[1]);
  } else {
    double receptive = 1;
    for (int i = 0; i < s.rank() - 2; ++i) receptive *= static_cast<double>(s[i]);
    fan_in = static_cast<double>(s[s.rank() - 2]) * receptive;
    fan_out = static_cast<double>(s[s.rank() - 1]) * receptive;
  }
}

class Constant : public Initializer {
 public:
  Constant(float value, std::string class_name)
      : value_(value), class_name_(std::move(class_name)) {}
  Tensor operator()(const Shape& shape) override { return Tensor::full(shape, value_); }
  std::string class_name() const override { return class_name_; }
  std::string config_json() const override {
    if (class_name_ == "Constant") return json{{"value", value_}}.dump();
    return "{}";
  }

 private:
  float value_;
  std::string class_name_;
};

enum class Distribution { kUniform, kTruncatedNormal, kNormal };
enum class Mode { kFanIn, kFanOut, kFanAvg };

// keras.initializers.VarianceScaling and its named special cases.
class VarianceScaling : public Initializer {
 public:
  VarianceScaling(std::string class_name, double scale, Mode mode, Distribution dist,
                  std::optional<uint64_t> seed)
      : class_name_(std::move(class_name)),
        scale_(scale),
        mode_(mode),
        dist_(dist),
        explicit_seed_(seed),
        rng_(seed ? *seed : next_seed()) {}

  Tensor operator()(const Shape& shape) override {
    double fan_in, fan_out;
    compute_fans(shape, fan_in, fan_out);
    const double denom = mode_ == Mode::kFanIn    ? fan_in
                         : mode_ == Mode::kFanOut ? fan_out
                                                  : (fan_in + fan_out) / 2.0;
    const double variance = scale_ / std::max(1.0, denom);
    Tensor t(shape);
    float* p = t.data<float>();
    const int64_t n = t.num_elements();
    switch (dist_) {
      case Distribution::kUniform: {
        const float limit = static_cast<float>(std::sqrt(3.0 * variance));
        for (int64_t i = 0; i < n; ++i) p[i] = rng_.uniform(-limit, limit);
        break;
      }
      case Distribution::kTruncatedNormal: {
        // Constant from Keras: stddev of a unit normal truncated to [-2, 2].
        const float stddev = static_cast<float>(std::sqrt(variance) / 0.87962566103423978);
        for (int64_t i = 0; i < n; ++i) p[i] = truncated_normal() * stddev;
        break;
      }
      case Distribution::kNormal: {
        const float stddev = static_cast<float>(std::sqrt(variance));
        for (int64_t i = 0; i < n; ++i) p[i] = rng_.normal() * stddev;
        break;
      }
    }
    return t;
  }
  std::string class_name() const override { return class_name_; }
  std::string config_json() const override {
    json c;
    c["seed"] = explicit_seed_ ? json(*explicit_seed_) : json(nullptr);
    if (class_name_ == "VarianceScaling") {
      c["scale"] = scale_;
      c["mode"] = mode_ == Mode::kFanIn ? "fan_in" : mode_ == Mode::kFanOut ? "fan_out" : "fan_avg";
      c["distribution"] = dist_ == Distribution::kUniform  ? "uniform"
                          : dist_ == Distribution::kNormal ? "untruncated_normal"
                                                           : "truncated_normal";
    }
    return c.dump();
  }

 private:
  float truncated_normal() {
    for (;;) {
      const float z = rng_.normal();
      if (std::fabs(z) <= 2.0f) return z;
    }
  }

  std::string class_name_;
  double scale_;
  Mode mode_;
  Distribution dist_;
  std::optional<uint64_t> explicit_seed_;
  Philox rng_;
};

class RandomDistribution : public Initializer {
 public:
  RandomDistribution(std::string class_name, float a, float b, std::optional<uint64_t> seed)
      : class_name_(std::move(class_name)),
        a_(a),
        b_(b),
        explicit_seed_(seed),
        rng_(seed ? *seed : next_seed()) {}
  Tensor operator()(const Shape& shape) override {
    Tensor t(shape);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      if (class_name_ == "RandomUniform") {
        p[i] = rng_.uniform(a_, b_);
      } else if (class_name_ == "RandomNormal") {
        p[i] = a_ + b_ * rng_.normal();
      } else {
        float z;
        do {
          z = rng_.normal();
        } while (std::fabs(z) > 2.0f);
        p[i] = a_ + b_ * z;
      }
    }
    return t;
  }
  std::string class_name() const override { return class_name_; }
  std::string config_json() const override {
    json c;
    if (class_name_ == "RandomUniform") {
      c["minval"] = a_;
      c["maxval"] = b_;
    } else {
      c["mean"] = a_;
      c["stddev"] = b_;
    }
    c["seed"] = explicit_seed_ ? json(*explicit_seed_) : json(nullptr);
    return c.dump();
  }

 private:
  std::string class_name_;
  float a_, b_;
  std::optional<uint64_t> explicit_seed_;
  Philox rng_;
};

// keras.initializers.Orthogonal: the Q of a QR decomposition of a normal matrix (signs fixed
// so R has a positive diagonal, which modified Gram-Schmidt gives directly), times the gain.
// Shape [..., cols] is treated as [rows = Π leading, cols].
class Orthogonal : public Initializer {
 public:
  Orthogonal(float gain, std::optional<uint64_t> seed)
      : gain_(gain), explicit_seed_(seed), rng_(seed ? *seed : next_seed()) {}
  Tensor operator()(const Shape& shape) override {
    DTRAIN_CHECK(shape.rank() >= 2, "Orthogonal: needs a shape of rank >= 2, got ",
                 shape.to_string());
    const int64_t cols = shape[shape.rank() - 1], rows = shape.num_elements() / cols;
    const int64_t m = std::max(rows, cols), n = std::min(rows, cols);
    std::vector<double> a(static_cast<size_t>(m * n));  // column-major: column k at a[k·m]
    for (auto& v : a) v = rng_.normal();
    for (int64_t k = 0; k < n; ++k) {
      double* ck = a.data() + k * m;
      for (int64_t j = 0; j < k; ++j) {
        const double* cj = a.data() + j * m;
        double dot = 0;
        for (int64_t i = 0; i < m; ++i) dot += cj[i] * ck[i];
        for (int64_t i = 0; i < m; ++i) ck[i] -= dot * cj[i];
      }
      double norm = 0;
      for (int64_t i = 0; i < m; ++i) norm += ck[i] * ck[i];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < m; ++i) ck[i] /= norm;
    }
    Tensor t(shape);
    float* p = t.data<float>();
    // q is [m, n]; the result [rows, cols] is q (rows >= cols) or qᵀ.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const double q = rows >= cols ? a[c * m + r] : a[r * m + c];
        p[r * cols + c] = static_cast<float>(gain_ * q);
      }
    }
    return t;
  }
  std::string class_name() const override { return "Orthogonal"; }
  std::string config_json() const override {
    json c;
    c["gain"] = gain_;
    c["seed"] = explicit_seed_ ? json(*explicit_seed_) : json(nullptr);
    return c.dump();
  }

 private:
  float gain_;
  std::optional<uint64_t> explicit_seed_;
  Philox rng_;
};

std::string normalize(const std::string& name) {
  // "GlorotUniform" → "glorot_uniform"; already snake_case names pass through.
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (i > 0 && name[i - 1] != '_') out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::shared_ptr<Initializer> initializer_from_name(const std::string& name,
                                                   std::optional<uint64_t> seed) {
  const std::string n = normalize(name);
  if (n == "zeros" || n == "zero") return std::make_shared<Constant>(0.0f, "Zeros");
  if (n == "ones" || n == "one") return std::make_shared<Constant>(1.0f, "Ones");
  if (n == "glorot_uniform") {
    return std::make_shared<VarianceScaling>("GlorotUniform", 1.0, Mode::kFanAvg,
                                             Distribution::kUniform, seed);
  }
  if (n == "glorot_normal") {
    return std::make_shared<VarianceScaling>("GlorotNormal", 1.0, Mode::kFanAvg,
                                             Distribution::kTruncatedNormal, seed);
  }
  if (n == "he_normal") {
    return std::make_shared<VarianceScaling>("HeNormal", 2.0, Mode::kFanIn,
                                             Distribution::kTruncatedNormal, seed);
  }
  if (n == "he_uniform") {
    return std::make_shared<VarianceScaling>("HeUniform", 2.0, Mode::kFanIn, Distribution::kUniform,
                                             seed);
  }
  if (n == "lecun_normal") {
    return std::make_shared<VarianceScaling>("LecunNormal", 1.0, Mode::kFanIn,
                                             Distribution::kTruncatedNormal, seed);
  }
  if (n == "lecun_uniform") {
    return std::make_shared<VarianceScaling>("LecunUniform", 1.0, Mode::kFanIn,
                                             Distribution::kUniform, seed);
  }
  if (n == "random_uniform" || n == "uniform")  // "uniform": Keras's alias (Embedding's default)
    return std::make_shared<RandomDistribution>("RandomUniform", -0.05f, 0.05f, seed);
  if (n == "orthogonal") return std::make_shared<Orthogonal>(1.0f, seed);
  if (n == "random_normal")
    return std::make_shared<RandomDistribution>("RandomNormal", 0.0f, 0.05f, seed);
  if (n == "truncated_normal") {
    return std::make_shared<RandomDistribution>("TruncatedNormal", 0.0f, 0.05f, seed);
  }
  throw InvalidArgumentError(
      "unknown initializer '" + name +
      "' (known: glorot_uniform, glorot_normal, he_normal, he_uniform, lecun_normal, "
      "lecun_uniform, zeros, ones, orthogonal, random_normal, random_uniform, uniform, "
      "truncated_normal)");
}

namespace {

// initializer_from_json after the parse (`text` for the messages).
std::shared_ptr<Initializer> initializer_from_parsed(const json& j, const std::string& text) {
  if (j.is_string()) return initializer_from_name(j.get<std::string>());
  DTRAIN_CHECK(j.is_object() && j.contains("class_name"),
               "initializer config: expected {\"class_name\": ..., \"config\": ...}, got ", text);
  const std::string cls = j["class_name"].get<std::string>();
  const json cfg = j.value("config", json::object());
  std::optional<uint64_t> seed;
  if (cfg.contains("seed") && cfg["seed"].is_number_integer()) seed = cfg["seed"].get<uint64_t>();
  if (cls == "Constant") return constant_initializer(cfg.value("value", 0.0f));
  if (cls == "Orthogonal") return std::make_shared<Orthogonal>(cfg.value("gain", 1.0f), seed);
  if (cls == "RandomUniform") {
    return std::make_shared<RandomDistribution>("RandomUniform", cfg.value("minval", -0.05f),
                                                cfg.value("maxval", 0.05f), seed);
  }
  if (cls == "RandomNormal" || cls == "TruncatedNormal") {
    return std::make_shared<RandomDistribution>(cls, cfg.value("mean", 0.0f),
                                                cfg.value("stddev", 0.05f), seed);
  }
  if (cls == "VarianceScaling") {
    const std::string mode = cfg.value("mode", "fan_in");
    const std::string dist = cfg.value("distribution", "truncated_normal");
    return std::make_shared<VarianceScaling>("VarianceScaling", cfg.value("scale", 1.0),
                                             mode == "fan_in"    ? Mode::kFanIn
                                             : mode == "fan_out" ? Mode::kFanOut
                                                                 : Mode::kFanAvg,
                                             dist == "uniform" ? Distribution::kUniform
                                             : (dist == "untruncated_normal" || dist == "normal")
                                                 ? Distribution::kNormal
                                                 : Distribution::kTruncatedNormal,
                                             seed);
  }
  return initializer_from_name(cls, seed);
}

}  // namespace

std::shared_ptr<Initializer> initializer_from_json(const std::string& text) {
  return detail::from_json_text(text, "initializer config", [&text](const json& j) {
    return initializer_from_parsed(j, text);
  });
}

std::shared_ptr<Initializer> constant_initializer(float value) {
  return std::make_shared<Constant>(value, "Constant");
}

}  // namespace dtrain::nn
