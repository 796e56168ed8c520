// Cluster resolution: which worker this process is, how many there are, and where they are,
// from the environment a job manager sets — TF_CONFIG exactly as TensorFlow and Kubeflow's
// TFJob write it, Slurm (srun), Open MPI (mpirun), or dtrain launch (launcher_env.h).
// Pure functions of their inputs; thread-safe.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::distribute {

// Reads one environment variable; nullopt when unset. Lets tests pass a fake environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup process_env();

struct ClusterSpec {
  // Where this came from: "TF_CONFIG", "SLURM", "OMPI", "DTRAIN" (dtrain launch) or "local".
  std::string source = "local";
  // TF's cluster: job name -> task addresses ("host:port"), e.g. {"chief": [...], "worker":
  // [...], "ps": [...], "evaluator": [...]}. Other sources fill "worker" (addresses may be
  // bare hosts or empty when unknown).
  std::map<std::string, std::vector<std::string>> jobs;
  std::string task_type = "worker";  // this process's task: "chief", "worker", "ps", "evaluator"
  int task_index = 0;                // its index in jobs[task_type]

  // Rank among the workers that all-reduce together (TF's id_in_cluster: the chief is 0,
  // worker i is i + 1 when there is a chief, else i), and their number (chief + workers).
  int rank = 0;
  int num_workers = 1;
  // Rank of this process among the workers on its machine (SLURM_LOCALID, ...); 0 if unknown.
  int local_rank = 0;
  // This task's host as the cluster names it ("" when unknown): the address collectives bind.
  std::string host;
  // The workers' addresses indexed by rank (chief first), "" where unknown.
  std::vector<std::string> worker_addresses;
  // Rendezvous named by the environment (DTRAIN_RDZV), "" when none.
  std::string rendezvous;
  // Rendezvous generation and run id named by the environment (dtrain launch), if any.
  std::optional<int64_t> generation;
  std::string run_id;

  // TF's rule: the chief task, or worker 0 when there is no chief; an evaluator is its own chief.
  bool is_chief() const;
  // True for the tasks that take part in all-reduce (chief and workers).
  bool is_worker() const { return task_type == "chief" || task_type == "worker"; }
};

// Parses TF_CONFIG's JSON: {"cluster": {"chief": ["h:p"], "worker": [...], ...},
// "task": {"type": "worker", "index": 1}, ...}. Applies TF's rules: the task type is one of
// chief, worker, ps, evaluator and appears in the cluster; at most one chief and one evaluator;
// the index is in range. Throws InvalidArgumentError naming TF_CONFIG and the problem (bad JSON
// with its position, a missing or mistyped field, an unknown task type, an index out of range,
// two chiefs).
ClusterSpec parse_tf_config(const std::string& json);

// Slurm: SLURM_PROCID (rank), SLURM_NTASKS / SLURM_STEP_NUM_TASKS (size), SLURM_LOCALID,
// SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST (compressed host list, e.g.
// "node[01-03,07],gpu5") and SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1"): tasks
// fill nodes in order, as srun's block distribution places them; task r's address is its node
// and port_base + its index on the node (TF's SlurmClusterResolver). Throws
// InvalidArgumentError naming the variable and the problem.
ClusterSpec resolve_slurm(const EnvLookup& env, int port_base = 8888);
// Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK. Addresses
// are unknown (the rendezvous store exchanges them).
ClusterSpec resolve_mpi(const EnvLookup& env);
// dtrain launch's variables (DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_RDZV, ...).
ClusterSpec resolve_launcher(const EnvLookup& env);

// The first of: dtrain launch (DTRAIN_RANK set), TF_CONFIG (set and non-empty), Open MPI
// (OMPI_COMM_WORLD_RANK set), Slurm (SLURM_PROCID set), else a single local worker. The launcher
// comes first because it sets its variables explicitly for this process; MPI before Slurm
// because mpirun inside a Slurm allocation leaves Slurm's per-step variables describing mpirun.
// DTRAIN_HOST, when set, overrides the host collectives bind. Throws what the chosen parser
// throws.
ClusterSpec resolve_cluster(const EnvLookup& env = process_env());

// Expands a Slurm host list: "n[1-3,5]x,m" -> {"n1x", "n2x", "n3x", "n5x", "m"}; zero padding
// is kept ("n[08-10]" -> n08 n09 n10). Throws InvalidArgumentError naming the list.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

}  // namespace dtrain::distribute
