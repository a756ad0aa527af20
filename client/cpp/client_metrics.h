// What the refresher tells the client's metrics, behind a small interface: the library itself
// never touches prometheus-cpp (that lives in prometheus_client_metrics.*, its own target).
#ifndef RETRYBUDGET_CLIENT_CLIENT_METRICS_H_
#define RETRYBUDGET_CLIENT_CLIENT_METRICS_H_

#include <string>

#include "absl/status/status.h"

#include "retrybudget/client.h"

namespace retrybudget::client_internal {

// Called by the refresher only (never on the hot path), one step at a time; implementations
// need not be thread-safe towards each other's calls but must tolerate being read (scraped)
// concurrently.
class ClientMetrics {
 public:
  virtual ~ClientMetrics() = default;

  // One Sync attempt ended (the final Sync's attempts included); `ok` when it got a response.
  virtual void SyncAttempted(bool ok) = 0;

  // One Sync attempt failed with `code` (after SyncAttempted(false)).
  virtual void SyncFailed(absl::StatusCode /*code*/) {}

  // A server answered a tenant entry with the address of the tenant's owner (cluster mode).
  virtual void Redirected() {}

  // The tenant's counters after a refresher step (cumulative; retries_allowed may dip after a
  // Refund(), which a counter must not show).
  virtual void TenantUpdated(const std::string& tenant, const TenantStats& stats) = 0;
};

// The default: records nothing.
class NoClientMetrics final : public ClientMetrics {
 public:
  void SyncAttempted(bool) override {}
  void TenantUpdated(const std::string&, const TenantStats&) override {}
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_CLIENT_METRICS_H_
