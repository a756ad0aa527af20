// What makes a retried Sync get the very same answer: the response last sent to an instance,
// kept as plain records, and a fingerprint of the request it answered. The fingerprint is a
// fixed 64-bit hash over a canonical walk of the request, the same in every process and build,
// so a snapshot's fingerprint still matches an exact replay after a clean restart; a change of
// the function is a new kFingerprintVersion, and the previous one is kept for the snapshots
// written with it.
#ifndef RETRYBUDGET_SERVER_REPLAY_CACHE_H_
#define RETRYBUDGET_SERVER_REPLAY_CACHE_H_

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "retrybudget/v1/budget.pb.h"
#include "server/policy.h"
#include "server/ref_ptr.h"
#include "server/tenant_state.h"

namespace retrybudget {

// A fixed 64-bit hash: the same value for the same input in every process, build and platform.
// Not a cryptographic hash (its inputs are a client's own requests and configured names).
class StableHasher {
 public:
  void Add(uint64_t v);
  // Length first, so ("ab","c") and ("a","bc") differ.
  void Add(absl::string_view s);
  uint64_t Finish() const;
  // The final mix (splitmix64's finaliser), a bijection; WordHasher ends with it too.
  static uint64_t Mix(uint64_t z);

 private:
  void Byte(uint8_t b);
  uint64_t h_ = 0xcbf29ce484222325ULL;  // FNV-1a offset basis
};

// StableHasher over `s` alone (principals).
uint64_t StableHash(absl::string_view s);

// The same kind of hash, a 64-bit word at a time (strings: their length, then their bytes as
// little-endian words, the last one zero-filled): ~6 cycles a word where FNV-1a takes ~4 a
// byte. Each step is a bijection of the state for a given word, so two inputs that differ in
// one word never collide.
class WordHasher {
 public:
  void Add(uint64_t v) {
    uint64_t x = (h_ ^ v) * 0x9e3779b97f4a7c15ULL;  // odd: a bijection
    h_ = x ^ (x >> 32);
  }
  void Add(absl::string_view s);
  uint64_t Finish() const;

 private:
  uint64_t h_ = 0x243f6a8885a308d3ULL;
};

// The fingerprint of the current version, kept by a snapshot with the version's number
// (v1::InstanceState.fingerprint_version).
inline constexpr uint32_t kFingerprintVersion = 2;

// Identifies a request's content, to tell a retry (same seq, same content) from a client bug
// (same seq, different content). Walks every field of the request (the counters through
// kCumulativeCounters), a word at a time (WordHasher).
uint64_t Fingerprint(const v1::SyncRequest& request);

// Version 1, the same walk a byte at a time (StableHasher): what snapshots written before
// version 2 hold (fingerprint_version 0). A Sync (~20 words for one tenant entry) spent ~20% of
// its time in it.
uint64_t FingerprintV1(const v1::SyncRequest& request);

// One entry of the response last sent to an instance, kept so that an exact retry gets the very
// same answer. Plain fields rather than a copy of the proto: the records of a steady instance are
// overwritten in place, so keeping them allocates nothing. Every instance keeps one per tenant it
// syncs, so what the response derives from the budget's policy (the lease TTL, the capacity, the
// safe share) is not stored: the record keeps the interned, immutable policy it was granted under
// and the fleet size the safe share divided among, and WriteResponse computes them again with the
// same function, to the same bits (and the mode, from the same policy). The rare entries, a refusal or a record read back from a
// snapshot, are kept whole behind a pointer in the policy's place (112 bytes a record with the
// values and the tenant's name as a string; 40 now).
class GrantRecord {
 public:
  // A refusal, or a record read back from a snapshot (an older binary may have computed its
  // values otherwise: they are kept as they were sent).
  struct Cold {
    std::string tenant;
    int32_t code = 0;  // google.rpc.Code of a refusal; 0 for a restored grant
    std::string message;
    std::string owner;  // TenantError.owner
    // A restored grant's values.
    uint64_t granted = 0;
    int64_t lease_ttl_ms = 0;
    int64_t next_sync_ms = 0;
    double safe_capacity = 0;
    double safe_refill_per_second = 0;
    double safe_success_credit = 0;
    double safe_request_credit = 0;
    double capacity = 0;
    v1::Mode mode = v1::MODE_UNSPECIFIED;
  };

  // A grant's values (a restored one keeps its others in Cold; a refusal sends none).
  double bucket_tokens = 0;
  // At most the entry's want, which is at most CoreOptions::max_want <= UINT32_MAX.
  uint32_t granted = 0;
  // At most max_next_sync (300 s): 31 bits.
  uint32_t next_sync_ms : 31 = 0;
  // A windowed policy could not carry the instance's tokens into a new lease: the answer ends
  // its lease at once (lease_ttl_ms = 0; the tokens come back in its next Sync).
  uint32_t lease_ends_now : 1 = 0;
  // The fleet the safe share was divided among (SafeShare), at least 1.
  uint32_t fleet = 1;
  uint32_t active_instances = 0;

  GrantRecord() { new (&cold_) std::unique_ptr<Cold>(); }
  GrantRecord(GrantRecord&& other) noexcept;
  GrantRecord& operator=(GrantRecord&& other) noexcept;
  ~GrantRecord() { DestroyRest(); }

  // The budget that granted the entry (its name is the entry's tenant) and the policy in force
  // then; null for a cold record.
  const core_internal::Tenant* budget() const { return budget_.get(); }
  const InternedPolicy* policy() const { return budget_ != nullptr ? policy_.get() : nullptr; }
  // The refusal or restored record; null for a grant.
  const Cold* cold() const { return budget_ == nullptr ? cold_.get() : nullptr; }
  // The entry's tenant ("" for a record never set).
  absl::string_view tenant() const;

  // Records a grant of `by` (not null) under `under` (not null; the caller holds the budget's
  // lock, which guards its policy). References change only when the budget or its policy did:
  // a steady instance's record takes no atomic operation.
  void SetGrantedBy(const RefPtr<core_internal::Tenant>& by, const PolicyRef& under);
  // Records a refusal of `tenant`'s entry (the values of a grant are then not sent).
  void Refuse(absl::string_view tenant, int32_t code, std::string message, std::string owner = "");
  // Keeps `cold`, a record read back from a snapshot.
  void SetCold(std::unique_ptr<Cold> cold);

 private:
  void DestroyRest();  // ends the union's member in use

  // Null for a cold record, which is what tells the union's members apart.
  RefPtr<core_internal::Tenant> budget_;
  union {
    PolicyRef policy_;             // with a budget
    std::unique_ptr<Cold> cold_;   // without one (null for a record never set)
  };
};

// The response `records` describe (a fresh one, a replay, or a snapshot's copy), and back.
void WriteResponse(absl::Span<const GrantRecord> records, v1::SyncResponse* response);
using GrantRecords = absl::InlinedVector<GrantRecord, 1>;
void ReadResponse(const v1::SyncResponse& response, GrantRecords* records);

// Clears `response` (not on an arena) for reuse, keeping its entries' safe_share submessages
// for the responses WriteResponse writes next on this thread. protobuf's Clear() deletes a
// message's submessages, so a reused response of 8 entries made and freed 8 of them per Sync
// (~1.6k of its ~91k instructions). A thread keeps at most kKeptSafeShares of them.
inline constexpr size_t kKeptSafeShares = 64;
void ClearForReuse(v1::SyncResponse* response);
// The safe_share submessages this thread keeps (tests).
size_t KeptSafeSharesOnThisThread();

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_REPLAY_CACHE_H_
