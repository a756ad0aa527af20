#include "tools/fleet/foreign_worker.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace retrybudget::fleet {
namespace {

bool IsLanguageName(absl::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_';
  });
}

}  // namespace

absl::StatusOr<ForeignWorkerKind> ParseForeignWorkerKind(absl::string_view spec) {
  auto bad = [spec](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--foreign-workers: '", spec, "': ", why,
                     " (LANGUAGE:COUNT:COMMAND, e.g. go:2:/path/go_worker)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(spec, absl::MaxSplits(':', 2));
  if (parts.size() != 3) return bad("not LANGUAGE:COUNT:COMMAND");
  ForeignWorkerKind kind;
  kind.language = std::string(parts[0]);
  if (!IsLanguageName(kind.language)) return bad("the language must be [a-z0-9_]+");
  if (kind.language == "cpp") return bad("'cpp' names the tool's own workers (--workers)");
  if (!absl::SimpleAtoi(parts[1], &kind.count) || kind.count < 1 || kind.count > 1000) {
    return bad("COUNT must be 1-1000");
  }
  for (absl::string_view word : absl::StrSplit(parts[2], ' ', absl::SkipEmpty())) {
    kind.command.emplace_back(word);
  }
  if (kind.command.empty()) return bad("COMMAND is empty");
  return kind;
}

std::vector<ForeignWorker> PlanForeignWorkers(const std::vector<ForeignWorkerKind>& kinds,
                                              const ForeignRunParameters& run) {
  std::vector<ForeignWorker> plan;
  int k = 0;
  for (const ForeignWorkerKind& kind : kinds) {
    for (int i = 0; i < kind.count; ++i, ++k) {
      ForeignWorker w;
      w.language = kind.language;
      w.index = run.cpp_workers + k;
      w.tenant_index = run.tenants > 1 ? k % run.tenants : 0;
      w.argv = kind.command;
      w.argv.push_back(absl::StrCat("--server=", run.target));
      w.argv.push_back(
          absl::StrCat("--tenant=", FleetTenantName(run.tenant, run.tenants, w.tenant_index)));
      w.argv.push_back(absl::StrCat("--threads=", run.threads));
      w.argv.push_back(absl::StrFormat("--duration=%.15g", run.duration_seconds));
      w.argv.push_back(absl::StrFormat("--failure-rate=%.15g", run.failure_rate));
      w.argv.push_back(absl::StrFormat("--call-latency=%.15g",
                                       absl::ToDoubleSeconds(run.call_latency)));
      w.argv.push_back(absl::StrCat("--seed=", run.seed + static_cast<uint64_t>(w.index)));
      w.argv.push_back(absl::StrFormat("--timeline-slice=%.15g",
                                       absl::ToDoubleSeconds(run.timeline_slice)));
      if (run.retry_cost != 1) w.argv.push_back(absl::StrCat("--retry-cost=", run.retry_cost));
      if (run.call_interval > absl::ZeroDuration()) {
        w.argv.push_back(absl::StrFormat("--call-interval=%.15g",
                                         absl::ToDoubleSeconds(run.call_interval)));
      }
      if (run.max_attempts > 0) {
        w.argv.push_back(absl::StrCat("--max-attempts=", run.max_attempts));
      }
      plan.push_back(std::move(w));
    }
  }
  return plan;
}

absl::StatusOr<WorkerCounts> ParseForeignWorkerLine(const ForeignWorker& worker,
                                                    absl::string_view line,
                                                    absl::Duration timeline_slice,
                                                    int64_t origin_micros) {
  absl::StatusOr<WorkerCounts> counts =
      ForeignWorkerCountsFromJson(line, worker.index, worker.tenant_index,
                                  absl::ToDoubleSeconds(timeline_slice), origin_micros);
  if (!counts.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(worker.language, " worker ", worker.index,
                                                   ": ", counts.status().message()));
  }
  return counts;
}

std::vector<LanguageRun> SumByLanguage(const std::vector<WorkerCounts>& counts, int cpp_workers,
                                       const std::vector<ForeignWorker>& foreign) {
  std::vector<std::string> order = {"cpp"};
  std::vector<std::string> language_of(static_cast<size_t>(cpp_workers), "cpp");
  for (const ForeignWorker& f : foreign) {
    if (std::find(order.begin(), order.end(), f.language) == order.end()) {
      order.push_back(f.language);
    }
    if (language_of.size() <= static_cast<size_t>(f.index)) {
      language_of.resize(static_cast<size_t>(f.index) + 1);
    }
    language_of[static_cast<size_t>(f.index)] = f.language;
  }
  std::vector<LanguageRun> out;
  for (const std::string& language : order) {
    std::vector<WorkerCounts> lines;
    int workers = 0;
    for (size_t w = 0; w < language_of.size(); ++w) workers += language_of[w] == language;
    for (const WorkerCounts& c : counts) {
      if (c.worker >= 0 && static_cast<size_t>(c.worker) < language_of.size() &&
          language_of[static_cast<size_t>(c.worker)] == language) {
        lines.push_back(c);
      }
    }
    out.push_back({.language = language, .workers = workers, .totals = SumWorkers(lines)});
  }
  return out;
}

}  // namespace retrybudget::fleet
