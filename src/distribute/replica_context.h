// Private: strategies mark their replica threads so current_local_replica() can answer.
#pragma once

namespace dtrain::distribute {

// Sets what current_local_replica() returns on the calling thread (-1: not a replica).
void set_current_local_replica(int replica);

}  // namespace dtrain::distribute
