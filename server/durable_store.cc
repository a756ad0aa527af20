#include "server/durable_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"

namespace retrybudget {
namespace {

constexpr char kSnapshotName[] = "state.snapshot";
constexpr uint32_t kMagic = 0x52425331;  // "RBS1"
constexpr size_t kHeaderSize = 12;       // magic, length, crc: 3 x u32 little-endian
constexpr uint32_t kMaxRecord = 1u << 30;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string Frame(const std::string& payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  PutU32(&out, kMagic);
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  PutU32(&out, Crc32(payload));
  out += payload;
  return out;
}

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(JournalIo& io, int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = io.Write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " cannot be read"));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// Splits `data` into framed payloads. `torn_tail_ok`: a last record cut short is dropped
// instead of being an error.
absl::StatusOr<std::vector<std::string>> Unframe(const std::string& data, const std::string& path,
                                                 bool torn_tail_ok) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t left = data.size() - pos;
    if (left < kHeaderSize) {
      if (torn_tail_ok) break;
      return absl::DataLossError(absl::StrFormat(
          "%s is truncated: %d bytes at offset %d are too few for a record header", path, left, pos));
    }
    const uint32_t magic = GetU32(data.data() + pos);
    const uint32_t len = GetU32(data.data() + pos + 4);
    const uint32_t crc = GetU32(data.data() + pos + 8);
    if (magic != kMagic || len > kMaxRecord) {
      // A file extended by a write whose data never reached the disk reads as zeros.
      if (torn_tail_ok && std::all_of(data.begin() + static_cast<std::ptrdiff_t>(pos), data.end(),
                                      [](char c) { return c == 0; })) {
        break;
      }
      return absl::DataLossError(absl::StrFormat(
          "%s is corrupt: no valid record header at offset %d", path, pos));
    }
    if (left - kHeaderSize < len) {
      if (torn_tail_ok) break;
      return absl::DataLossError(absl::StrFormat(
          "%s is truncated: the record at offset %d declares %d bytes but only %d follow", path,
          pos, len, left - kHeaderSize));
    }
    std::string payload = data.substr(pos + kHeaderSize, len);
    if (Crc32(payload) != crc) {
      // A torn write can leave a full-length record with garbage only at the very end.
      if (torn_tail_ok && pos + kHeaderSize + len == data.size()) break;
      return absl::DataLossError(absl::StrFormat(
          "%s is corrupt: the record at offset %d fails its checksum", path, pos));
    }
    out.push_back(std::move(payload));
    pos += kHeaderSize + len;
  }
  return out;
}

std::string JournalName(uint64_t n) { return absl::StrCat("journal.", n, ".log"); }

