#include "server/cluster_metrics.h"

#include <limits>
#include <string>
#include <utility>

namespace retrybudget {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily One(std::string name, std::string help, MetricType type, double value) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  ClientMetric m;
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
  return family;
}

}  // namespace

void ClusterMetrics::Observe(double seconds) {
  size_t i = 0;
  while (i < kBuckets.size() && seconds > kBuckets[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

std::vector<MetricFamily> ClusterMetrics::Collect() const {
  const cluster::OwnershipManager* ownership = cluster_->ownership();
  const ClusterRouterStats stats = cluster_->cluster_router().stats();
  std::vector<MetricFamily> families;
  families.push_back(One("retry_budget_shards_owned", "Shards this server owns.",
                         MetricType::Gauge,
                         ownership != nullptr ? static_cast<double>(ownership->OwnedShards().size())
                                              : 0.0));
  families.push_back(One("retry_budget_shard_ownership_changes_total",
                         "Shards this server acquired, released or lost.", MetricType::Counter,
                         ownership != nullptr ? static_cast<double>(ownership->ownership_changes())
                                              : 0.0));
  families.push_back(One("retry_budget_etcd_errors_total",
                         "etcd calls for the tenants' state that failed (refused fences included).",
                         MetricType::Counter, static_cast<double>(stats.etcd_errors)));
  families.push_back(One("retry_budget_etcd_writes_total",
                         "Fenced transactions writing the tenants' state (reservations, levels).",
                         MetricType::Counter, static_cast<double>(stats.etcd_writes)));
  MetricFamily duration;
  duration.name = "retry_budget_etcd_request_duration_seconds";
  duration.help = "Duration of the etcd calls for the tenants' state (loads and fenced writes).";
  duration.type = MetricType::Histogram;
  ClientMetric h;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    ClientMetric::Bucket b;
    b.cumulative_count = cumulative;
    b.upper_bound = i < kBuckets.size() ? kBuckets[i] : std::numeric_limits<double>::infinity();
    h.histogram.bucket.push_back(b);
  }
  h.histogram.sample_count = cumulative;
  h.histogram.sample_sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  duration.metric.push_back(std::move(h));
  families.push_back(std::move(duration));
  return families;
}

}  // namespace retrybudget
