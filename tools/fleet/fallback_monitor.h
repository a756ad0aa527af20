// Watches one tenant's client mode (TenantStats::mode) from the worker's side and turns it into
// what the fleet's verdict needs while the budget server is unreachable:
//  * how long the client was in fallback, in how many episodes;
//  * the fallback allowance: what the client's local bucket may have handed out, from the
//    SafeShare it actually used (DESIGN.md, "When the server is unreachable"). Each episode's
//    bucket starts full, so per episode
//        allowance = capacity' + refill_per_second * episode_seconds
//    where capacity' is the share's capacity, raised to 1 token when the share refills at all
//    (client/cpp/fallback_bucket.h: a share below one token may grow to one whole token);
//  * a phase the worker's threads read without a lock, to count their own retries in and after
//    fallback.
//
// Polled, not notified (the client publishes no events): episode times are stretched outwards to
// the neighbouring polls (an episode is taken to start just after the last poll that did not
// see it), so the allowance errs on the generous side by at most refill * period per episode;
// an episode seen by neither poll is detected from TenantStats::fallback_allowed growing between
// them; a grant to this tenant observed during an episode (TenantStats::tokens_received grew) is
// counted as the end of one episode and the start of another: the client left fallback for a
// lease and may have entered it again with a full bucket. A Sync answered without a grant for
// the tenant (in a cluster whose shard has no owner, e.g. while etcd has no quorum, every Sync
// succeeds and each entry is UNAVAILABLE) leaves the client in fallback with the same bucket
// (client/cpp/tenant_budget_impl.cc: a bucket is made only on entering fallback, and fallback is
// left only for a lease), so it does not count as a new episode.
//
//   FallbackMonitor monitor(*budget, [&] { return observer->FallbackShare(tenant); });
//   monitor.Start(absl::Milliseconds(5));
//   ... workers read monitor.phase() ...
//   FallbackReport report = monitor.Finish();
#ifndef RETRYBUDGET_TOOLS_FLEET_FALLBACK_MONITOR_H_
#define RETRYBUDGET_TOOLS_FLEET_FALLBACK_MONITOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"

namespace retrybudget::fleet {

// A SafeShare as received: this instance's share of the tenant's capacity and refill.
struct SafeShareView {
  double capacity = 0;           // tokens
  double refill_per_second = 0;  // tokens per second
};

// Where the watched client stands, as last polled.
enum class FallbackPhase : int {
  kBeforeFallback = 0,  // never seen in fallback yet
  kInFallback = 1,      // in fallback now
  kAfterFallback = 2,   // not in fallback now, but was
};

struct FallbackReport {
  double fallback_seconds = 0;    // total episode time (stretched to the polls)
  uint64_t fallback_entries = 0;  // episodes
  double fallback_allowance = 0;  // sum over episodes of capacity' + refill * seconds
  // The share of the last episode (the one the allowance used); 0 when none.
  double safe_share_capacity = 0;
  double safe_share_refill = 0;
  // The client was seen with a lease (TenantStats::mode == kLease) after a fallback episode.
  bool lease_after_fallback = false;
};

// What the monitor needs to know of the client besides its Stats(): the share its fallback bucket
// gets from the SafeShares received (SyncObservingStub::FallbackShare). Called on the monitor's
// thread.
struct FallbackSources {
  std::function<std::optional<SafeShareView>()> safe_share = nullptr;
  // The bucket of a client that never received a SafeShare (ClientOptions defaults).
  SafeShareView never_reached = {.capacity = 1, .refill_per_second = 0.1};
};

// Thread-safe: Poll()/Start()/Finish() from any thread, phase() lock-free.
class FallbackMonitor {
 public:
  // `budget` must outlive the monitor. `clock`: Clock::Real() if null.
  FallbackMonitor(const TenantBudget& budget, FallbackSources sources, Clock* clock = nullptr);
  ~FallbackMonitor();  // stops the thread

  // Polls every `period` on a thread of its own until Finish().
  void Start(absl::Duration period);

  // One poll at `now` (the thread calls it; tests call it directly with a fake clock).
  void Poll(absl::Time now);

  // Stops the thread, closes an open episode at the clock's now, and returns the totals.
  FallbackReport Finish();

  FallbackPhase phase() const { return phase_.load(std::memory_order_relaxed); }

 private:
  void OpenEpisodeLocked(absl::Time start) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEpisodeLocked(absl::Time end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TenantBudget& budget_;
  const FallbackSources sources_;
  Clock* const clock_;
  std::atomic<FallbackPhase> phase_{FallbackPhase::kBeforeFallback};

  Mutex mu_;
  FallbackReport report_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> last_poll_ ABSL_GUARDED_BY(mu_);
  uint64_t last_fallback_allowed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_tokens_received_ ABSL_GUARDED_BY(mu_) = 0;
  // The open episode: its start and the share it uses.
  std::optional<absl::Time> episode_start_ ABSL_GUARDED_BY(mu_);
  SafeShareView episode_share_ ABSL_GUARDED_BY(mu_);

  std::jthread thread_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FALLBACK_MONITOR_H_
