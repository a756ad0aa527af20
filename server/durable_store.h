// The files in --data_dir that make the in-memory store durable:
//   state.snapshot        the last snapshot (retrybudget.v1.ServerState), replaced atomically
//   journal.<N>.log       reservations appended after the snapshot, fdatasync'ed one by one
// Each file is a sequence of framed records: magic, length, CRC-32, payload. A snapshot that is
// truncated or fails its checksum is refused (DATA_LOSS); so is a damaged journal record, except
// a torn last record of the newest journal (a crash in the middle of an append, whose
// reservation was therefore never used).
#ifndef RETRYBUDGET_SERVER_DURABLE_STORE_H_
#define RETRYBUDGET_SERVER_DURABLE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/state.pb.h"

namespace retrybudget {

// What a data directory held at start-up.
struct RecoveredState {
  std::optional<v1::ServerState> snapshot;
  // Highest grant limit journaled per tenant after the snapshot.
  absl::flat_hash_map<std::string, uint64_t> reservations;
};

// Thread-safe.
class DurableStore {
 public:
  // Creates `dir` if missing and checks it is writable. Does not read anything yet.
  static absl::StatusOr<std::unique_ptr<DurableStore>> Open(const std::string& dir);
  ~DurableStore();

  // Reads the snapshot and the journals after it. An empty directory gives an empty state.
  // DATA_LOSS naming the file and what is wrong for damaged files. Call once, before Reserve.
  absl::StatusOr<RecoveredState> Load();

  // Appends "`tenant` may grant up to `grant_limit` tokens" to the current journal and returns
  // once it is on disk. The caller grants beyond its old limit only after this returns OK.
  absl::Status Reserve(absl::string_view tenant, uint64_t grant_limit);

  // Starts a new journal file and returns its number: reservations made from now on go to it.
  // The snapshot taken next records that number as its journal_start.
  absl::StatusOr<uint64_t> RotateJournal();

  // Writes `state` atomically (temp file, fsync, rename, fsync of the directory), then deletes
  // the journals numbered below state.journal_start().
  absl::Status WriteSnapshot(const v1::ServerState& state);

  const std::string& dir() const { return dir_; }

 private:
  explicit DurableStore(std::string dir);
  absl::Status OpenJournal(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  Mutex mu_;
  int journal_fd_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t journal_number_ ABSL_GUARDED_BY(mu_) = 0;
};

// CRC-32 (IEEE) of `data`, for the record frames.
uint32_t Crc32(absl::string_view data);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_DURABLE_STORE_H_
