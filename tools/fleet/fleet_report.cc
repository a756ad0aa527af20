#include "tools/fleet/fleet_report.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tools/fleet/json_writer.h"

namespace retrybudget::fleet {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// The error of a field of a worker line that is not what it must be.
absl::Status MustBe(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("worker line: field '", field, "' must be ", what));
}

// The value of `field` when it is there and of `kind`; null otherwise.
const Value* FieldOfKind(const Struct& s, absl::string_view field, Value::KindCase kind) {
  auto it = s.fields().find(std::string(field));
  return it == s.fields().end() || it->second.kind_case() != kind ? nullptr : &it->second;
}

// A whole, non-negative number, exact as a double (below 2^53).
bool IsCount(const Value& v) {
  return v.kind_case() == Value::kNumberValue && v.number_value() >= 0 &&
         v.number_value() == std::floor(v.number_value()) && v.number_value() <= 9.007e15;
}

// Reads a JSON number that must be a whole, non-negative count (exact below 2^53).
absl::Status ReadCount(const Struct& s, absl::string_view field, uint64_t* out) {
  auto it = s.fields().find(std::string(field));
  if (it == s.fields().end()) {
    return absl::InvalidArgumentError(absl::StrCat("worker line: missing field '", field, "'"));
  }
  const Value& v = it->second;
  if (!IsCount(v)) return MustBe(field, absl::StrCat("a whole count, got ", v.ShortDebugString()));
  *out = static_cast<uint64_t>(v.number_value());
  return absl::OkStatus();
}

absl::Status ReadSigned(const Struct& s, absl::string_view field, int64_t* out) {
  const Value* v = FieldOfKind(s, field, Value::kNumberValue);
  if (v == nullptr || v->number_value() != std::floor(v->number_value())) {
    return MustBe(field, "a whole number");
  }
  *out = static_cast<int64_t>(v->number_value());
  return absl::OkStatus();
}

absl::Status ReadDouble(const Struct& s, absl::string_view field, double* out) {
  const Value* v = FieldOfKind(s, field, Value::kNumberValue);
  if (v == nullptr) return MustBe(field, "a number");
  *out = v->number_value();
  return absl::OkStatus();
}

absl::Status ReadString(const Struct& s, absl::string_view field, std::string* out) {
  const Value* v = FieldOfKind(s, field, Value::kStringValue);
  if (v == nullptr) return MustBe(field, "a string");
  *out = v->string_value();
  return absl::OkStatus();
}

absl::Status ReadBool(const Struct& s, absl::string_view field, bool* out) {
  const Value* v = FieldOfKind(s, field, Value::kBoolValue);
  if (v == nullptr) return MustBe(field, "true or false");
  *out = v->bool_value();
  return absl::OkStatus();
}

absl::Status ReadCountArray(const Struct& s, absl::string_view field, std::vector<uint64_t>* out) {
  const Value* list = FieldOfKind(s, field, Value::kListValue);
  if (list == nullptr) return MustBe(field, "an array of counts");
  out->clear();
  for (const Value& v : list->list_value().values()) {
    if (!IsCount(v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker line: field '", field, "' holds a non-count ", v.ShortDebugString()));
    }
    out->push_back(static_cast<uint64_t>(v.number_value()));
  }
  return absl::OkStatus();
}

// A worker line as a JSON object.
absl::StatusOr<Struct> ParseObject(absl::string_view line) {
  Struct s;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(line.data(), line.size()), &s);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker line is not a JSON object (", parsed.ToString(), "): ",
                     line.substr(0, 200)));
  }
  return s;
}

void AddInto(std::vector<uint64_t>& sum, const std::vector<uint64_t>& add) {
  if (sum.size() < add.size()) sum.resize(add.size(), 0);
  for (size_t i = 0; i < add.size(); ++i) sum[i] += add[i];
}

void MaxInto(std::vector<uint64_t>& max, const std::vector<uint64_t>& of) {
  if (max.size() < of.size()) max.resize(of.size(), 0);
  for (size_t i = 0; i < of.size(); ++i) max[i] = std::max(max[i], of[i]);
}

