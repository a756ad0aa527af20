#include "server/metrics.h"

#include <exception>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_type.h"
#include "retrybudget/names.h"

namespace retrybudget {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr Rpc kAllRpcs[] = {Rpc::kSync, Rpc::kGetBudget, Rpc::kListBudgets, Rpc::kPutPolicy,
                            Rpc::kDeleteBudget, Rpc::kListShards};

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

ClientMetric Sample(std::vector<ClientMetric::Label> labels, MetricType type, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// One tenant's (or the "_other" aggregate's) values, summed in a scrape.
struct TenantValues {
  double tokens = 0;
  double leased = 0;
  double capacity = 0;
  double active_instances = 0;
  double granted = 0;
  double wanted = 0;
  double retries = 0;
  double refunded = 0;
  double retries_denied = 0;
  double successes = 0;
  double returned = 0;
  double reclaimed = 0;
  double fallback_retries = 0;
  double fallback_refunded = 0;
  double uncredited = 0;
  double shadow_denied = 0;
  double requests = 0;
  double retries_allowed = 0;
  // 1 for a shadow tenant (the "_other" row: how many of its tenants are).
  double shadow = 0;
  double window_deposits = 0;

  // The counters are the gross totals (refunds added back to the retries sent that
  // BudgetStatus gives), which never go down: a refund is its own counter.
  void Add(const v1::BudgetStatus& s) {
    tokens += s.tokens();
    leased += s.leased_tokens();
    capacity += s.policy().capacity();
    active_instances += s.active_instances();
    granted += static_cast<double>(s.granted_total());
    wanted += static_cast<double>(s.wanted_total());
    retries += static_cast<double>(s.retries_total() + s.refunded_total());
    refunded += static_cast<double>(s.refunded_total());
    retries_denied += static_cast<double>(s.retries_denied_total());
    successes += static_cast<double>(s.successes_total());
    returned += static_cast<double>(s.returned_total());
    reclaimed += static_cast<double>(s.reclaimed_total());
    fallback_retries +=
        static_cast<double>(s.fallback_retries_total() + s.fallback_refunded_total());
    fallback_refunded += static_cast<double>(s.fallback_refunded_total());
    uncredited += static_cast<double>(s.uncredited_total());
    shadow_denied += static_cast<double>(s.shadow_denied_total());
    requests += static_cast<double>(s.requests_total());
    retries_allowed += static_cast<double>(s.retries_allowed_total());
    shadow += s.policy().mode() == v1::MODE_SHADOW ? 1 : 0;
    window_deposits += s.window_deposits();
  }
};

// A per-tenant family: `name`, its help and type, and how to read the value.
struct TenantFamilySpec {
  const char* name;
  const char* help;
  MetricType type;
  double TenantValues::*value;
};

constexpr TenantFamilySpec kTenantFamilies[] = {
    {"retry_budget_tokens", "Tokens in the tenant's bucket (after refill to now).",
     MetricType::Gauge, &TenantValues::tokens},
    {"retry_budget_leased_tokens",
     "Tokens clients hold from their leases; with retry_budget_tokens, at most the capacity.",
     MetricType::Gauge, &TenantValues::leased},
    {"retry_budget_capacity", "Most tokens the tenant's bucket holds (policy capacity).",
     MetricType::Gauge, &TenantValues::capacity},
    {"retry_budget_active_instances",
     "Client instances that synced for the tenant within the last lease TTL.", MetricType::Gauge,
     &TenantValues::active_instances},
    {"retry_budget_granted_tokens_total", "Tokens granted to clients in leases.",
     MetricType::Counter, &TenantValues::granted},
    {"retry_budget_wanted_tokens_total", "Tokens clients asked for in their Syncs.",
     MetricType::Counter, &TenantValues::wanted},
    {"retry_budget_retries_total",
     "Tokens clients spent on the retries they allowed (a retry of cost c spends c), from "
     "leases and fallback, as reported; those refunded unsent are counted here too: the tokens "
     "of the retries sent are this minus retry_budget_refunded_retries_total.",
     MetricType::Counter, &TenantValues::retries},
    {"retry_budget_refunded_retries_total",
     "Of the retries, tokens clients gave back unsent (a backoff cancelled, a deadline "
     "reached): never sent.",
     MetricType::Counter, &TenantValues::refunded},
    {"retry_budget_retries_denied_total", "Retries clients denied for lack of a token.",
     MetricType::Counter, &TenantValues::retries_denied},
    {"retry_budget_successes_total", "Successes clients reported (each earns success_credit).",
     MetricType::Counter, &TenantValues::successes},
    {"retry_budget_returned_tokens_total", "Leased tokens clients gave back unspent.",
     MetricType::Counter, &TenantValues::returned},
    {"retry_budget_reclaimed_tokens_total",
     "Granted tokens whose response was lost, put back into the bucket.", MetricType::Counter,
     &TenantValues::reclaimed},
    {"retry_budget_fallback_retries_total",
     "Of the retries, those clients allowed from their local fallback bucket while the server "
     "was unreachable (refunded ones included).",
     MetricType::Counter, &TenantValues::fallback_retries},
    {"retry_budget_fallback_refunded_retries_total",
     "Of the fallback retries, tokens given back unsent.", MetricType::Counter,
     &TenantValues::fallback_refunded},
    {"retry_budget_uncredited_tokens_total",
     "Tokens clients returned or had reclaimed beyond what this server granted them and had not "
     "had back (a baseline's earlier tokens, or a client's lie): recorded, not credited.",
     MetricType::Counter, &TenantValues::uncredited},
    {"retry_budget_shadow",
     "1 while the tenant's policy is in shadow mode (a dry run: clients allow every retry and "
     "count the ones enforcement would deny), 0 while it is enforced. For tenant=\"_other\": "
     "how many of those tenants are in shadow mode.",
     MetricType::Gauge, &TenantValues::shadow},
    {"retry_budget_shadow_denied_total",
     "Retries a shadow tenant's clients let through that enforcement would have denied "
     "(would-be denials; compare retry_budget_retries_denied_total).",
     MetricType::Counter, &TenantValues::shadow_denied},
    {"retry_budget_requests_total",
     "Requests (first attempts) clients reported; a windowed policy deposits retry_ratio tokens "
     "for each.",
     MetricType::Counter, &TenantValues::requests},
    {"retry_budget_retries_allowed_total",
     "Retries clients allowed with tokens, whatever their cost (retry_budget_retries_total "
     "counts tokens: the two give the mean cost of a retry).",
     MetricType::Counter, &TenantValues::retries_allowed},
    {"retry_budget_window_deposits",
     "A windowed policy: the tokens deposited by the requests reported within the last ttl "
     "(0 for the token bucket shape).",
     MetricType::Gauge, &TenantValues::window_deposits},
};

}  // namespace

// ---- RpcMetrics ----

void RpcMetrics::RpcFinished(Rpc rpc, absl::StatusCode code, absl::Duration elapsed) {
  const size_t r = static_cast<size_t>(rpc);
  size_t c = static_cast<size_t>(code);
  if (r >= kRpcs) return;
  if (c >= kCodes) c = static_cast<size_t>(absl::StatusCode::kUnknown);
  requests_[r][c].fetch_add(1, std::memory_order_relaxed);
  if (rpc != Rpc::kSync) return;

  const double seconds = absl::ToDoubleSeconds(elapsed);
  size_t bucket = 0;
  while (bucket < kSyncDurationBuckets.size() && seconds > kSyncDurationBuckets[bucket]) ++bucket;
  sync_buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  const int64_t ns = absl::ToInt64Nanoseconds(elapsed);
  sync_duration_ns_.fetch_add(ns > 0 ? static_cast<uint64_t>(ns) : 0, std::memory_order_relaxed);
}

std::vector<MetricFamily> RpcMetrics::Collect() const {
  MetricFamily sync = Family("retry_budget_sync_requests_total",
                             "Sync RPCs finished, by gRPC status code.", MetricType::Counter);
  MetricFamily admin =
      Family("retry_budget_admin_requests_total",
             "BudgetAdminService RPCs finished, by method and gRPC status code.",
             MetricType::Counter);
  for (Rpc rpc : kAllRpcs) {
    const size_t r = static_cast<size_t>(rpc);
    for (size_t c = 0; c < kCodes; ++c) {
      const uint64_t n = requests_[r][c].load(std::memory_order_relaxed);
      // Codes never returned are left out (OK is always there, so the family is never empty).
      if (n == 0 && c != 0) continue;
      const std::string code = absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
      if (rpc == Rpc::kSync) {
        sync.metric.push_back(
            Sample({{"code", code}}, MetricType::Counter, static_cast<double>(n)));
      } else {
        admin.metric.push_back(Sample({{"code", code}, {"rpc", std::string(RpcName(rpc))}},
                                      MetricType::Counter, static_cast<double>(n)));
      }
    }
  }

  MetricFamily duration =
      Family("retry_budget_sync_duration_seconds",
             "Time the server took to handle a Sync (from the handler's start to its status).",
             MetricType::Histogram);
  ClientMetric h;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < sync_buckets_.size(); ++i) {
    cumulative += sync_buckets_[i].load(std::memory_order_relaxed);
    ClientMetric::Bucket b;
    b.cumulative_count = cumulative;
    b.upper_bound = i < kSyncDurationBuckets.size() ? kSyncDurationBuckets[i]
                                                    : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back(b);
  }
  h.histogram.sample_count = cumulative;
  h.histogram.sample_sum =
      static_cast<double>(sync_duration_ns_.load(std::memory_order_relaxed)) / 1e9;
  duration.metric.push_back(std::move(h));

