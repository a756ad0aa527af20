// Workers of other languages in a fleet run (--foreign-workers=LANGUAGE:COUNT:COMMAND): the
// Go, Node and Python programs of the mixed fleet's worker protocol (tools/fleet/README.md, "The
// worker protocol"), started by the tool beside its own C++ workers, on the same tenants, under
// the same faults, their counts judged in the same per-tenant bound.
//
// A foreign worker uses one tenant: foreign worker k (counted over every kind, in the order the
// kinds were given) uses tenant k % tenants, so with COUNT = tenants each tenant gets one worker
// of that language. Its index in the fleet is `workers + k`, its seed `seed + workers + k`.
//
//   absl::StatusOr<ForeignWorkerKind> go = ParseForeignWorkerKind("go:4:/path/go_worker");
//   options.foreign_workers.push_back(*go);
//   for (const ForeignWorker& f : PlanForeignWorkers(options)) Spawn(ForeignWorkerArgv(...));
#ifndef RETRYBUDGET_TOOLS_FLEET_FOREIGN_WORKER_H_
#define RETRYBUDGET_TOOLS_FLEET_FOREIGN_WORKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "tools/fleet/fleet_report.h"

namespace retrybudget::fleet {

// One --foreign-workers flag: COUNT processes of COMMAND (split on spaces; the program is run
// as given, without a PATH search), reported under LANGUAGE.
struct ForeignWorkerKind {
  std::string language = {};
  int count = 0;
  std::vector<std::string> command = {};
};

// Parses LANGUAGE:COUNT:COMMAND. INVALID_ARGUMENT naming --foreign-workers and the value for a
// language that is not [a-z0-9_]+ or is "cpp" (the tool's own workers), a COUNT outside 1-1000
// or an empty COMMAND.
absl::StatusOr<ForeignWorkerKind> ParseForeignWorkerKind(absl::string_view spec);

// What a foreign worker process is given: its place in the fleet and the protocol's flags.
struct ForeignWorker {
  std::string language = {};
  int index = 0;         // in the fleet: after the C++ workers
  int tenant_index = 0;  // k % tenants
  std::vector<std::string> argv = {};
};

// The run's shared parameters every foreign worker gets.
struct ForeignRunParameters {
  std::string target = {};
  std::string tenant = {};  // the base name (FleetTenantName)
  int tenants = 1;
  int cpp_workers = 0;
  int threads = 1;
  double duration_seconds = 0;
  double failure_rate = 0;
  absl::Duration call_latency = absl::ZeroDuration();
  uint64_t seed = 0;
  // The C++ workers' timeline slice (WorkerTimelineSlice): the foreign workers use the same, so
  // that the fleet's timelines add up slice by slice.
  absl::Duration timeline_slice = absl::ZeroDuration();
  // Tokens per retry (--retry-cost) and the paced load's interval (--call-interval): passed
  // only when not the default (1, zero), so a worker without them still runs the default load.
  uint32_t retry_cost = 1;
  absl::Duration call_interval = absl::ZeroDuration();
  // Attempts per call (--max-attempts), passed when > 0 (0: no cap, the protocol's default).
  int max_attempts = 0;
};

// Every foreign worker of `kinds`, in order, with its argv: COMMAND, then --server --tenant
// --threads --duration --failure-rate --call-latency (seconds) --seed --timeline-slice (seconds),
// and --retry-cost / --call-interval (seconds) / --max-attempts when not the default.
std::vector<ForeignWorker> PlanForeignWorkers(const std::vector<ForeignWorkerKind>& kinds,
                                              const ForeignRunParameters& run);

// A foreign worker's one JSON line as the fleet's WorkerCounts (ForeignWorkerCountsFromJson,
// fleet_report.h), checked against its plan and the origin of the start signal it was sent
// (start_signal.h): INVALID_ARGUMENT naming the worker otherwise.
absl::StatusOr<WorkerCounts> ParseForeignWorkerLine(const ForeignWorker& worker,
                                                    absl::string_view line,
                                                    absl::Duration timeline_slice,
                                                    int64_t origin_micros);

// The lines of each language, summed: "cpp" for the workers below `cpp_workers`, then each
// foreign language in the order of first appearance in `foreign`. `counts[i].worker` says whose
// line it is.
std::vector<LanguageRun> SumByLanguage(const std::vector<WorkerCounts>& counts, int cpp_workers,
                                       const std::vector<ForeignWorker>& foreign);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FOREIGN_WORKER_H_
