// The refresher: the C++ client's driver of its SyncEngine (sync_engine.h): a thread that runs
// the engine's steps on the engine's schedule (and at once when woken), and the Sync RPCs they
// plan, to the main target or to the owners a cluster redirects to; the final Sync at shutdown.
#ifndef RETRYBUDGET_CLIENT_REFRESHER_H_
#define RETRYBUDGET_CLIENT_REFRESHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>

#include <grpcpp/client_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/cpp/client_metrics.h"
#include "client/cpp/refresh_policy.h"
#include "client/cpp/sync_engine.h"
#include "client/cpp/tenant_budget_impl.h"
#include "client/cpp/tenant_registry.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::client_internal {

// Makes the stub for a server the client was redirected to (HOST:PORT), with the same
// credentials and channel arguments as the main target's.
using StubFactory = std::function<std::unique_ptr<v1::RetryBudgetService::StubInterface>(
    const std::string& address)>;

struct RefresherOptions {
  std::string instance_id;
  RefreshPolicy policy;
  absl::Duration sync_timeout = absl::Seconds(1);
  // Sent as `authorization: Bearer <token>` with every Sync when non-empty.
  std::string bearer_token;
  // Stubs for owner addresses named in redirects; null: redirects are not followed (the
  // tenant is handled as UNAVAILABLE).
  StubFactory owner_stubs;
};

// The stubs of the owners' routes, made by RefresherOptions::owner_stubs when the engine opens
// a route. Not thread-safe: the refresher uses it under its mutex.
class OwnerStubs final : public OwnerChannels {
 public:
  explicit OwnerStubs(StubFactory factory) : factory_(std::move(factory)) {}
  bool Open(const std::string& address) override;
  void Close(const std::string& address) override { stubs_.erase(address); }
  // The stub of an open route; null when none.
  v1::RetryBudgetService::StubInterface* Get(const std::string& address) const;

 private:
  const StubFactory factory_;
  absl::flat_hash_map<std::string, std::unique_ptr<v1::RetryBudgetService::StubInterface>>
      stubs_;
};

// Thread-safe. RunOnce() is one engine step with its RPCs; Start() runs it on a background
// thread that sleeps (through the Clock) until the next step is due or Wake() interrupts it.
// Tests call RunOnce() themselves instead of Start(), with a FakeClock and a mock stub.
//
// The protocol's decisions are the engine's (sync_engine.h); the refresher sends what it plans,
// each attempt with its own deadline (wall-clock time, gRPC's, never the injected Clock),
// wait_for_ready flag and credentials, and tells it what came back. Wake() cancels an attempt
// waiting for the channel to connect (the engine then resends it at once: a worker wants a
// lease now, or a tenant was created).
//
// Why wait_for_ready once an attempt failed (fail-fast-then-wait-for-ready): while an attempt
// waits, its thread drives the new connection's handshake; a fail-fast call on a channel in
// TRANSIENT_FAILURE fails at once, and nothing but gRPC's backup poller, every 5 s, would read
// the new connection's SETTINGS. With the backoff counted from the attempt's start, the
// refresher keeps waiting on the channel during an outage, and a restarted server is seen as
// soon as the channel reconnects. The first attempt after a success is fail-fast, so a refused
// connection is known at once (tenants whose lease ends fall back without waiting for a
// deadline).
class Refresher final : public SyncWaker {
 public:
  // `stub`, owned. `clock` and `tenants` (not owned) must outlive the refresher. `metrics`,
  // owned, is updated after every step (NoClientMetrics if null).
  Refresher(RefresherOptions options, std::unique_ptr<v1::RetryBudgetService::StubInterface> stub,
            Clock* clock, TenantRegistry* tenants,
            std::unique_ptr<ClientMetrics> metrics = nullptr);
  // Stops the thread if Shutdown() was not called (without a final Sync).
  ~Refresher() override;

  Refresher(const Refresher&) = delete;
  Refresher& operator=(const Refresher&) = delete;

  // Starts the background thread. Call at most once.
  void Start();

  // One step at clock->Now(): steps every tenant (ends expired leases, enters, refills or leaves
  // fallback), then sends the Sync attempts the engine plans (each blocking for at most
  // sync_timeout, and never past the next lease expiry or fallback step), steps the tenants
  // again with their outcomes, and updates the metrics. Returns when the next step is due (a
  // sync, a retry, a lease expiry or the next fallback token); InfiniteFuture when nothing is
  // scheduled (no tenants, or shut down).
  absl::Time RunOnce();

  // Interrupts the thread's sleep so that it re-plans at once (a worker found a lease low or
  // empty, or a tenant was created). Cheap; callable from any thread.
  void Wake() override;

  // Stops the thread, then sends the final Sync (final=true, every counter, every unspent token
  // returned, want 0), at most kFinalSyncAttempts times with the same seq, each bounded by
  // sync_timeout. Returns the status of the final Sync (OK when there was no tenant to report).
  // Idempotent: later calls return the first result.
  absl::Status Shutdown();

  // For tests: whether Wake() was called since the last RunOnce() began.
  bool wake_requested() const;
  // For tests: the seq of the last request built (0 before the first).
  uint64_t last_seq() const;
  // For tests: status of the last Sync attempt (OK before the first).
  absl::Status last_sync_status() const;

 private:
  void Loop();
  void StopThread();
  absl::Status FinalSyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one attempt to `address` ("" : the main target) with a deadline `timeout` from now.
  // With `cancellable` and `wait_for_ready`, Wake() may cancel it (outcome.woken).
  AttemptOutcome SendLocked(const std::string& address, const v1::SyncRequest& request,
                            absl::Duration timeout, bool wait_for_ready, bool cancellable)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RefresherOptions options_;
  const std::unique_ptr<v1::RetryBudgetService::StubInterface> stub_;
  Clock* const clock_;
  TenantRegistry* const tenants_;
  const std::unique_ptr<ClientMetrics> metrics_;

  // Held for a whole step (including its RPCs): steps never overlap.
  mutable Mutex mu_;
  OwnerStubs owner_stubs_ ABSL_GUARDED_BY(mu_);
  SyncEngine engine_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  // Sleep / wake of the thread.
  mutable Mutex wake_mu_;
  bool wake_pending_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::stop_source* sleep_stop_ ABSL_GUARDED_BY(wake_mu_) = nullptr;  // the sleep in progress
  // The wait_for_ready attempt in progress (Wake() cancels it), and whether Wake() did.
  grpc::ClientContext* waiting_call_ ABSL_GUARDED_BY(wake_mu_) = nullptr;
  bool waiting_call_woken_ ABSL_GUARDED_BY(wake_mu_) = false;

  // Serialises Shutdown() callers (the thread is joined under it).
  Mutex shutdown_mu_;
  std::thread thread_ ABSL_GUARDED_BY(shutdown_mu_);
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_REFRESHER_H_