// The fields of the worker protocol a worker may leave out (the cost, requests and shadow of
// issue 36): an absent one keeps what `c` holds; a present one must be well formed.
absl::Status ReadOptionalFields(const Struct& s, WorkerCounts& c) {
  auto has = [&s](absl::string_view field) { return s.fields().contains(std::string(field)); };
  for (auto [field, out] : {std::pair<const char*, uint64_t*>{"requests", &c.requests},
                            {"tokens_spent", &c.tokens_spent},
                            {"lib_requests", &c.lib_requests},
                            {"lib_shadow_denied", &c.lib_shadow_denied}}) {
    if (!has(field)) continue;
    if (absl::Status st = ReadCount(s, field, out); !st.ok()) return st;
  }
  for (auto [field, out] :
       {std::pair<const char*, std::vector<uint64_t>*>{"requests_timeline", &c.requests_timeline},
        {"tokens_timeline", &c.tokens_timeline},
        {"mode_changes_ms", &c.mode_changes_ms}}) {
    if (!has(field)) continue;
    if (absl::Status st = ReadCountArray(s, field, out); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

WorkerCounts SumWorkers(const std::vector<WorkerCounts>& workers) {
  WorkerCounts sum;
  sum.worker = static_cast<int>(workers.size());
  sum.shutdown_status = "OK";
  for (const WorkerCounts& w : workers) {
    ForEachWorkerField(sum, w, [&w](absl::string_view, Combine combine, auto& total,
                                    const auto& value) {
      using T = std::decay_t<decltype(total)>;
      if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
        if (combine == Combine::kMaxEach) {
          MaxInto(total, value);
        } else {
          AddInto(total, value);
        }
      } else if constexpr (std::is_same_v<T, std::string>) {
        if (combine == Combine::kFirstError && total == "OK" && value != "OK") {
          total = absl::StrCat("worker ", w.worker, ": ", value);
        }
      } else {
        if (combine == Combine::kSum) total += value;
        if (combine == Combine::kMax) total = std::max(total, value);
      }
    });
  }
  return sum;
}

std::string WorkerCountsToJson(const WorkerCounts& c) {
  JsonWriter w;
  ForEachWorkerField(c, c, [&w](absl::string_view name, Combine, const auto& value,
                                const auto&) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
      w.Counts(name, value);
    } else if constexpr (std::is_same_v<T, std::string>) {
      w.String(name, value);
    } else {
      w.Number(name, value);
    }
  });
  return w.Finish();
}

absl::StatusOr<WorkerCounts> WorkerCountsFromJson(absl::string_view line) {
  absl::StatusOr<Struct> parsed = ParseObject(line);
  if (!parsed.ok()) return parsed.status();
  const Struct& s = *parsed;
  WorkerCounts c;
  absl::Status status;
  ForEachWorkerField(c, c, [&](absl::string_view name, Combine, auto& out, auto&) {
    if (!status.ok()) return;
    using T = std::decay_t<decltype(out)>;
    if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
      status = ReadCountArray(s, name, &out);
    } else if constexpr (std::is_same_v<T, std::string>) {
      status = ReadString(s, name, &out);
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      status = ReadCount(s, name, &out);
    } else if constexpr (std::is_same_v<T, double>) {
      status = ReadDouble(s, name, &out);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      status = ReadSigned(s, name, &out);
    } else {
      static_assert(std::is_same_v<T, int>, "a WorkerCounts field of an unhandled type");
      int64_t value = 0;
      status = ReadSigned(s, name, &value);
      out = static_cast<int>(value);
    }
  });
  if (!status.ok()) return status;
  return c;
}

absl::StatusOr<WorkerCounts> ForeignWorkerCountsFromJson(absl::string_view line, int worker,
                                                         int tenant_index, double slice_seconds,
                                                         std::optional<int64_t> origin_micros) {
  absl::StatusOr<Struct> parsed = ParseObject(line);
  if (!parsed.ok()) return parsed.status();
  const Struct& s = *parsed;
  WorkerCounts c;
  c.worker = worker;
  c.tenant_index = tenant_index;
  bool lease_after_fallback = false;
  for (absl::Status status : {
           ReadCount(s, "calls", &c.calls),
           ReadCount(s, "attempts", &c.attempts),
           ReadCount(s, "successes", &c.successes),
           ReadCount(s, "failures", &c.failures),
           ReadCount(s, "retries_allowed", &c.retries_allowed),
           ReadCount(s, "retries_denied", &c.retries_denied),
           ReadCount(s, "lib_retries_allowed", &c.lib_retries_allowed),
           ReadCount(s, "lib_fallback_allowed", &c.lib_fallback_allowed),
           ReadSigned(s, "lib_tokens_held", &c.lib_tokens_held),
           ReadCount(s, "lib_successes_credited_locally", &c.lib_successes_credited_locally),
           ReadDouble(s, "fallback_allowance", &c.fallback_allowance),
           ReadBool(s, "lease_after_fallback", &lease_after_fallback),
           ReadString(s, "shutdown_status", &c.shutdown_status),
           ReadDouble(s, "max_try_acquire_ms", &c.max_try_acquire_ms),
           ReadDouble(s, "timeline_slice_seconds", &c.timeline_slice_seconds),
           ReadCountArray(s, "calls_timeline", &c.calls_timeline),
           ReadCountArray(s, "retries_timeline", &c.retries_timeline),
           ReadCountArray(s, "denied_timeline", &c.denied_timeline),
           ReadCountArray(s, "successes_timeline", &c.successes_timeline),
       }) {
    if (!status.ok()) return status;
  }
  c.lease_after_fallback = lease_after_fallback ? 1 : 0;
  // A worker that reports no cost spends 1 token per retry, counted at its call's start.
  c.tokens_spent = c.retries_allowed;
  c.tokens_timeline = c.retries_timeline;
  if (absl::Status st = ReadOptionalFields(s, c); !st.ok()) return st;
  if (!(c.fallback_allowance >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker line: field 'fallback_allowance' must be >= 0, got ", c.fallback_allowance));
  }
  if (std::fabs(c.timeline_slice_seconds - slice_seconds) > 1e-6 * slice_seconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker line: field 'timeline_slice_seconds' is ", c.timeline_slice_seconds,
                     ", the fleet's slice is ", slice_seconds));
  }
  if (origin_micros.has_value()) {
    int64_t origin = 0;
    if (absl::Status st = ReadSigned(s, "timeline_origin_us", &origin); !st.ok()) return st;
    if (origin != *origin_micros) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker line: field 'timeline_origin_us' is ", origin, ", the start signal's is ",
          *origin_micros, " (the worker did not count its timelines from the fleet's start)"));
    }
  }
  return c;
}

