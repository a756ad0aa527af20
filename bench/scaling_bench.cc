// Scaling: what one BudgetCore::Sync costs (called directly: no network, no gRPC) and how much
// memory the server's state takes, as tenants grow 1 -> 1,000,000 and instances 1 -> 100,000.
//
// Why: a budget server holds every tenant's bucket and, per instance, the last counters it
// applied (for idempotent Syncs). This bench shows the bytes each costs and whether a Sync gets
// slower as they grow (it should not: lookups are hash maps).
//
// Three series, each on a fresh BudgetCore (limits raised: max_tenants 2M, max_instances 200k),
// on a FakeClock that moves 10 us per Sync so every instance stays active (within its lease TTL):
//   tenants          tenants created by PutPolicy (bucket + policy, no instance state); Syncs
//                    come from 1,000 instances, new at each step, each naming one random
//                    existing tenant.
//   instances_spread instances each syncing their own tenant (1,000 tenants, 1 per request).
//   instances_shared instances all syncing ONE tenant: the tenant's active-instance set grows
//                    with the fleet (a large service sharing one budget).
// Memory is the malloc'd bytes (glibc mallinfo2) added while the state grew, divided by what
// was added; Sync cost is the mean of timed Syncs of existing instances (seq + 1 each) after
// each step, the median over --slices slices.
//
// Ratios ("ratio", and "sync_cost_ratio" in the summary): each step against a copy of its
// series' first step (a core with 1 tenant, or 1 instance, built the same way and kept beside
// the growing one), timed in turns with it, slice for slice; the ratio is the median of the
// slices' ratios (each slice's mean over the copy's slice just before it). A step's cost and its
// first step's, timed seconds apart, differed by up to 2x on this shared VM with no change in
// between ("sync_ns_first" against "first_ns"), which one ratio of two such figures
// ("sync_cost_ratio_last_vs_first", kept for comparison with earlier runs) carries whole. The
// baseline below is timed in turns with one of a single record the same way ("bare_ratio"), and
// the summary's "sync_added_ns" and "bare_added_ns" are each against its copy.
//
// A timed Sync includes the bench's own part: building the request (the id formatted, the
// fields set) and clearing the reused response, ~100 ns, the same at every step. It is timed
// alone too, in turns as well ("harness_ns"), and "core_ratio" ("core_cost_ratio" in the
// summary) is the ratio without it on either side: (sync_ns - harness_ns) against (first_ns -
// its harness_ns). The server parses a request where the bench builds one, so neither ratio is
// the server's whole Sync; the second is the core's alone, the stricter of the two.
//
// Baseline of the instance series, timed at each step in the same run ("bare_ns"): the memory
// a Sync of a random instance must touch, without the budget. As many records as instances,
// each the size of an instance's (its record and id), found by the id it holds through a hash
// set of pointers (as the server's table), every line of it written, and a 24-byte entry per
// instance updated in a second table keyed by an integer (as a tenant's active set), with the
// same id formatting and seq bookkeeping as the timed Syncs. What this costs more at 100k than
// at 1 is the machine's (cache and TLB misses of a random walk over ~30 MB), which any server
// that finds an instance's state by its id pays; what a Sync costs beyond that is the server's.
// A second baseline ("handle_ns") finds the record by its index instead, as a server could if
// each client sent back a handle it was given (no hash table), checks the id the record holds
// and writes every line (no second table: the server keeps the active entry in the record): the
// least any server must touch that keeps an instance's state in memory outside the cache.
//
// Output: one JSON line per step ({"bench":"scaling_step",...}), then {"bench":"scaling",...}.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "retrybudget/clock.h"
#include "server/budget_core.h"
#include "server/instance_state.h"

