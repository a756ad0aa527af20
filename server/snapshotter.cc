#include "server/snapshotter.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace retrybudget {

absl::StatusOr<std::unique_ptr<Snapshotter>> Snapshotter::Start(
    BudgetCore* core, DurableStore* store, absl::Duration interval,
    std::function<void(absl::string_view)> log) {
  auto recovered = store->Load();
  if (!recovered.ok()) return recovered.status();
  if (auto s = core->Restore(*recovered); !s.ok()) return s;
  std::unique_ptr<Snapshotter> s(new Snapshotter(core, store, interval, std::move(log)));
  // From here on the state on disk is "running": a crash is recovered as one.
  if (auto st = s->SnapshotNow(/*clean=*/false); !st.ok()) return st;
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

Snapshotter::Snapshotter(BudgetCore* core, DurableStore* store, absl::Duration interval,
                         std::function<void(absl::string_view)> log)
    : core_(core), store_(store), interval_(interval), log_(std::move(log)) {}

Snapshotter::~Snapshotter() { (void)Stop(); }

absl::Status Snapshotter::SnapshotNow(bool clean) {
  MutexLock one_at_a_time(&snapshot_mu_);
  // Rotate first: reservations made from now on land in the new journal, which the snapshot
  // names as its start; everything in older journals is covered by the state exported below.
  absl::Status status;
  auto journal = store_->RotateJournal();
  if (!journal.ok()) {
    status = journal.status();
  } else {
    v1::ServerState state = core_->ExportState(clean);
    state.set_journal_start(*journal);
    status = store_->WriteSnapshot(state);
  }
  if (log_ && !status.ok()) {
    log_(absl::StrCat("snapshot to ", store_->dir(), " failed (the next one is tried in ",
                      absl::FormatDuration(interval_), "): ", status.ToString()));
  }
  MutexLock lock(&mu_);
  (status.ok() ? written_ : failed_) += 1;
  return status;
}

void Snapshotter::Loop() {
  CondVarLock lock(&mu_);
  while (!stopping_) {
    if (wake_.wait_for(lock, absl::ToChronoMilliseconds(interval_),
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; })) {
      break;
    }
    lock.unlock();
    (void)SnapshotNow(/*clean=*/false);  // counted in failed_; the next interval tries again
    lock.lock();
  }
}

absl::Status Snapshotter::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return absl::OkStatus();
    stopping_ = true;
    stopped_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  return SnapshotNow(/*clean=*/true);
}

uint64_t Snapshotter::written() {
  MutexLock lock(&mu_);
  return written_;
}

uint64_t Snapshotter::failed() {
  MutexLock lock(&mu_);
  return failed_;
}

}  // namespace retrybudget