double BudgetBound(const PolicyView& policy, double elapsed_seconds, uint64_t successes) {
  return policy.initial_tokens + policy.refill_per_second * elapsed_seconds +
         policy.success_credit * static_cast<double>(successes);
}

std::string FleetTenantName(absl::string_view base, int count, int index) {
  if (count <= 1) return std::string(base);
  return absl::StrCat(base, "-", index);
}

int FleetTenantOfThread(int worker, int threads, int thread, int count) {
  if (count <= 1) return 0;
  return (worker * threads + thread) % count;
}

namespace {

// spent / of; +inf when `of` is 0 and something was spent (printed as null).
double Ratio(double spent, double of) {
  if (of > 0) return spent / of;
  return spent == 0 ? 0 : std::numeric_limits<double>::infinity();
}

}  // namespace

double IdealAllowed(const PolicyView& policy, double elapsed_seconds,
                    const WorkerCounts& totals, uint32_t retry_cost) {
  const double cost = std::max<double>(1, retry_cost);
  const double slice = totals.timeline_slice_seconds;
  double level = std::min(policy.initial_tokens, policy.capacity);
  double allowed = 0;
  const size_t n = std::max({totals.retries_timeline.size(), totals.denied_timeline.size(),
                             totals.successes_timeline.size()});
  auto at = [](const std::vector<uint64_t>& v, size_t i) -> double {
    return i < v.size() ? static_cast<double>(v[i]) : 0.0;
  };
  // Every worker's timeline counts from the run's start (start_signal.h), so the time before a
  // worker's first call is in the timeline (empty slices). The refill outside it (the end after
  // the last call's slice) is given to the bucket up front: the ideal never loses refill to
  // timing.
  const double outside = std::max(0.0, elapsed_seconds - slice * static_cast<double>(n));
  level = std::min(policy.capacity, level + policy.refill_per_second * outside);
  for (size_t i = 0; i < n; ++i) {
    // Slice i is [i, i + 1) slices from the run's start; the last one may end after the run
    // did (every call started before its end): only its part inside the run refills.
    const double inside =
        std::clamp(elapsed_seconds - slice * static_cast<double>(i), 0.0, slice);
    const double available = level + policy.refill_per_second * inside +
                             policy.success_credit * at(totals.successes_timeline, i);
    const double demand =
        cost * (at(totals.retries_timeline, i) + at(totals.denied_timeline, i));
    const double take = std::min(demand, cost * std::floor(available / cost + 1e-9));
    level = std::min(policy.capacity, available - take);
    allowed += take;
  }
  return allowed;
}

