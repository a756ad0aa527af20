// What makes a retried Sync get the very same answer: the response last sent to an instance,
// kept as plain records, and a fingerprint of the request it answered. The fingerprint is a
// fixed 64-bit hash (FNV-1a with a final mix) over a canonical walk of the request, the same in
// every process and build, so a snapshot's fingerprint still matches an exact replay after a
// clean restart.
#ifndef RETRYBUDGET_SERVER_REPLAY_CACHE_H_
#define RETRYBUDGET_SERVER_REPLAY_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget {

// A fixed 64-bit hash: the same value for the same input in every process, build and platform.
// Not a cryptographic hash (its inputs are a client's own requests and configured names).
class StableHasher {
 public:
  void Add(uint64_t v);
  // Length first, so ("ab","c") and ("a","bc") differ.
  void Add(absl::string_view s);
  uint64_t Finish() const;

 private:
  void Byte(uint8_t b);
  uint64_t h_ = 0xcbf29ce484222325ULL;  // FNV-1a offset basis
};

// StableHasher over `s` alone (principals).
uint64_t StableHash(absl::string_view s);

// Identifies a request's content, to tell a retry (same seq, same content) from a client bug
// (same seq, different content). Walks every field of the request (the counters through
// kCumulativeCounters).
uint64_t Fingerprint(const v1::SyncRequest& request);

// One entry of the response last sent to an instance. Plain fields rather than a copy of the
// proto: the records of a steady instance are overwritten in place, so keeping them allocates
// nothing.
struct GrantRecord {
  std::string tenant;
  uint64_t granted = 0;
  int64_t lease_ttl_ms = 0;
  int64_t next_sync_ms = 0;
  double safe_capacity = 0;
  double safe_refill_per_second = 0;
  double safe_success_credit = 0;
  double bucket_tokens = 0;
  double capacity = 0;
  uint32_t active_instances = 0;
  // Set when the entry was refused on its own. Behind a pointer: refusals are rare, and every
  // instance keeps a record per tenant it syncs (their strings were a third of the record).
  struct Refusal {
    int32_t code = 0;  // google.rpc.Code, never 0
    std::string message;
    std::string owner;  // TenantError.owner
  };
  std::unique_ptr<Refusal> error;

  void Refuse(int32_t code, std::string message, std::string owner = "") {
    error = std::make_unique<Refusal>(Refusal{code, std::move(message), std::move(owner)});
  }
};

// The response `records` describe (a fresh one, a replay, or a snapshot's copy), and back.
void WriteResponse(absl::Span<const GrantRecord> records, v1::SyncResponse* response);
using GrantRecords = absl::InlinedVector<GrantRecord, 1>;
void ReadResponse(const v1::SyncResponse& response, GrantRecords* records);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_REPLAY_CACHE_H_