  std::vector<MetricFamily> families;
  families.push_back(std::move(sync));
  families.push_back(std::move(duration));
  families.push_back(std::move(admin));
  return families;
}

// ---- BudgetMetrics ----

BudgetMetrics::BudgetMetrics(BudgetMetricsOptions options) : options_(std::move(options)) {}

std::vector<MetricFamily> BudgetMetrics::Collect() const {
  // Read outside the label lock: Snapshot() locks each tenant in turn, briefly.
  const std::vector<v1::BudgetStatus> budgets = options_.core->Snapshot();

  // Label value -> values, in first-seen order (Snapshot() is in name order; "_other" last).
  std::vector<std::pair<std::string, TenantValues>> rows;
  TenantValues other;
  bool any_other = false;
  {
    MutexLock lock(&mu_);
    // Forget deleted budgets first, so their slots go to the next tenants; tenants that had a
    // label keep it (a series never moves to "_other" while its budget exists).
    absl::flat_hash_set<absl::string_view> present;
    present.reserve(budgets.size());
    for (const v1::BudgetStatus& s : budgets) present.insert(s.tenant());
    absl::erase_if(labelled_, [&](const std::string& t) { return !present.contains(t); });
    rows.reserve(std::min(budgets.size(), options_.max_tenants));
    for (const v1::BudgetStatus& s : budgets) {
      if (!labelled_.contains(s.tenant())) {
        if (labelled_.size() >= options_.max_tenants) {
          other.Add(s);
          any_other = true;
          continue;
        }
        labelled_.insert(s.tenant());
      }
      TenantValues v;
      v.Add(s);
      rows.emplace_back(s.tenant(), v);
    }
  }
  if (any_other) rows.emplace_back(kOtherTenantLabel, other);

  std::vector<MetricFamily> families;
  for (const TenantFamilySpec& spec : kTenantFamilies) {
    MetricFamily family = Family(spec.name, spec.help, spec.type);
    family.metric.reserve(rows.size());
    for (const auto& [label, values] : rows) {
      family.metric.push_back(Sample({{"tenant", label}}, spec.type, values.*spec.value));
    }
    families.push_back(std::move(family));
  }

  MetricFamily tenants = Family("retry_budget_tenants",
                                "Budgets (tenants) the server holds.", MetricType::Gauge);
  tenants.metric.push_back(Sample({}, MetricType::Gauge, static_cast<double>(budgets.size())));
  families.push_back(std::move(tenants));

  MetricFamily store_errors =
      Family("retry_budget_store_errors_total",
             "Grant reservations that could not be made durable (grants were cut).",
             MetricType::Counter);
  store_errors.metric.push_back(
      Sample({}, MetricType::Counter, static_cast<double>(options_.core->store_errors())));
  families.push_back(std::move(store_errors));

  MetricFamily snapshots = Family("retry_budget_snapshots_total",
                                  "State snapshots to the data directory, by result.",
                                  MetricType::Counter);
  const uint64_t written = options_.snapshotter ? options_.snapshotter->written() : 0;
  const uint64_t failed = options_.snapshotter ? options_.snapshotter->failed() : 0;
  snapshots.metric.push_back(
      Sample({{"result", "ok"}}, MetricType::Counter, static_cast<double>(written)));
  snapshots.metric.push_back(
      Sample({{"result", "error"}}, MetricType::Counter, static_cast<double>(failed)));
  families.push_back(std::move(snapshots));
  return families;
}

// ---- The endpoint ----

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsEndpoint(
    const std::string& listen,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address ", QuoteForError(listen),
                     " is not host:port with a port in [0, 65535]"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // Two threads: Prometheus scrapes rarely; a second one keeps a slow scraper from blocking.
    exposer = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen,
                                               " (address in use or not local?): ", e.what()));
  }
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  return exposer;
}

int MetricsEndpointPort(const prometheus::Exposer& exposer) {
  const std::vector<int> ports = exposer.GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace retrybudget