WindowedCheck CheckWindowedBound(const PolicyView& policy, const WorkerCounts& totals,
                                 double report_delay_seconds, double fallback_allowance) {
  WindowedCheck c;
  c.ttl_seconds = static_cast<double>(policy.ttl_ms) / 1000.0;
  c.report_delay_seconds = report_delay_seconds;
  c.slice_seconds = totals.timeline_slice_seconds;
  c.floor_tokens = policy.min_retries_per_second * c.ttl_seconds;
  if (!policy.windowed) {
    c.not_checked_because = "the policy is not windowed";
    return c;
  }
  if (policy.mode == "shadow") {
    c.not_checked_because =
        "shadow: the allowed retries include would-be denials that took no token";
    return c;
  }
  const double slice = c.slice_seconds;
  if (!(slice > 0) || c.ttl_seconds < slice) {
    c.not_checked_because = "no timeline, or a slice longer than the ttl";
    return c;
  }
  c.checked = true;
  // Slices per window: whole slices only, so a window never exceeds the ttl.
  const size_t k = static_cast<size_t>(std::floor(c.ttl_seconds / slice + 1e-9));
  const std::vector<uint64_t>& tokens = totals.tokens_timeline;
  const std::vector<uint64_t>& requests = totals.requests_timeline;
  // prefix[i]: requests in slices [0, i).
  std::vector<uint64_t> prefix(std::max(tokens.size(), requests.size()) + 1, 0);
  for (size_t i = 0; i + 1 < prefix.size(); ++i) {
    prefix[i + 1] = prefix[i] + (i < requests.size() ? requests[i] : 0);
  }
  uint64_t in_window = 0;
  for (size_t j = 0; j < tokens.size(); ++j) {
    in_window += tokens[j];
    if (j >= k) in_window -= tokens[j - k];
    if (tokens[j] == 0) continue;
    const double end = slice * static_cast<double>(j + 1);
    const double from = end - c.ttl_seconds - report_delay_seconds;
    const size_t first = from <= 0 ? 0 : static_cast<size_t>(std::floor(from / slice));
    const uint64_t made = prefix[j + 1] - prefix[std::min(first, j + 1)];
    const double bound =
        c.floor_tokens + policy.retry_ratio * static_cast<double>(made) + fallback_allowance;
    ++c.windows;
    const double utilisation = Ratio(static_cast<double>(in_window), bound);
    if (static_cast<double>(in_window) > bound) ++c.windows_over;
    if (c.windows == 1 || utilisation > c.max_utilisation) {
      c.max_utilisation = utilisation;
      c.worst_end_seconds = end;
      c.worst_spent = in_window;
      c.worst_requests = made;
      c.worst_bound = bound;
    }
  }
  c.within = c.windows_over == 0;
  return c;
}

namespace {

// The tokens the fleet's retries took: every allowed retry's cost, less the would-be denials of
// a shadow tenant (each let through at `retry_cost` without a token).
double TokensTaken(const WorkerCounts& totals, uint32_t retry_cost) {
  const double unbacked =
      static_cast<double>(retry_cost) * static_cast<double>(totals.lib_shadow_denied);
  return std::max(0.0, static_cast<double>(totals.tokens_spent) - unbacked);
}

// `v` with the ideal central bucket's allowance (IdealAllowed) and `spent` against it.
Verdict FinishIdeal(Verdict v, const PolicyView& policy, double elapsed,
                    const WorkerCounts& totals, uint32_t retry_cost, double spent) {
  v.ideal_allowed = IdealAllowed(policy, elapsed, totals, retry_cost);
  v.utilisation_vs_ideal = Ratio(spent, v.ideal_allowed);
  return v;
}

Verdict JudgeOne(const PolicyView& policy, double elapsed, const WorkerCounts& totals,
                 uint32_t retry_cost, double report_delay_seconds) {
  Verdict v;
  v.lease_bound = BudgetBound(policy, elapsed, totals.successes);
  v.fallback_allowance = totals.fallback_allowance;
  v.bound = v.lease_bound + v.fallback_allowance;
  const double spent = TokensTaken(totals, retry_cost);
  v.spent = spent;
  // Exact comparison on purpose: the bound is already the generous side (elapsed runs until the
  // last worker exited, after its last retry).
  v.within_budget = spent <= v.bound;
  if (policy.windowed) {
    v.windowed =
        CheckWindowedBound(policy, totals, report_delay_seconds, totals.fallback_allowance);
    v.within_budget = v.windowed.within;
    if (v.windowed.checked) {
      // The report's bound and utilisation are the windowed ones: its fullest window's.
      v.bound = v.windowed.worst_bound;
      v.lease_bound = v.bound - v.fallback_allowance;
      v.utilisation = v.windowed.max_utilisation;
      return FinishIdeal(v, policy, elapsed, totals, retry_cost, spent);
    }
  }
  if (v.bound > 0) {
    v.utilisation = spent / v.bound;
  } else {
    v.utilisation = spent == 0 ? 0 : std::numeric_limits<double>::infinity();
  }
  return FinishIdeal(v, policy, elapsed, totals, retry_cost, spent);
}

}  // namespace

