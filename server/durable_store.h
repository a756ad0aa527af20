// The files in --data_dir that make the in-memory store durable:
//   state.snapshot        the last snapshot (retrybudget.v1.ServerState), replaced atomically
//   journal.<N>.log       reservations appended after the snapshot, fdatasync'ed one by one
// Each file is a sequence of framed records: magic, length, CRC-32, payload. A snapshot that is
// truncated or fails its checksum is refused (DATA_LOSS); so is a damaged journal record, except
// a torn last record of a journal: a crash, or a failed write or fdatasync, in the middle of an
// append, whose reservation was therefore never used. A journal is never appended to after a
// failed append (the next record starts a new journal file), so a tear is only ever at the end
// of a file, and a transient disk error never stops the next start.
#ifndef RETRYBUDGET_SERVER_DURABLE_STORE_H_
#define RETRYBUDGET_SERVER_DURABLE_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/state.pb.h"

namespace retrybudget {

// The system calls the journal makes, virtual so that tests can make them fail or stall. The
// defaults are the real calls.
class JournalIo {
 public:
  virtual ~JournalIo() = default;
  // As write(2).
  virtual ssize_t Write(int fd, const char* data, size_t size);
  // As fdatasync(2).
  virtual int DataSync(int fd);
};

struct DurableStoreOptions {
  // Not owned; must outlive the store. Null: the real calls.
  JournalIo* io = nullptr;
};

// What a data directory held at start-up.
struct RecoveredState {
  std::optional<v1::ServerState> snapshot;
  // Highest grant limit journaled per tenant after the snapshot.
  absl::flat_hash_map<std::string, uint64_t> reservations;
  // Highest credited_total journaled per tenant after the snapshot (tenants with a positive one).
  absl::flat_hash_map<std::string, double> credited;
};

// Thread-safe. Owns one thread, the store thread, which writes the reservations asked for with
// ReserveAhead: each batch of them is written with one fdatasync (group commit), off every lock
// of the caller.
class DurableStore {
 public:
  // Creates `dir` if missing and checks it is writable. Does not read anything yet.
  static absl::StatusOr<std::unique_ptr<DurableStore>> Open(const std::string& dir,
                                                            DurableStoreOptions options = {});
  ~DurableStore();

  // Reads the snapshot and the journals after it. An empty directory gives an empty state.
  // DATA_LOSS naming the file and what is wrong for damaged files. Call once, before Reserve.
  absl::StatusOr<RecoveredState> Load();

  // Appends "`tenant` may grant up to `grant_limit` tokens" to the current journal and returns
  // once it is on disk. The caller grants beyond its old limit only after this returns OK. On an
  // error the record may or may not be on disk (either way the next start is safe: a limit is
  // only ever counted as granted); the journal is cut back to its last good record where
  // possible and abandoned, and the next record goes to a new journal file.
  // `credited_total` goes into the record (v1::Reservation).
  absl::Status Reserve(absl::string_view tenant, uint64_t grant_limit, double credited_total = 0);

  // Called on the store thread with the limit that was written for a tenant, once it is on disk
  // (OK) or once writing it failed (the limit is then not durable).
  using ReservedCallback =
      std::function<void(const std::string& tenant, uint64_t grant_limit, const absl::Status&)>;

  // Asks the store thread to journal "`tenant` may grant up to `grant_limit`" (with the
  // tenant's `credited_total`), and returns at once: never blocks on I/O. A request for a tenant
  // whose queued request is not written yet is merged into it (the highest limit and credit, the
  // latest `done`); one at or below the limit being
  // written now is dropped (that write's `done` covers it). `done` runs on the store thread,
  // after the record's own fdatasync, and before a RotateJournal that follows can return.
  void ReserveAhead(absl::string_view tenant, uint64_t grant_limit, double credited_total,
                    ReservedCallback done);

  // Blocks until every ReserveAhead made before the call has been written (or has failed) and
  // its `done` has returned.
  void WaitIdle();

  // Starts a new journal file and returns its number: reservations made from now on go to it.
  // The snapshot taken next records that number as its journal_start. Waits for a batch the
  // store thread is writing, and its callbacks: every reservation in an older journal has been
  // handed to its `done` when this returns.
  absl::StatusOr<uint64_t> RotateJournal();

  // Writes `state` atomically (temp file, fsync, rename, fsync of the directory), then deletes
  // the journals numbered below state.journal_start().
  absl::Status WriteSnapshot(const v1::ServerState& state);

  const std::string& dir() const { return dir_; }

 private:
  DurableStore(std::string dir, DurableStoreOptions options);
  absl::Status OpenJournal(uint64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `records` at the end of the current journal (opening the next one if none is open)
  // and fdatasyncs it. On failure, abandons the journal (AbandonJournal).
  absl::Status AppendDurably(const std::string& records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cuts the current journal back to its last good record (best effort) and closes it: the next
  // append starts a new file. A retried fdatasync may report success for data that was lost, so
  // a file whose append failed is never written again.
  void AbandonJournal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Request {
    uint64_t grant_limit = 0;
    double credited_total = 0;
    ReservedCallback done;
  };
  void StoreThread();

  const std::string dir_;
  JournalIo* const io_;

  // The queue of the store thread. A leaf lock: taken under the callers' locks, never while
  // holding another.
  Mutex queue_mu_;
  std::condition_variable_any queue_cv_;
  absl::flat_hash_map<std::string, Request> queued_ ABSL_GUARDED_BY(queue_mu_);
  // The limits of the batch being written now, per tenant.
  absl::flat_hash_map<std::string, uint64_t> writing_ ABSL_GUARDED_BY(queue_mu_);
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread thread_;

  // The journal file. Held by the store thread while it writes a batch and runs its callbacks.
  Mutex mu_ ABSL_ACQUIRED_AFTER(queue_mu_);
  int journal_fd_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t journal_number_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of the current journal that are on disk: its last good record ends here.
  uint64_t journal_good_size_ ABSL_GUARDED_BY(mu_) = 0;
};

// CRC-32 (IEEE) of `data`, for the record frames.
uint32_t Crc32(absl::string_view data);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_DURABLE_STORE_H_
