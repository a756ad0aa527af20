// A client instance played with raw Sync RPCs, for the tests that count what servers grant: it
// syncs its tenants and spends every token it is granted at once (each Sync reports
// tokens_received == retries_spent == all it was granted so far), so a server's bucket is drained
// as fast as it refills and every grant is counted.
//
//   SyncSpender spender({"payments"}, {.instance_id = "spender-1"});
//   SyncSpender::Answer answer = spender.Sync(*stub);
//   if (answer.ok()) { ... spender.received("payments") ... }
//
// Thread-compatible: one thread at a time uses an instance.
#ifndef RETRYBUDGET_TESTS_SUPPORT_SYNC_SPENDER_H_
#define RETRYBUDGET_TESTS_SUPPORT_SYNC_SPENDER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::testing {

struct SyncSpenderOptions {
  std::string instance_id = "spender";
  // Each tenant's `want` in every Sync.
  uint64_t want = 10;
  // Each Sync's deadline, from when it is sent.
  absl::Duration timeout = absl::Seconds(2);
};

class SyncSpender {
 public:
  SyncSpender(std::vector<std::string> tenants, SyncSpenderOptions options);

  // What one Sync got.
  struct Answer {
    grpc::Status rpc;
    v1::SyncResponse response;  // as received when rpc.ok()
    int tenants = 0;            // how many the request synced
    // Entries without an error: their grants were counted.
    int granted_entries = 0;

    // The RPC succeeded and an entry for each tenant came back, none with an error.
    bool ok() const {
      return rpc.ok() && response.tenants_size() == tenants && granted_entries == tenants;
    }
  };

  // Sends one Sync of every tenant (the next seq) through `stub` and counts the grants of the
  // entries without an error.
  Answer Sync(v1::RetryBudgetService::StubInterface& stub);

  // All `tenant` was granted so far (0 for a tenant not synced).
  uint64_t received(const std::string& tenant) const;
  // All every tenant was granted so far.
  uint64_t received_total() const;
  const std::map<std::string, uint64_t>& received_by_tenant() const { return received_; }

 private:
  const std::vector<std::string> tenants_;
  const SyncSpenderOptions options_;
  uint64_t seq_ = 0;
  std::map<std::string, uint64_t> received_;
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_SUPPORT_SYNC_SPENDER_H_