Verdict Judge(const FleetRun& run) {
  if (run.tenants.empty()) {
    return JudgeOne(run.policy, run.elapsed_seconds, run.totals, run.retry_cost,
                    run.report_delay_seconds);
  }
  Verdict v;
  v.within_budget = true;
  for (const TenantRun& t : run.tenants) {
    Verdict one = JudgeOne(t.policy, run.elapsed_seconds, t.totals, run.retry_cost,
                           run.report_delay_seconds);
    v.spent += one.spent;
    v.lease_bound += one.lease_bound;
    v.fallback_allowance += one.fallback_allowance;
    v.bound += one.bound;
    v.within_budget = v.within_budget && one.within_budget;
    v.ideal_allowed += one.ideal_allowed;
    v.tenants.push_back(one);
  }
  const double spent = v.spent;
  if (v.bound > 0) {
    v.utilisation = spent / v.bound;
  } else {
    v.utilisation = spent == 0 ? 0 : std::numeric_limits<double>::infinity();
  }
  v.utilisation_vs_ideal = Ratio(spent, v.ideal_allowed);
  return v;
}

int ExitCodeFor(const Verdict& verdict) {
  return verdict.within_budget ? kExitWithinBudget : kExitBudgetExceeded;
}

namespace {

// {"<language>": {workers, calls, successes, retries_allowed, retries_denied,
// fallback_allowance, lease_after_fallback, shutdown_status, max_try_acquire_ms}, ...}
std::string LanguagesToJson(const std::vector<LanguageRun>& languages) {
  JsonWriter all;
  for (const LanguageRun& l : languages) {
    JsonWriter one;
    one.Number("workers", l.workers)
        .Number("calls", l.totals.calls)
        .Number("successes", l.totals.successes)
        .Number("retries_allowed", l.totals.retries_allowed)
        .Number("retries_denied", l.totals.retries_denied)
        .Number("requests", l.totals.requests)
        .Number("tokens_spent", l.totals.tokens_spent)
        .Number("shadow_denied", l.totals.lib_shadow_denied)
        .Number("fallback_allowance", l.totals.fallback_allowance)
        .Number("workers_back_on_lease", l.totals.lease_after_fallback)
        .Number("tokens_held_at_exit", l.totals.lib_tokens_held)
        .String("shutdown_status", l.totals.shutdown_status)
        .Number("max_try_acquire_ms", l.totals.max_try_acquire_ms);
    all.Object(l.language, one.Finish());
  }
  return all.Finish();
}

// The run's settings, totals, verdict and the library's own counts: the report's first fields.
void AddRunAndTotals(JsonWriter& w, const FleetRun& run, const Verdict& verdict) {
  JsonWriter policy;
  policy.Number("capacity", run.policy.capacity)
      .Number("refill_per_second", run.policy.refill_per_second)
      .Number("success_credit", run.policy.success_credit)
      .Number("initial_tokens", run.policy.initial_tokens)
      .Number("lease_ttl_ms", run.policy.lease_ttl_ms)
      .String("mode", run.policy.mode)
      .Bool("windowed", run.policy.windowed);
  if (run.policy.windowed) {
    policy.Number("retry_ratio", run.policy.retry_ratio)
        .Number("min_retries_per_second", run.policy.min_retries_per_second)
        .Number("ttl_ms", run.policy.ttl_ms);
  }

  const WorkerCounts& t = run.totals;
  JsonWriter library;
  library.Number("successes", t.lib_successes)
      .Number("retries_allowed", t.lib_retries_allowed)
      .Number("retries_denied", t.lib_retries_denied)
      .Number("fallback_allowed", t.lib_fallback_allowed)
      .Number("tokens_received", t.lib_tokens_received)
      .Number("tokens_returned", t.lib_tokens_returned)
      .Number("tokens_held_at_exit", t.lib_tokens_held)
      .Number("successes_credited_locally", t.lib_successes_credited_locally)
      .Number("requests", t.lib_requests)
      .Number("shadow_denied", t.lib_shadow_denied)
      .String("shutdown_status", t.shutdown_status);

  w.String("tenant", run.tenant)
      .String("strategy", run.strategy)
      .Number("workers", run.workers)
      .Number("threads", run.threads)
      .Number("failure_rate", run.failure_rate)
      .Number("duration_seconds", run.duration_seconds)
      .Number("call_latency_ms", run.call_latency_ms)
      .Object("policy", policy.Finish())
      .Number("elapsed_seconds", run.elapsed_seconds)
      .Number("calls", t.calls)
      .Number("attempts", t.attempts)
      .Number("successes", t.successes)
      .Number("failures", t.failures)
      .Number("retries_allowed", t.retries_allowed)
      .Number("retries_denied", t.retries_denied)
      .Number("requests", t.requests)
      .Number("retry_cost", int64_t{run.retry_cost})
      .Number("tokens_spent", t.tokens_spent)
      .Number("shadow_denied", t.lib_shadow_denied)
      .Number("spent", verdict.spent)
      .Number("lease_bound", verdict.lease_bound)
      .Number("fallback_allowance", verdict.fallback_allowance)
      .Number("bound", verdict.bound)
      .Bool("within_budget", verdict.within_budget)
      .Number("utilisation", verdict.utilisation)
      .Number("ideal_allowed", verdict.ideal_allowed)
      .Number("utilisation_vs_ideal", verdict.utilisation_vs_ideal)
      .Number("max_try_acquire_ms", t.max_try_acquire_ms)
      .Object("library", library.Finish());
}

// "fallback": the allowance, its rule and what was spent under it.
std::string FallbackToJson(const FleetRun& run) {
  const WorkerCounts& t = run.totals;
  JsonWriter fallback;
  fallback
      .String("allowance_rule",
              "sum over workers and fallback episodes of safe_share.capacity (at least 1 when "
              "it refills) + safe_share.refill_per_second * seconds in fallback")
      .Number("allowance", t.fallback_allowance)
      .Number("seconds_total", t.fallback_seconds)
      .Number("entries", t.fallback_entries)
      .Number("safe_share_capacity_sum", t.safe_share_capacity)
      .Number("safe_share_refill_sum", t.safe_share_refill)
      .Number("library_fallback_allowed", t.lib_fallback_allowed)
      .Number("success_credit_deposited",
              run.policy.success_credit * static_cast<double>(t.lib_successes_credited_locally))
      .Number("worker_retries_allowed_in_fallback", t.retries_allowed_in_fallback)
      .Number("worker_calls_in_fallback", t.calls_in_fallback)
      .Number("worker_retries_allowed_after_fallback", t.retries_allowed_after_fallback)
      .Number("workers_back_on_lease", t.lease_after_fallback)
      .Number("syncs_ok", t.syncs_ok)
      .Number("syncs_failed", t.syncs_failed);
  return fallback.Finish();
}

// "server": the single server's own view of the tenant.
std::string ServerToJson(const ServerView& s) {
  JsonWriter server;
  server.Number("tokens_start", s.tokens_start)
      .Number("tokens_end", s.tokens_end)
      .Number("granted", s.granted)
      .Number("returned", s.returned)
      .Number("reclaimed", s.reclaimed)
      .Number("retries", s.retries)
      .Number("retries_denied", s.retries_denied)
      .Number("successes", s.successes)
      .Number("shadow_denied", s.shadow_denied)
      .Number("requests", s.requests)
      .Number("retries_allowed", s.retries_allowed)
      .Number("active_instances_end", int64_t{s.active_instances_end})
      .Number("level_samples", s.level_samples)
      .Number("level_mean", s.level_mean)
      .Number("level_max", s.level_max);
  return server.Finish();
}

// "faults": what the fault proxy did.
std::string FaultsToJson(const FaultCounters& f, double delay_ms) {
  JsonWriter faults;
  faults.Number("proxied_requests", f.proxied_requests)
      .Number("dropped_responses", f.dropped_responses)
      .Number("duplicated_requests", f.duplicated_requests)
      .Number("replayed_requests", f.replayed_requests)
      .Number("replays_stale", f.replays_stale)
      .Number("replay_granted_tokens", f.replay_granted_tokens)
      .Number("upstream_errors", f.upstream_errors)
      .Number("delay_ms", delay_ms)
      .Number("delayed_responses", f.delayed_responses);
  return faults.Finish();
}

// "chaos": the single server's kill or stop, and the calls around it. The times of what did not
// happen are left out.
std::string ChaosToJson(const ChaosView& c) {
  JsonWriter chaos;
  chaos.Number("port", c.port).Bool("persistent", c.persistent);
  auto optional = [&chaos](absl::string_view key, const std::optional<double>& value) {
    if (value.has_value()) chaos.Number(key, *value);
  };
  optional("kill_at_seconds", c.kill_at);
  optional("restart_at_seconds", c.restart_at);
  if (c.kill_at.has_value()) chaos.Number("downtime_seconds", c.downtime_seconds);
  optional("stop_at_seconds", c.stop_at);
  optional("resume_at_seconds", c.resume_at);
  if (c.stop_at.has_value()) chaos.Number("hung_seconds", c.hung_seconds);
  if (!c.restart_error.empty()) chaos.String("restart_error", c.restart_error);
  chaos.Number("calls_during_outage", c.calls_during_outage)
      .Number("retries_during_outage", c.retries_during_outage)
      .Number("retries_after_outage", c.retries_after_outage);
  return chaos.Finish();
}

// The cluster's "owner_losses" (each lost owner and how long its tenants waited) and
// "max_seconds_without_owner_key".
void AddOwnerLosses(JsonWriter& cluster, const ClusterView& c) {
  std::vector<std::string> losses;
  for (const OwnerLoss& l : c.owner_losses) {
    JsonWriter loss;
    loss.Number("at_seconds", l.at)
        .Number("server", l.server)
        .String("what", l.what)
        .Number("tenants", l.tenants);
    if (l.new_owner_after_seconds.has_value()) {
      loss.Number("new_owner_after_seconds", *l.new_owner_after_seconds);
    }
    if (l.leases_back_after_owner_seconds.has_value()) {
      loss.Number("leases_back_after_owner_seconds", *l.leases_back_after_owner_seconds);
    }
    losses.push_back(loss.Finish());
  }
  cluster.Objects("owner_losses", losses)
      .Number("max_seconds_without_owner_key", c.max_seconds_without_owner_key);
}

// The cluster's "stops" (each SIGTERM and how long the server took to exit) and "restarts" (each
// start and how long until health SERVING), with their maxima and the starts that never served.
void AddStopsAndRestarts(JsonWriter& cluster, const ClusterView& c) {
  std::vector<std::string> stops;
  double max_stop = 0;
  for (const ServerStop& st : c.stops) {
    max_stop = std::max(max_stop, st.seconds);
    JsonWriter one;
    one.Number("at_seconds", st.at)
        .Number("server", st.server)
        .Number("seconds", st.seconds)
        .String("exit", st.exit);
    stops.push_back(one.Finish());
  }
  std::vector<std::string> restarts;
  double max_serving = 0;
  int never = 0;
  for (const ServerRestart& r : c.restarts) {
    JsonWriter one;
    one.Number("at_seconds", r.at).Number("server", r.server);
    if (r.serving_after.has_value()) {
      max_serving = std::max(max_serving, *r.serving_after);
      one.Number("serving_after_seconds", *r.serving_after);
    } else {
      ++never;
    }
    if (!r.error.empty()) one.String("error", r.error);
    restarts.push_back(one.Finish());
  }
  cluster.Objects("stops", stops)
      .Number("max_stop_seconds", max_stop)
      .Objects("restarts", restarts)
      .Number("max_restart_to_serving_seconds", max_serving)
      .Number("restarts_not_serving", never);
}

// "cluster": its size and events; owner losses for a run over several tenants or with any;
// stops and restarts when there were some.
std::string ClusterToJson(const ClusterView& c, bool several_tenants) {
  JsonWriter cluster;
  cluster.Number("servers", c.servers)
      .Number("etcd_nodes", c.etcd_nodes)
      .String("target", c.target)
      .String("events", absl::StrJoin(c.events, "; "));
  if (several_tenants || !c.owner_losses.empty()) AddOwnerLosses(cluster, c);
  if (!c.stops.empty() || !c.restarts.empty()) AddStopsAndRestarts(cluster, c);
  return cluster.Finish();
}

// "tenants" (each tenant's totals and verdict) and their summary: "tenant_count",
// "tenants_within_budget", "utilisation_min".
void AddTenants(JsonWriter& w, const std::vector<TenantRun>& runs,
                const std::vector<Verdict>& verdicts) {
  std::vector<std::string> tenants;
  int within = 0;
  double min_utilisation = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < runs.size() && i < verdicts.size(); ++i) {
    const TenantRun& t = runs[i];
    const Verdict& v = verdicts[i];
    within += v.within_budget ? 1 : 0;
    min_utilisation = std::min(min_utilisation, v.utilisation);
    JsonWriter one;
    one.String("tenant", t.tenant)
        .Number("initial_tokens", t.policy.initial_tokens)
        .Number("successes", t.totals.successes)
        .Number("retries_allowed", t.totals.retries_allowed)
        .Number("retries_denied", t.totals.retries_denied)
        .Number("requests", t.totals.requests)
        .Number("tokens_spent", t.totals.tokens_spent)
        .Number("shadow_denied", t.totals.lib_shadow_denied)
        .Number("spent", v.spent)
        .String("mode", t.policy.mode)
        .Bool("windowed", t.policy.windowed)
        .Number("lease_bound", v.lease_bound)
        .Number("fallback_allowance", v.fallback_allowance)
        .Number("bound", v.bound)
        .Bool("within_budget", v.within_budget)
        .Number("utilisation", v.utilisation)
        .Number("utilisation_vs_ideal", v.utilisation_vs_ideal)
        .Number("fallback_seconds", t.totals.fallback_seconds)
        .Number("ungranted_gap_max_seconds", t.totals.ungranted_gap_max_seconds)
        .Number("granted_again_at_seconds", t.totals.granted_again_at_seconds);
    tenants.push_back(one.Finish());
  }
  w.Number("tenant_count", static_cast<int64_t>(runs.size()))
      .Number("tenants_within_budget", within)
      .Number("utilisation_min", min_utilisation)
      .Objects("tenants", tenants);
}

