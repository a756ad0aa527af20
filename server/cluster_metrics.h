// Prometheus metrics of cluster mode (ClusterMode), built at scrape time:
//   retry_budget_shards_owned                      gauge: shards this server owns now
//   retry_budget_shard_ownership_changes_total     counter: shards acquired, released or lost
//   retry_budget_etcd_errors_total                 counter: etcd calls of the tenants' state
//                                                  that failed (refused fences included)
//   retry_budget_etcd_request_duration_seconds     histogram: those calls' durations
//   retry_budget_etcd_writes_total                 counter: fenced transactions written
#ifndef RETRYBUDGET_SERVER_CLUSTER_METRICS_H_
#define RETRYBUDGET_SERVER_CLUSTER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/cluster_mode.h"

namespace retrybudget {

// Thread-safe; Observe() is lock-free.
class ClusterMetrics final : public prometheus::Collectable {
 public:
  // `cluster` must outlive the metrics endpoint.
  explicit ClusterMetrics(const ClusterMode* cluster) : cluster_(cluster) {}
  void Observe(double seconds);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  static constexpr std::array<double, 11> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                      0.1,   0.25,   0.5,   1,    2.5};
  const ClusterMode* const cluster_;
  std::array<std::atomic<uint64_t>, kBuckets.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_CLUSTER_METRICS_H_
