// Sub-commands of the dtrain binary (private to src/cli). Each registers its options on a CLI11
// sub-app and returns the function that runs it.
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace dtrain::cli {

// fit / evaluate / predict over Fashion-MNIST, IDX or CSV data.
void add_train_commands(CLI::App& app, std::function<int()>& run);
// ckpt ls/inspect/verify/diff/convert: checkpoint tools (src/cli/ckpt.cc, docs/checkpoint-cli.md).
void add_ckpt_command(CLI::App& app, std::function<int()>& run);
// events: dump TensorBoard event files (src/cli/events.cc).
void add_events_command(CLI::App& app, std::function<int()>& run);
// launch: start a job's worker processes on this node, like torchrun (src/cli/launch.cc).
void add_launch_command(CLI::App& app, std::function<int()>& run);
// generate: continue a prompt with a saved language model (src/cli/generate.cc).
void add_generate_command(CLI::App& app, std::function<int()>& run);
// ps: run a parameter server for ParameterServerStrategy (src/cli/ps.cc).
void add_ps_command(CLI::App& app, std::function<int()>& run);

}  // namespace dtrain::cli
