// The command line of retry-budget-fleet. Flags are absl flags, spelled with '-' or '_'
// (--failure-rate or --failure_rate); parsing is ours so that every command-line error exits
// with kExitUsage and --help with 0, never colliding with the budget-exceeded code.
#ifndef RETRYBUDGET_TOOLS_FLEET_FLEET_FLAGS_H_
#define RETRYBUDGET_TOOLS_FLEET_FLEET_FLAGS_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "tools/fleet/fleet_runner.h"
#include "tools/fleet/worker.h"

namespace retrybudget::fleet {

struct CommandLine {
  bool help = false;
  bool worker_mode = false;            // the hidden --worker
  absl::flat_hash_set<std::string> set = {};  // names (with '_') of the flags given
  std::vector<std::string> server_args = {};  // every --server-arg, in order (repeatable)
  std::vector<std::string> foreign_workers = {};  // every --foreign-workers, in order
};

// Parses argv into the flags. INVALID_ARGUMENT naming the argument for an unknown flag, a bad
// value or a positional argument.
absl::StatusOr<CommandLine> ParseFleetCommandLine(int argc, char** argv);

// The --help text: options, JSON report and exit codes.
std::string FleetUsage();

// The options from the parsed flags (policy fields only when given). INVALID_ARGUMENT for a bad
// --strategy.
absl::StatusOr<FleetOptions> FleetOptionsFromFlags(const CommandLine& command_line);
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags();

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FLEET_FLAGS_H_
