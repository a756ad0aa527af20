// retry-budget-fleet: see FleetUsage() (fleet_flags.cc) and tools/fleet/README.md.
//
// One binary, two roles: the parent (default) runs the fleet and judges it; started with the
// hidden --worker it is one worker process, which talks to its parent over stdin/stdout:
//   worker -> parent  "ready\n"           flags parsed, process loaded
//   parent -> worker  "go <t0>\n"         the run starts now (the parent has read the level at
//                                         t0, CLOCK_MONOTONIC microseconds: the timelines'
//                                         origin, start_signal.h)
//   worker -> parent  <one JSON line>     its own counts (WorkerCountsToJson), then exit 0
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>

#include "tools/fleet/fleet_flags.h"
#include "tools/fleet/fleet_report.h"
#include "tools/fleet/fleet_runner.h"
#include "tools/fleet/start_signal.h"
#include "tools/fleet/worker.h"

namespace retrybudget::fleet {
namespace {

int WorkerMain(pid_t parent) {
  // A worker never outlives the tool that started it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return kExitRunFailed;

  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "retry-budget-fleet worker: " << options.status() << "\n";
    return kExitUsage;
  }
  std::cout << "ready" << std::endl;
  std::string line;
  if (!std::getline(std::cin, line)) {
    std::cerr << "retry-budget-fleet worker " << options->index << ": no start signal\n";
    return kExitRunFailed;
  }
  absl::StatusOr<std::chrono::steady_clock::time_point> origin =
      ParseStartSignal(line, std::chrono::steady_clock::now());
  if (!origin.ok()) {
    std::cerr << "retry-budget-fleet worker " << options->index << ": " << origin.status()
              << "\n";
    return kExitRunFailed;
  }
  options->timeline_origin = *origin;
  absl::StatusOr<std::vector<WorkerCounts>> counts = RunWorker(*options);
  if (!counts.ok()) {
    std::cerr << "retry-budget-fleet worker " << options->index << ": " << counts.status()
              << "\n";
    return kExitRunFailed;
  }
  for (const WorkerCounts& c : *counts) std::cout << WorkerCountsToJson(c) << "\n";
  std::cout << std::flush;
  return 0;
}

int ParentMain(const CommandLine& command_line) {
  absl::StatusOr<FleetOptions> options = FleetOptionsFromFlags(command_line);
  if (options.ok()) {
    if (absl::Status s = ValidateFleetOptions(*options); !s.ok()) options = s;
  }
  if (!options.ok()) {
    std::cerr << "retry-budget-fleet: " << options.status().message() << "\n";
    return kExitUsage;
  }
  absl::StatusOr<FleetRun> run = RunFleet(*options);
  if (!run.ok()) {
    std::cerr << "retry-budget-fleet: run failed: " << run.status() << "\n";
    return kExitRunFailed;
  }
  const Verdict verdict = Judge(*run);
  std::cout << FleetReportToJson(*run, verdict) << std::endl;
  if (!verdict.within_budget) {
    std::cerr << "retry-budget-fleet: BUDGET EXCEEDED: " << run->totals.retries_allowed
              << " retries allowed > bound " << verdict.bound << "\n";
  }
  return ExitCodeFor(verdict);
}

}  // namespace
}  // namespace retrybudget::fleet

int main(int argc, char** argv) {
  using namespace retrybudget::fleet;
  const pid_t parent = getppid();
  absl::StatusOr<CommandLine> command_line = ParseFleetCommandLine(argc, argv);
  if (!command_line.ok()) {
    std::cerr << "retry-budget-fleet: " << command_line.status().message() << "\n";
    return kExitUsage;
  }
  if (command_line->help) {
    std::cout << FleetUsage();
    return 0;
  }
  if (command_line->worker_mode) return WorkerMain(parent);
  return ParentMain(*command_line);
}
