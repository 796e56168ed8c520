// The thread's current strategy (strategy.scope()).
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {
namespace {
thread_local Strategy* t_current = nullptr;
}

Strategy::ScopeGuard::ScopeGuard(Strategy* s) : previous_(t_current) { t_current = s; }
Strategy::ScopeGuard::~ScopeGuard() { t_current = previous_; }

Strategy* current_strategy() { return t_current; }

}  // namespace dtrain::distribute