ABSL_FLAG(int64_t, max_tenants, 1'000'000, "largest tenant step (1, 100, 10k, 100k, 1M)");
ABSL_FLAG(int64_t, max_instances, 100'000, "largest instance step (1, 100, 1k, 10k, 100k)");
ABSL_FLAG(int, timed_syncs, 5000, "Syncs timed per slice of a step");
ABSL_FLAG(int, slices, 9,
          "timed slices per step; a step's cost is the median of its slices' means (one slice "
          "of 5,000 Syncs takes ~2-4 ms, which one preemption on a shared machine can double)");
ABSL_FLAG(absl::Duration, step_budget, absl::Seconds(60),
          "skip the larger steps of a series once one step took longer than this");

namespace retrybudget::bench {
namespace {

// Where the baseline's results go, so that the compiler keeps the work that made them.
std::atomic<uint64_t> benchmark_sink{0};

struct Step {
  std::string series;
  int64_t count = 0;          // tenants or instances after the step
  double bytes_per_item = 0;  // malloc bytes added / items added in this step
  double rss_mb = 0;
  double sync_ns = 0;
  double first_ns = 0;  // the copy of the first step, timed in turns with this one
  double ratio = 0;     // sync_ns against first_ns, the median of the slices' ratios
  double harness_ns = 0;        // the bench's part of sync_ns (Series::SyncOnce), timed alone
  double harness_first_ns = 0;  // the same of first_ns
  double core_ratio = 0;  // (sync_ns - harness_ns) against (first_ns - harness_first_ns)
  double bare_ns = 0;   // the instance series' baseline (BareLookups); 0 in the tenant series
  double bare_first_ns = 0;  // the baseline with one record, timed in turns with bare_ns
  double bare_ratio = 0;     // bare_ns against bare_first_ns, as `ratio`
  double handle_ns = 0;        // the second baseline (BareLookups::Touch by index)
  double handle_first_ns = 0;  // the same with one record, timed in turns with handle_ns
  double build_seconds = 0;
};

std::string InstanceId(int64_t i) { return absl::StrFormat("inst-%012d-%08x", i, i * 2654435761u); }
std::string TenantId(int64_t i) { return absl::StrFormat("tenant-%08d", i); }

class Series {
 public:
  Series() {
    CoreOptions options;
    options.max_tenants = 2'000'000;
    options.max_instances = 200'000;
    options.clock = &clock_;
    options.policy.mutable_default_policy()->set_capacity(1e9);
    options.policy.mutable_default_policy()->set_refill_per_second(1e9);
    core_ = *BudgetCore::Create(options);
  }

  // The next Sync of instance `i` naming `tenant`: its counters grow a little each time. Its
  // seq is one counter of the whole series, which every instance sees increase (a gap is
  // allowed): a seq kept per instance is one more array the bench misses on at 100k instances,
  // in the timed window, and the Sync's locks keep that miss from overlapping the Sync's own.
  // `apply` false: only the bench's part (the request built, the response cleared), timed on
  // its own as "harness_ns".
  absl::Status SyncOnce(int64_t i, const std::string& tenant, bool apply = true) {
    const uint64_t seq = ++seq_;
    request_.Clear();
    request_.set_instance_id(InstanceId(i));
    request_.set_seq(seq);
    v1::TenantSync* t = request_.add_tenants();
    t->set_tenant(tenant);
    t->set_successes(seq * 10);
    if (report_requests_) t->set_requests(seq * 10);
    t->set_want(5);
    // Report nothing spent and nothing received so the counters stay valid without tracking
    // grants: the server reclaims the unreceived grants, a path it also runs in production.
    clock_.Advance(absl::Microseconds(10));
    // Into one reused response, as the server fills the RPC's own (arena) response.
    response_.Clear();
    if (!apply) return absl::OkStatus();
    return core_->Sync(request_, &response_);
  }

  BudgetCore& core() { return *core_; }
  // Report `requests` in every Sync (the window cell: a windowed tenant deposits for them).
  void ReportRequests() { report_requests_ = true; }

 private:
  FakeClock clock_;
  bool report_requests_ = false;
  std::unique_ptr<BudgetCore> core_;
  uint64_t seq_ = 0;
  v1::SyncRequest request_;
  v1::SyncResponse response_;
};

// The instance series' baseline (see the top of this file): `count` records of an instance's
// size found by the id each holds, and an integer-keyed table of 24-byte entries.
class BareLookups {
 public:
  explicit BareLookups(int64_t count) {
    records_.reserve(count);
    for (int64_t i = 0; i < count; ++i) {
      const std::string id = InstanceId(i);
      // The record's bytes, then its id, in one allocation (as Instance::Create makes them).
      auto block = std::make_unique<char[]>(kRecordSize + sizeof(uint32_t) + id.size());
      const auto size = static_cast<uint32_t>(id.size());
      std::memcpy(block.get() + kRecordSize, &size, sizeof(size));
      std::memcpy(block.get() + kRecordSize + sizeof(size), id.data(), id.size());
      by_id_.insert(block.get());
      records_.push_back(std::move(block));
      entries_[static_cast<uint64_t>(i)] = {};
    }
  }

  // What a Sync of instance `i` touches, without the budget; `by_index`: the record found by
  // its index (a handle), its id checked, and no second table. Returns a value that depends on
  // every byte written, so that nothing is optimised away.
  uint64_t Touch(int64_t i, bool by_index) {
    const std::string id = InstanceId(i);
    ++seq_;
    char* record = by_index ? records_[static_cast<size_t>(i)].get()
                            : *by_id_.find(absl::string_view(id));
    uint64_t sum = 0;
    for (size_t at = 0; at < kRecordSize; at += 64) sum += static_cast<uint8_t>(++record[at]);
    if (by_index) return sum + (IdOf(record) == id ? 1 : 0);
    Entry& e = entries_[static_cast<uint64_t>(i)];
    e.want = 5;
    e.held += 1;
    e.last_seen += seq_;
    return sum + e.held;
  }

 private:
  static constexpr size_t kRecordSize = sizeof(core_internal::Instance);
  static absl::string_view IdOf(const char* record) {
    uint32_t size;
    std::memcpy(&size, record + kRecordSize, sizeof(size));
    return absl::string_view(record + kRecordSize + sizeof(size), size);
  }
  struct Hash {
    using is_transparent = void;
    size_t operator()(absl::string_view id) const { return absl::Hash<absl::string_view>{}(id); }
    size_t operator()(const char* record) const { return (*this)(IdOf(record)); }
  };
  struct Eq {
    using is_transparent = void;
    static absl::string_view Of(absl::string_view id) { return id; }
    static absl::string_view Of(const char* record) { return IdOf(record); }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Of(a) == Of(b);
    }
  };
  struct Entry {
    uint64_t want = 0;
    uint64_t held = 0;
    uint64_t last_seen = 0;
  };

  uint64_t seq_ = 0;
  std::vector<std::unique_ptr<char[]>> records_;
  absl::flat_hash_set<char*, Hash, Eq> by_id_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
};

std::string StepJson(const Step& s) {
  return absl::StrFormat(
      "{\"bench\":\"scaling_step\",\"series\":\"%s\",\"count\":%d,\"bytes_per_item\":%.0f,"
      "\"rss_mb\":%.1f,\"sync_ns\":%.0f,\"first_ns\":%.0f,\"ratio\":%.2f,"
      "\"harness_ns\":%.0f,\"core_ratio\":%.2f,\"bare_ns\":%.0f,\"bare_ratio\":%.2f,"
      "\"handle_ns\":%.0f,\"build_seconds\":%.2f}",
      s.series, s.count, s.bytes_per_item, s.rss_mb, s.sync_ns, s.first_ns, s.ratio,
      s.harness_ns, s.core_ratio, s.bare_ns, s.bare_ratio, s.handle_ns, s.build_seconds);
}

// A step timed in turns with the copy of its series' first step (see the top of this file).
struct Paired {
  double ns = 0;        // the median of the step's slices
  double first_ns = 0;  // the median of the copy's slices
  double ratio = 0;     // the median of the slices' ratios
};

// --slices turns of `first()` then `step()`, each timing one slice and returning its mean ns.
template <typename First, typename Stepped>
Paired TimeInTurns(First& first, Stepped& step) {
  std::vector<double> first_ns, step_ns, ratios;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_slices)); ++i) {
    first_ns.push_back(first());
    step_ns.push_back(step());
    ratios.push_back(first_ns.back() > 0 ? step_ns.back() / first_ns.back() : 0);
  }
  return {.ns = Median(std::move(step_ns), /*if_empty=*/0),
          .first_ns = Median(std::move(first_ns), /*if_empty=*/0),
          .ratio = Median(std::move(ratios), /*if_empty=*/0)};
}