// Journal numbers present in `dir`, ascending.
std::vector<uint64_t> ListJournals(const std::string& dir) {
  std::vector<uint64_t> numbers;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      absl::string_view name(e->d_name);
      if (!absl::StartsWith(name, "journal.") || !absl::EndsWith(name, ".log")) continue;
      name.remove_prefix(8);
      name.remove_suffix(4);
      uint64_t n;
      if (absl::SimpleAtoi(name, &n)) numbers.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

ssize_t JournalIo::Write(int fd, const char* data, size_t size) { return ::write(fd, data, size); }

int JournalIo::DataSync(int fd) { return ::fdatasync(fd); }

uint32_t Crc32(absl::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace {

JournalIo* RealJournalIo() {
  static JournalIo* const io = new JournalIo();
  return io;
}

}  // namespace

DurableStore::DurableStore(std::string dir, DurableStoreOptions options)
    : dir_(std::move(dir)), io_(options.io != nullptr ? options.io : RealJournalIo()) {
  thread_ = std::thread([this] { StoreThread(); });
}

DurableStore::~DurableStore() {
  {
    MutexLock lock(&queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();  // after writing what was queued
  MutexLock lock(&mu_);
  if (journal_fd_ >= 0) ::close(journal_fd_);
}

void DurableStore::ReserveAhead(absl::string_view tenant, uint64_t grant_limit,
                                double credited_total, ReservedCallback done) {
  {
    MutexLock lock(&queue_mu_);
    auto queued = queued_.find(tenant);
    if (queued == queued_.end()) {
      auto writing = writing_.find(tenant);
      if (writing != writing_.end() && writing->second >= grant_limit) return;
      queued_.emplace(std::string(tenant), Request{grant_limit, credited_total, std::move(done)});
    } else {
      queued->second.grant_limit = std::max(queued->second.grant_limit, grant_limit);
      queued->second.credited_total = std::max(queued->second.credited_total, credited_total);
      queued->second.done = std::move(done);
    }
  }
  queue_cv_.notify_all();
}

void DurableStore::WaitIdle() {
  CondVarLock lock(&queue_mu_);
  queue_cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
    return queued_.empty() && writing_.empty();
  });
}

void DurableStore::StoreThread() {
  while (true) {
    absl::flat_hash_map<std::string, Request> batch;
    {
      CondVarLock lock(&queue_mu_);
      queue_cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stopping_ || !queued_.empty();
      });
      if (queued_.empty()) return;  // stopping, and everything queued is written
      batch.swap(queued_);
      for (const auto& [tenant, request] : batch) writing_[tenant] = request.grant_limit;
    }
    std::string records;
    for (const auto& [tenant, request] : batch) {
      v1::Reservation r;
      r.set_tenant(tenant);
      r.set_grant_limit(request.grant_limit);
      r.set_credited_total(request.credited_total);
      records += Frame(r.SerializeAsString());
    }
    {
      // The callbacks run under mu_, so a RotateJournal (and the snapshot after it) waits for
      // them: a limit in an older journal is in the state the snapshot exports.
      MutexLock lock(&mu_);
      const absl::Status status = AppendDurably(records);
      for (const auto& [tenant, request] : batch) {
        if (request.done) request.done(tenant, request.grant_limit, status);
      }
    }
    {
      MutexLock lock(&queue_mu_);
      writing_.clear();
    }
    queue_cv_.notify_all();
  }
}

absl::StatusOr<std::unique_ptr<DurableStore>> DurableStore::Open(const std::string& dir,
                                                                 DurableStoreOptions options) {
  if (dir.empty()) return absl::InvalidArgumentError("data_dir is empty");
  const std::string path = dir;
  // mkdir -p
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      const std::string prefix = path.substr(0, i);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return Errno("cannot create data_dir", prefix);
      }
    }
  }
  if (::access(path.c_str(), W_OK) != 0) return Errno("data_dir is not writable:", path);
  return std::unique_ptr<DurableStore>(new DurableStore(path, options));
}

absl::StatusOr<RecoveredState> DurableStore::Load() {
  RecoveredState recovered;
  const std::string snapshot_path = absl::StrCat(dir_, "/", kSnapshotName);
  uint64_t journal_start = 0;
  if (::access(snapshot_path.c_str(), F_OK) == 0) {
    auto data = ReadFile(snapshot_path);
    if (!data.ok()) return data.status();
    auto records = Unframe(*data, snapshot_path, /*torn_tail_ok=*/false);
    if (!records.ok()) return records.status();
    if (records->size() != 1) {
      return absl::DataLossError(absl::StrFormat("%s holds %d records; a snapshot holds exactly 1",
                                                 snapshot_path, records->size()));
    }
    v1::ServerState state;
    if (!state.ParseFromString((*records)[0])) {
      return absl::DataLossError(absl::StrCat(snapshot_path, " does not parse as a ServerState"));
    }
    journal_start = state.journal_start();
    recovered.snapshot = std::move(state);
  }
  const std::vector<uint64_t> journals = ListJournals(dir_);
  for (size_t i = 0; i < journals.size(); ++i) {
    if (journals[i] < journal_start) continue;  // superseded by the snapshot
    const std::string path = absl::StrCat(dir_, "/", JournalName(journals[i]));
    auto data = ReadFile(path);
    if (!data.ok()) return data.status();
    // Any journal may end in a torn record: the newest after a crash mid-append, an older one
    // after a failed append (its file was abandoned, see AbandonJournal).
    auto records = Unframe(*data, path, /*torn_tail_ok=*/true);
    if (!records.ok()) return records.status();
    for (const std::string& payload : *records) {
      v1::Reservation r;
      if (!r.ParseFromString(payload)) {
        return absl::DataLossError(absl::StrCat(path, " holds a record that is no Reservation"));
      }
      uint64_t& limit = recovered.reservations[r.tenant()];
      limit = std::max(limit, r.grant_limit());
      if (r.credited_total() > 0 && std::isfinite(r.credited_total())) {
        double& credited = recovered.credited[r.tenant()];
        credited = std::max(credited, r.credited_total());
      }
    }
  }
  {
    MutexLock lock(&mu_);
    journal_number_ = journals.empty() ? journal_start : std::max(journal_start, journals.back());
  }
  return recovered;
}