// "windowed": the windowed bound's check (CheckWindowedBound).
std::string WindowedToJson(const WindowedCheck& c) {
  JsonWriter w;
  w.Bool("checked", c.checked);
  if (!c.checked) return w.String("not_checked_because", c.not_checked_because).Finish();
  w.String("rule",
           "every window of ttl ending at a slice with spending: tokens spent <= "
           "min_retries_per_second * ttl + retry_ratio * requests made in (end - ttl - "
           "report_delay, end] + fallback_allowance")
      .Number("ttl_seconds", c.ttl_seconds)
      .Number("report_delay_seconds", c.report_delay_seconds)
      .Number("slice_seconds", c.slice_seconds)
      .Number("floor_tokens", c.floor_tokens)
      .Number("windows", c.windows)
      .Number("windows_over", c.windows_over)
      .Number("max_utilisation", c.max_utilisation)
      .Number("worst_end_seconds", c.worst_end_seconds)
      .Number("worst_spent", c.worst_spent)
      .Number("worst_requests", c.worst_requests)
      .Number("worst_bound", c.worst_bound)
      .Bool("within", c.within);
  return w.Finish();
}

// Retries denied by the calls started in the timeline slices wholly inside [from, to).
uint64_t DeniedWithin(const WorkerCounts& totals, double from, double to) {
  const double w = totals.timeline_slice_seconds;
  uint64_t denied = 0;
  for (size_t i = 0; w > 0 && i < totals.denied_timeline.size(); ++i) {
    const double begin = w * static_cast<double>(i);
    if (begin >= from && begin + w <= to) denied += totals.denied_timeline[i];
  }
  return denied;
}

