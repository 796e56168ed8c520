// stateful_layers: the walk over a model's sub-layers.
#include "dtrain/nn/state_updates.h"

#include <algorithm>

#include "dtrain/nn/model.h"

namespace dtrain::nn {
namespace {

void collect(Layer& layer, std::vector<StatefulLayer*>& out) {
  if (auto* s = dynamic_cast<StatefulLayer*>(&layer); s != nullptr && layer.built()) {
    // A layer tracked twice is updated once.
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  if (auto* m = dynamic_cast<Model*>(&layer)) {
    for (const auto& sub : m->layers()) collect(*sub, out);
  }
}

}  // namespace

std::vector<StatefulLayer*> stateful_layers(Layer& layer) {
  std::vector<StatefulLayer*> out;
  collect(layer, out);
  return out;
}

}  // namespace dtrain::nn