absl::Status DurableStore::OpenJournal(uint64_t number) {
  const std::string path = absl::StrCat(dir_, "/", JournalName(number));
  // O_EXCL: a journal number is used once; a file left by an earlier run is never appended to.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (journal_fd_ >= 0) ::close(journal_fd_);
  journal_fd_ = -1;
  journal_number_ = number;  // used even on failure: the next attempt takes the next number
  if (fd < 0) return Errno("cannot create journal", path);
  // The file's directory entry must be durable before any record in it counts.
  if (absl::Status s = SyncDir(dir_); !s.ok()) {
    ::close(fd);
    return s;
  }
  journal_fd_ = fd;
  journal_good_size_ = 0;
  return absl::OkStatus();
}

absl::Status DurableStore::AppendDurably(const std::string& records) {
  if (journal_fd_ < 0) {
    if (auto s = OpenJournal(journal_number_ + 1); !s.ok()) return s;
  }
  const std::string path = absl::StrCat(dir_, "/", JournalName(journal_number_));
  absl::Status s = WriteAll(*io_, journal_fd_, records, path);
  if (s.ok() && io_->DataSync(journal_fd_) != 0) s = Errno("cannot fdatasync", path);
  if (!s.ok()) {
    AbandonJournal();
    return s;
  }
  journal_good_size_ += records.size();
  return absl::OkStatus();
}

void DurableStore::AbandonJournal() {
  if (journal_fd_ < 0) return;
  // Best effort: whether or not the cut reaches the disk, the next start reads this file up to
  // its last whole record and ignores a torn one after it.
  if (::ftruncate(journal_fd_, static_cast<off_t>(journal_good_size_)) == 0) {
    (void)io_->DataSync(journal_fd_);
  }
  ::close(journal_fd_);
  journal_fd_ = -1;
}

absl::Status DurableStore::Reserve(absl::string_view tenant, uint64_t grant_limit,
                                   double credited_total) {
  v1::Reservation r;
  r.set_tenant(std::string(tenant));
  r.set_grant_limit(grant_limit);
  r.set_credited_total(credited_total);
  const std::string record = Frame(r.SerializeAsString());
  MutexLock lock(&mu_);
  return AppendDurably(record);
}

absl::StatusOr<uint64_t> DurableStore::RotateJournal() {
  MutexLock lock(&mu_);
  if (auto s = OpenJournal(journal_number_ + 1); !s.ok()) return s;
  return journal_number_;
}

absl::Status DurableStore::WriteSnapshot(const v1::ServerState& state) {
  const std::string path = absl::StrCat(dir_, "/", kSnapshotName);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s = WriteAll(*RealJournalIo(), fd, Frame(state.SerializeAsString()), tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot fsync", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename to", path);
  if (auto d = SyncDir(dir_); !d.ok()) return d;
  for (uint64_t n : ListJournals(dir_)) {
    if (n < state.journal_start()) {
      ::unlink(absl::StrCat(dir_, "/", JournalName(n)).c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace retrybudget