// Each slice of SyncSlices and BareSlices starts with this many untimed operations: the first
// Sync of an instance or tenant pair creates state, and the other side's slice, run just before,
// leaves this side's lines colder than its own previous slice would have (the timed ones
// measure the steady state of existing instances).
constexpr int kUntimedPerSlice = 1000;

// Slices of `n` Syncs of `series`, the instance and tenant of the k-th chosen by `pick(k)`; each
// call times one slice and returns its mean ns per Sync.
template <typename Pick>
class SyncSlices {
 public:
  // `apply` false: the bench's part of each Sync only (Series::SyncOnce).
  SyncSlices(Series& series, int n, Pick pick, bool apply = true)
      : series_(series), n_(n), pick_(std::move(pick)), apply_(apply) {}
  ~SyncSlices() {
    if (errors_ > 0) std::fprintf(stderr, "%d timed Syncs failed\n", errors_);
  }

  double operator()() {
    for (const int end = k_ + kUntimedPerSlice; k_ < end; ++k_) {
      auto [instance, tenant] = pick_(k_);
      (void)series_.SyncOnce(instance, tenant, apply_);
    }
    const absl::Time start = absl::Now();
    for (const int end = k_ + n_; k_ < end; ++k_) {
      auto [instance, tenant] = pick_(k_);
      if (!series_.SyncOnce(instance, tenant, apply_).ok()) ++errors_;
    }
    return absl::ToDoubleNanoseconds(absl::Now() - start) / n_;
  }

