// How many CPUs this process may use: its affinity mask (taskset, cpuset), capped by the CPU
// quota of its control groups (docker --cpus, a Kubernetes CPU limit, systemd's CPUQuota=).
// std::thread::hardware_concurrency() counts the host's CPUs, so a container limited to 2 CPUs
// of a 64-core host would start 64 kernel threads that the quota then throttles; dtrain's
// defaults (the kernels' threads, MirroredStrategy's replicas, whether a CPU is free for the
// snapshots' commits) use usable_cpus() instead, as Go and the JVM do.
//
//   int n = dtrain::usable_cpus();   // e.g. 2 under `docker run --cpus 1.5` on a 64-core host
#pragma once

#include <optional>
#include <string>

namespace dtrain {

// CPUs this process may run on (sched_getaffinity), capped by the cgroup CPU quota rounded up;
// at least 1. Read once per process and cached.
int usable_cpus();

// The CPU quota of the process's cgroups in CPUs (quota ÷ period), the smallest along each
// hierarchy's path from the process's group up to the hierarchy's mount (cgroup v2 `cpu.max`,
// v1 `cpu.cfs_quota_us` ÷ `cpu.cfs_period_us`); nullopt when none is set or none can be read.
// `proc` is where /proc/self's `cgroup` and `mountinfo` are read; tests give a directory laid out
// like them, with the mount points it names.
std::optional<double> cgroup_cpu_quota(const std::string& proc = "/proc/self");

}  // namespace dtrain