// "mode_switches": each switch played (budgetctl), and when the last client saw it
// (totals.mode_changes_ms, in order: the first change is the policy's own when it starts in
// shadow).
std::vector<std::string> ModeSwitchesToJson(const FleetRun& run) {
  std::vector<std::string> out;
  const std::vector<uint64_t>& seen = run.totals.mode_changes_ms;
  // A run that starts in shadow: every client's first change is to shadow, at its first answer.
  const size_t offset = run.policy.mode == "shadow" && !run.mode_switches.empty() &&
                                run.mode_switches.front().mode == "enforce"
                            ? 1
                            : 0;
  for (size_t i = 0; i < run.mode_switches.size(); ++i) {
    const FleetRun::ModeSwitch& m = run.mode_switches[i];
    JsonWriter one;
    one.String("mode", m.mode)
        .Number("started_at_seconds", m.started_at)
        .Number("done_at_seconds", m.done_at)
        .String("result", m.result);
    if (i + offset < seen.size()) {
      const double all_at = static_cast<double>(seen[i + offset]) / 1000.0;
      const double until = i + 1 < run.mode_switches.size() ? run.mode_switches[i + 1].started_at
                                                            : run.elapsed_seconds;
      one.Number("all_clients_at_seconds", all_at)
          .Number("lag_after_done_seconds", all_at - m.done_at)
          .Number("retries_denied_while_all_in_mode",
                  DeniedWithin(run.totals, all_at, until));
    }
    out.push_back(one.Finish());
  }
  return out;
}

}  // namespace

std::string FleetReportToJson(const FleetRun& run, const Verdict& verdict) {
  JsonWriter w;
  AddRunAndTotals(w, run, verdict);
  if (run.policy.windowed) w.Object("windowed", WindowedToJson(verdict.windowed));
  if (!run.mode_switches.empty()) {
    w.Objects("mode_switches", ModeSwitchesToJson(run))
        .Counts("mode_changes_ms", run.totals.mode_changes_ms);
  }
  w.Object("fallback", FallbackToJson(run));
  if (!run.languages.empty()) w.Object("languages", LanguagesToJson(run.languages));
  if (run.server.has_value()) w.Object("server", ServerToJson(*run.server));
  if (run.faults.has_value()) w.Object("faults", FaultsToJson(*run.faults, run.fault_delay_ms));
  if (run.chaos.has_value()) w.Object("chaos", ChaosToJson(*run.chaos));
  if (run.cluster.has_value()) {
    w.Object("cluster", ClusterToJson(*run.cluster, /*several_tenants=*/!run.tenants.empty()));
  }
  if (!run.tenants.empty()) AddTenants(w, run.tenants, verdict.tenants);
  return w.Finish();
}

}  // namespace retrybudget::fleet