 private:
  Series& series_;
  const int n_;
  Pick pick_;
  const bool apply_;
  int k_ = 0;
  int errors_ = 0;
};

// Slices of `n` BareLookups::Touch of random records among the `count` of `bare`, as
// SyncSlices.
class BareSlices {
 public:
  BareSlices(BareLookups& bare, int64_t count, int n, uint64_t seed, bool by_index)
      : bare_(bare), count_(count), n_(n), rng_(seed), by_index_(by_index) {}
  ~BareSlices() { benchmark_sink.fetch_add(sink_, std::memory_order_relaxed); }

  double operator()() {
    for (int k = 0; k < kUntimedPerSlice; ++k) sink_ += bare_.Touch(Pick(), by_index_);
    const absl::Time start = absl::Now();
    for (int k = 0; k < n_; ++k) sink_ += bare_.Touch(Pick(), by_index_);
    return absl::ToDoubleNanoseconds(absl::Now() - start) / n_;
  }

 private:
  int64_t Pick() { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(count_)); }

  BareLookups& bare_;
  const int64_t count_;
  const int n_;
  std::mt19937_64 rng_;
  const bool by_index_;
  uint64_t sink_ = 0;
};

// A step's bytes per item: the malloc'd bytes added while it grew, over the items it added.
double BytesPerItem(int64_t added_bytes, int64_t target, const std::vector<Step>& before) {
  const int64_t added_items = before.empty() ? target : target - before.back().count;
  return static_cast<double>(added_bytes) / static_cast<double>(added_items);
}

// The step's Sync, and the bench's part of it alone, each timed in turns with the copy's.
void SetTimes(const Paired& sync, const Paired& harness, Step& s) {
  s.sync_ns = sync.ns;
  s.first_ns = sync.first_ns;
  s.ratio = sync.ratio;
  s.harness_ns = harness.ns;
  s.harness_first_ns = harness.first_ns;
  const double core_first = sync.first_ns - harness.first_ns;
  s.core_ratio = core_first > 0 ? (sync.ns - harness.ns) / core_first : 0;
}

void Print(Step& s, std::vector<Step>& out) {
  s.rss_mb = static_cast<double>(RssBytes()) / 1e6;
  std::printf("%s\n", StepJson(s).c_str());
  std::fflush(stdout);
  out.push_back(s);
}

std::vector<Step> TenantSeries(const std::vector<int64_t>& steps) {
  std::vector<Step> out;
  constexpr int kInstances = 1000;
  const int n = absl::GetFlag(FLAGS_timed_syncs);
  v1::BudgetPolicy policy;
  policy.set_capacity(1e9);
  policy.set_refill_per_second(1e9);
  // The copy of the first step: one tenant, which the 1,000 instances all use.
  Series first;
  const std::string tenant_0 = TenantId(0);
  if (!first.core().PutPolicy(tenant_0, policy).ok()) return out;
  auto first_pick = [&](int k) {
    return std::pair<int64_t, const std::string&>(k % kInstances, tenant_0);
  };
  SyncSlices first_slices(first, n, first_pick);
  SyncSlices first_harness(first, n, first_pick, /*apply=*/false);

  Series series;
  std::mt19937_64 rng(1);
  std::vector<std::string> instance_tenant(kInstances);
  int64_t have = 0;
  for (int64_t target : steps) {
    const absl::Time t0 = absl::Now();
    const int64_t before = MallocInUseBytes();
    for (; have < target; ++have) {
      if (!series.core().PutPolicy(TenantId(have), policy).ok()) {
        std::fprintf(stderr, "PutPolicy failed at %d\n", static_cast<int>(have));
        return out;
      }
    }
    Step s;
    s.bytes_per_item = BytesPerItem(MallocInUseBytes() - before, target, out);
    s.series = "tenants";
    s.count = target;
    s.build_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    // Each of 1,000 instances uses one tenant, picked at random among those that exist now. They
    // are new instances at each step (created by the first slice's untimed Syncs), each with a
    // record of its one tenant only, as the copy's: an instance of the previous step would
    // also hold its record of the previous step's tenant, and look its new one up among them.
    for (auto& t : instance_tenant) t = TenantId(static_cast<int64_t>(rng() % target));
    const int64_t first_instance = static_cast<int64_t>(out.size()) * kInstances;
    auto step_pick = [&](int k) {
      const int64_t i = k % kInstances;
      return std::pair<int64_t, const std::string&>(first_instance + i, instance_tenant[i]);
    };
    SyncSlices step_slices(series, n, step_pick);
    SyncSlices step_harness(series, n, step_pick, /*apply=*/false);
    const Paired sync = TimeInTurns(first_slices, step_slices);
    SetTimes(sync, TimeInTurns(first_harness, step_harness), s);
    Print(s, out);
    if (absl::Now() - t0 > absl::GetFlag(FLAGS_step_budget)) break;
  }
  return out;
}

