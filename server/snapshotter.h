// Keeps a BudgetCore durable in a DurableStore: recovery at start, a snapshot every interval,
// and a clean (exact) snapshot at shutdown.
//
//   auto store = DurableStore::Open(data_dir);
//   auto core = BudgetCore::Create({..., .store = store->get()});
//   auto snapshotter = Snapshotter::Start(core->get(), store->get(), absl::Seconds(10));
//   ... serve ...
//   server->Shutdown();  (no Sync runs after this)
//   (*snapshotter)->Stop();  writes the clean snapshot
#ifndef RETRYBUDGET_SERVER_SNAPSHOTTER_H_
#define RETRYBUDGET_SERVER_SNAPSHOTTER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "retrybudget/mutex.h"
#include "absl/time/time.h"
#include "server/budget_core.h"
#include "server/durable_store.h"

namespace retrybudget {

// Thread-safe.
class Snapshotter {
 public:
  // Loads `store` into `core` (which must not serve yet), writes a first snapshot (so a crash
  // from now on is recovered as a crash) and starts snapshotting every `interval`. Returns the
  // store's DATA_LOSS for damaged files: the server must not start on them.
  // `log` receives one line per failed snapshot (null: silent).
  static absl::StatusOr<std::unique_ptr<Snapshotter>> Start(
      BudgetCore* core, DurableStore* store, absl::Duration interval,
      std::function<void(absl::string_view)> log = nullptr);
  ~Snapshotter();

  // Writes a snapshot now. `clean` only when no Sync can run any more.
  absl::Status SnapshotNow(bool clean);

  // Stops the periodic thread and writes the clean snapshot. Idempotent.
  absl::Status Stop();

  // Snapshots written and failed since start.
  uint64_t written();
  uint64_t failed();

 private:
  Snapshotter(BudgetCore* core, DurableStore* store, absl::Duration interval,
              std::function<void(absl::string_view)> log);
  void Loop();

  BudgetCore* const core_;
  DurableStore* const store_;
  const absl::Duration interval_;
  const std::function<void(absl::string_view)> log_;
  Mutex snapshot_mu_;  // one snapshot at a time
  Mutex mu_;
  std::condition_variable_any wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_SNAPSHOTTER_H_
