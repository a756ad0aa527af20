// Which server owns each tenant of a cluster run, polled from etcd while the fleet runs, and
// what that says about the server faults of the run: how long the tenants of a killed, paused
// or restarted owner waited for a new owner, and how long their clients then took to be granted
// again. Feeds the report's cluster.owner_losses (fleet_report.h).
//
//   OwnerWatch watch(cluster->etcd_client(), cluster->etcd_prefix(), addresses, tenants, t0);
//   ... the fleet runs ...
//   std::vector<OwnerSample> samples = watch.Finish();
//   std::vector<OwnerLoss> losses = OwnerLosses(samples, hits, granted_again_at);
#ifndef RETRYBUDGET_TOOLS_FLEET_OWNER_WATCH_H_
#define RETRYBUDGET_TOOLS_FLEET_OWNER_WATCH_H_

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "etcd/etcd_client.h"
#include "tools/fleet/fleet_report.h"

namespace retrybudget::fleet {

// The owner of each tenant at one poll: the index of its server in the watch's addresses, or
inline constexpr int kNoOwnerKey = -1;    // the shard has no owner key
inline constexpr int kOwnerUnknown = -2;  // etcd did not answer (or an owner not in the list)

struct OwnerSample {
  double at = 0;             // seconds from the run's start
  std::vector<int> owners;   // one per tenant, in the watch's order
};

// A server a chaos action hit (cluster_chaos.h).
struct ServerHit {
  double at = 0;
  int server = 0;
  std::string what = {};
};

// Not copyable. Finish() from the creating thread; `etcd` must outlive it.
class OwnerWatch {
 public:
  // Polls every `period`: the owner keys and server keys under `prefix` (two reads) and
  // the shard count once.
  OwnerWatch(etcd::EtcdClient& etcd, std::string prefix, std::vector<std::string> addresses,
             std::vector<std::string> tenants, std::chrono::steady_clock::time_point start,
             absl::Duration period = absl::Milliseconds(100));
  ~OwnerWatch();

  // Stops polling; returns the first sample and every sample where an owner changed.
  std::vector<OwnerSample> Finish();

 private:
  void Poll(std::stop_token stop);

  etcd::EtcdClient& etcd_;
  const std::string prefix_;
  const std::vector<std::string> addresses_;
  const std::vector<std::string> tenants_;
  const std::chrono::steady_clock::time_point start_;
  const absl::Duration period_;
  std::vector<OwnerSample> samples_;  // written by thread_ until it is joined
  std::jthread thread_;
};

// A tenant's longest time without an answer of its owner, over all its clients, and when it
// ended (seconds from the run's start): the report's ungranted_gap_max_seconds and
// granted_again_at_seconds.
struct GrantGapView {
  double longest = 0;
  double ended_at = 0;
};

// For each hit: the tenants its server owned at the hit (the last sample at or before it), the
// longest wait of those for a new owner (another server, or the same one after the owner key
// was gone: a restarted server that took the shard back), and the longest time from a tenant's
// new owner to the end of its clients' gap around it: `gaps[tenant]` when that gap spans the
// new owner's arrival (within one poll), else 0 (the tenant's clients were off the lease
// protocol around this loss for at most its longest gap, which lies elsewhere).
std::vector<OwnerLoss> OwnerLosses(const std::vector<OwnerSample>& samples,
                                   const std::vector<ServerHit>& hits,
                                   const std::vector<GrantGapView>& gaps);

// The longest stretch any tenant's shard had no owner key (kNoOwnerKey), up to `end`.
double MaxSecondsWithoutOwnerKey(const std::vector<OwnerSample>& samples, double end);

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_OWNER_WATCH_H_