// `shared`: every instance syncs tenant 0; otherwise instance i syncs tenant i % 1000.
std::vector<Step> InstanceSeries(const std::vector<int64_t>& steps, bool shared) {
  std::vector<Step> out;
  const int n = absl::GetFlag(FLAGS_timed_syncs);
  std::vector<std::string> tenants;
  for (int i = 0; i < 1000; ++i) tenants.push_back(TenantId(i));
  auto tenant_of = [&](int64_t i) -> const std::string& {
    return tenants[shared ? 0 : static_cast<size_t>(i % 1000)];
  };
  // The tenants are created up front so that the instance steps measure instances only; by an
  // instance that syncs them all, which no timed Sync uses.
  auto make_series = [&](Series& series) {
    for (int i = 0; i < (shared ? 1 : 1000); ++i) {
      (void)series.SyncOnce(-1 + 1'000'000, tenants[i]);
    }
  };
  // The copies of the first step: one instance (and its tenants), and one bare record.
  Series first;
  make_series(first);
  auto first_pick = [&](int) { return std::pair<int64_t, const std::string&>(0, tenant_of(0)); };
  SyncSlices first_slices(first, n, first_pick);
  SyncSlices first_harness(first, n, first_pick, /*apply=*/false);
  BareLookups first_records(1);
  BareSlices first_bare(first_records, 1, n, /*seed=*/3, /*by_index=*/false);
  BareSlices first_handle(first_records, 1, n, /*seed=*/4, /*by_index=*/true);

  Series series;
  make_series(series);
  std::mt19937_64 rng(2);
  int64_t have = 0;
  for (int64_t target : steps) {
    const absl::Time t0 = absl::Now();
    const int64_t before = MallocInUseBytes();
    for (; have < target; ++have) {
      if (absl::Status st = series.SyncOnce(have, tenant_of(have)); !st.ok()) {
        std::fprintf(stderr, "Sync failed: %s\n", std::string(st.message()).c_str());
        return out;
      }
    }
    Step s;
    s.bytes_per_item = BytesPerItem(MallocInUseBytes() - before, target, out);
    s.series = shared ? "instances_shared" : "instances_spread";
    s.count = target;
    s.build_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
    auto step_pick = [&](int) {
      const int64_t i = static_cast<int64_t>(rng() % target);
      return std::pair<int64_t, const std::string&>(i, tenant_of(i));
    };
    SyncSlices step_slices(series, n, step_pick);
    SyncSlices step_harness(series, n, step_pick, /*apply=*/false);
    const Paired sync = TimeInTurns(first_slices, step_slices);
    SetTimes(sync, TimeInTurns(first_harness, step_harness), s);
    BareLookups step_records(target);
    BareSlices step_bare(step_records, target, n, rng(), /*by_index=*/false);
    const Paired bare = TimeInTurns(first_bare, step_bare);
    s.bare_ns = bare.ns;
    s.bare_first_ns = bare.first_ns;
    s.bare_ratio = bare.ratio;
    BareSlices step_handle(step_records, target, n, rng(), /*by_index=*/true);
    const Paired handle = TimeInTurns(first_handle, step_handle);
    s.handle_ns = handle.ns;
    s.handle_first_ns = handle.first_ns;
    Print(s, out);
    if (absl::Now() - t0 > absl::GetFlag(FLAGS_step_budget)) break;
  }
  return out;
}

