// A RetryBudgetService stub that forwards every call to a real stub and remembers what the
// worker's client was told: the SafeShares the server sent for each tenant (the client's local
// fallback bucket is the smallest of the kSafeShareMemory before the last one, client.h) and how
// many Sync attempts succeeded or failed. The fleet's workers hand it to
// CreateBudgetClientForTesting() so that the harness can state the fallback allowance from what
// each client actually received, without trusting the library's books.
//
//   auto observing = std::make_unique<SyncObservingStub>(v1::RetryBudgetService::NewStub(ch));
//   SyncObservingStub* observer = observing.get();
//   auto client = CreateBudgetClientForTesting(options, std::move(observing), true);
//   ...
//   std::optional<SafeShareView> share = observer->FallbackShare("fleet");
#ifndef RETRYBUDGET_TOOLS_FLEET_OBSERVING_STUB_H_
#define RETRYBUDGET_TOOLS_FLEET_OBSERVING_STUB_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "retrybudget/client.h"
#include "retrybudget/mutex.h"
#include "retrybudget/recent_extreme.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tools/fleet/fallback_monitor.h"

namespace retrybudget::fleet {

// Thread-safe. Only the blocking Sync is observed; the async forms are forwarded unobserved
// (the client library uses the blocking one).
class SyncObservingStub final : public v1::RetryBudgetService::StubInterface {
 public:
  explicit SyncObservingStub(std::unique_ptr<v1::RetryBudgetService::StubInterface> inner);

  // A stub over `inner` (an owner's, cluster mode) that records into this one's observations:
  // the client's Syncs to every owner count as one client's.
  std::unique_ptr<SyncObservingStub> Sibling(
      std::unique_ptr<v1::RetryBudgetService::StubInterface> inner) const;

  grpc::Status Sync(grpc::ClientContext* context, const v1::SyncRequest& request,
                    v1::SyncResponse* response) override;
  async_interface* async() override { return inner_->async(); }

  // The fallback bucket the client's rule gives `tenant` from the SafeShares of the successful,
  // non-stale responses that granted it without a per-tenant error: the smallest of the
  // kSafeShareMemory before the last one. nullopt when none came yet.
  std::optional<SafeShareView> FallbackShare(absl::string_view tenant);
  uint64_t syncs_ok() const;
  uint64_t syncs_failed() const;

  // The longest time between two answers for `tenant` without a per-tenant error (the owner
  // answered: the tenant is on the lease protocol), counting the time since the last one up to
  // `now`, and when it ended (`now` when it has not). nullopt before the first answer.
  struct GrantGap {
    absl::Duration longest;
    absl::Time ended_at;
  };
  std::optional<GrantGap> LongestGrantGap(absl::string_view tenant, absl::Time now) const;

  // When the answers for `tenant` changed its mode, in order: the receipt of the first entry
  // without error whose TenantGrant.mode (MODE_SHADOW: shadow, else enforce) differed from the
  // mode before, starting from enforce (a client's mode until its first answer; the rule
  // shadow.mode-from-response). Alternately to shadow and back to enforce.
  std::vector<absl::Time> ModeChanges(absl::string_view tenant) const;

 private:
  grpc::ClientAsyncResponseReaderInterface<v1::SyncResponse>* AsyncSyncRaw(
      grpc::ClientContext* context, const v1::SyncRequest& request,
      grpc::CompletionQueue* cq) override;
  grpc::ClientAsyncResponseReaderInterface<v1::SyncResponse>* PrepareAsyncSyncRaw(
      grpc::ClientContext* context, const v1::SyncRequest& request,
      grpc::CompletionQueue* cq) override;

  struct SmallerShare {
    SafeShareView operator()(const SafeShareView& a, const SafeShareView& b) const;
  };
  struct Shares {
    RecentExtreme<SafeShareView, SmallerShare, kSafeShareMemoryMillis> recent;
    absl::Time last_at;
  };
  struct Answers {
    absl::Time last_at;
    bool shadow = false;
    std::vector<absl::Time> mode_changes;
    absl::Duration longest_gap = absl::ZeroDuration();
    absl::Time longest_ended_at;
  };
  // What every sibling records into.
  struct Observations {
    mutable Mutex mu;
    absl::flat_hash_map<std::string, Shares> safe_shares ABSL_GUARDED_BY(mu);
    absl::flat_hash_map<std::string, Answers> answers ABSL_GUARDED_BY(mu);
    uint64_t syncs_ok ABSL_GUARDED_BY(mu) = 0;
    uint64_t syncs_failed ABSL_GUARDED_BY(mu) = 0;
  };
  SyncObservingStub(std::unique_ptr<v1::RetryBudgetService::StubInterface> inner,
                    std::shared_ptr<Observations> observations);

  const std::unique_ptr<v1::RetryBudgetService::StubInterface> inner_;
  const std::shared_ptr<Observations> observed_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_OBSERVING_STUB_H_
