// embedding_lookup: forward through ops::embedding_lookup, backward a scatter-add of rows.
#include "dtrain/autograd/embedding.h"

#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/ops/embedding.h"
#include "tape.h"

namespace dtrain {
namespace {

// out[p] = table[ids[p]]; saved ids; i[0] = vocab. d table = Σ_p onehot(ids[p]) ⊗ g[p].
void embedding_backward(detail::Tape& t, const detail::Node& n, Tensor g) {
  t.accumulate(n.in[0], ops::embedding_gradient(g, n.saved[0], n.i[0]));
}

}  // namespace

Tensor embedding_lookup(const Tensor& table, const Tensor& ids, const std::string& who) {
  Tensor out = ops::embedding_lookup(table, ids, who);
  detail::Tape* t = detail::Tape::current();
  if (t == nullptr || t->node_of(table) < 0) return out;
  detail::Node& n = t->record(embedding_backward, out, t->node_of(table));
  n.saved[0] = stop_gradient(ids);
  n.i[0] = table.dim(0);
  return out;
}

}  // namespace dtrain