std::vector<int64_t> Steps(std::vector<int64_t> all, int64_t max) {
  std::vector<int64_t> out;
  for (int64_t s : all) {
    if (s <= max) out.push_back(s);
  }
  return out;
}

std::string SeriesSummary(const std::vector<Step>& steps) {
  if (steps.empty()) return "null";
  const Step& first = steps.front();
  const Step& last = steps.back();
  std::string bare;
  if (last.bare_ns > 0) {
    // The Sync's growth beside the bare lookups', each against its copy of the first step timed
    // in turns with it: what the machine's misses explain.
    bare = absl::StrFormat(
        ",\"bare_ns_first\":%.0f,\"bare_ns_last\":%.0f,\"bare_ratio\":%.2f,"
        "\"sync_added_ns\":%.0f,\"bare_added_ns\":%.0f,\"handle_added_ns\":%.0f",
        last.bare_first_ns, last.bare_ns, last.bare_ratio, last.sync_ns - last.first_ns,
        last.bare_ns - last.bare_first_ns, last.handle_ns - last.handle_first_ns);
  }
  return absl::StrFormat(
      "{\"from\":%d,\"to\":%d,\"sync_ns_first\":%.0f,\"sync_ns_last\":%.0f,"
      "\"first_ns_last\":%.0f,\"sync_cost_ratio\":%.2f,\"harness_ns\":%.0f,"
      "\"core_cost_ratio\":%.2f,\"sync_cost_ratio_last_vs_first\":%.2f,"
      "\"bytes_per_item_last_step\":%.0f%s}",
      first.count, last.count, first.sync_ns, last.sync_ns, last.first_ns, last.ratio,
      last.harness_ns, last.core_ratio,
      first.sync_ns > 0 ? last.sync_ns / first.sync_ns : -1, last.bytes_per_item, bare);
}

// The windowed ratio policy's cost beside the token bucket's: 1,000 instances syncing one tenant
// (requests reported in every Sync, so a windowed tenant deposits at each), one core with a
// windowed tenant timed in turns with one whose tenant is a token bucket, as the steps above.
// Prints {"bench":"scaling_window",...}: classic_ns, windowed_ns (each the median of the slices'
// means) and their ratio (the median of the slices' ratios).
void WindowCell() {
  constexpr int kInstances = 1000;
  const int n = absl::GetFlag(FLAGS_timed_syncs);
  const std::string tenant = TenantId(0);
  v1::BudgetPolicy bucket;
  bucket.set_capacity(1e9);
  bucket.set_refill_per_second(1e9);
  v1::BudgetPolicy window;
  window.set_retry_ratio(0.2);
  window.set_min_retries_per_second(1e8);  // a floor of 1e9 over 10 s: never dry
  window.set_ttl_ms(10'000);
  Series classic;
  Series windowed;
  classic.ReportRequests();
  windowed.ReportRequests();
  if (!classic.core().PutPolicy(tenant, bucket).ok() ||
      !windowed.core().PutPolicy(tenant, window).ok()) {
    std::fprintf(stderr, "PutPolicy failed\n");
    return;
  }
  auto pick = [&](int k) {
    return std::pair<int64_t, const std::string&>(k % kInstances, tenant);
  };
  SyncSlices classic_slices(classic, n, pick);
  SyncSlices windowed_slices(windowed, n, pick);
  const Paired p = TimeInTurns(classic_slices, windowed_slices);
  std::printf("{\"bench\":\"scaling_window\",\"instances\":%d,\"classic_ns\":%.0f,"
              "\"windowed_ns\":%.0f,\"ratio\":%.2f}\n",
              kInstances, p.first_ns, p.ns, p.ratio);
  std::fflush(stdout);
}

int Main() {
  WindowCell();
  const auto tenants =
      TenantSeries(Steps({1, 100, 10'000, 100'000, 1'000'000}, absl::GetFlag(FLAGS_max_tenants)));
  const std::vector<int64_t> instance_steps =
      Steps({1, 100, 1'000, 10'000, 100'000}, absl::GetFlag(FLAGS_max_instances));
  const auto spread = InstanceSeries(instance_steps, /*shared=*/false);
  const auto shared = InstanceSeries(instance_steps, /*shared=*/true);
  std::printf("{\"bench\":\"scaling\",\"tenants\":%s,\"instances_spread\":%s,"
              "\"instances_shared\":%s}\n",
              SeriesSummary(tenants).c_str(), SeriesSummary(spread).c_str(),
              SeriesSummary(shared).c_str());
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return retrybudget::bench::Main();
}
