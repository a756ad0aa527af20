// The backend of the metastable-failure experiment (bench/metastable.py; docs/BENCHMARKS.md 13):
// a gRPC server with a capacity. K worker threads take requests from one FIFO queue; each request
// takes S ms of service (a sleep, so the machine's cores are not what saturates), so the capacity
// is K / S requests per second. Like the MongoDB primary of "Metastable Failures in the Wild"
// (OSDI'22), it keeps working on a request whose caller has given up: it never checks the call's
// deadline or cancellation before serving it, and only counts, after serving, that the work was
// wasted. A full queue (--max_queue) answers RESOURCE_EXHAUSTED at once.
//
// The trigger: the capacity cut to a fraction f for a while (each request's service takes S / f),
// by the flag --trigger=F@START+DURATION (START from --epoch_unix_ms) or by the SetCapacity RPC.
//
//   metastable_backend --listen=127.0.0.1:0 --workers=12 --service_ms=40 --epoch_unix_ms=E
//   metastable_backend --set_capacity=127.0.0.1:PORT --fraction=0.4 --duration_ms=5000
//
// Output (stdout): first `{"port":N}` once serving, then one JSON line per second of the run,
// `{"t":T,...}` for the second [epoch + T, epoch + T + 1): arrivals (every attempt that reached
// the server), resends among them (attempt > 1), rejected (queue full), completions (served),
// wasted (of those, served after the caller's deadline), queue (its length at the second's end)
// and fraction (the capacity in force then); last, once stopped, `{"totals":{...}}` (the
// cumulative counts). It runs until stdin closes or SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/metastable.grpc.pb.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "address to serve on (port 0: any free port)");
ABSL_FLAG(int, workers, 12, "K: worker threads serving the queue");
ABSL_FLAG(double, service_ms, 40, "S: milliseconds of service per request at full capacity");
ABSL_FLAG(int64_t, max_queue, 0,
          "requests the queue holds before it refuses (0: 30 s of work at full capacity)");
ABSL_FLAG(int64_t, epoch_unix_ms, 0, "time 0 of the stats lines and the trigger (0: now)");
ABSL_FLAG(std::string, trigger, "",
          "F@START+DURATION: capacity cut to fraction F from epoch+START for DURATION "
          "(e.g. 0.4@10s+5s)");
ABSL_FLAG(std::string, set_capacity, "",
          "client mode: send SetCapacity(--fraction, --duration_ms) to this backend and exit");
ABSL_FLAG(double, fraction, 1, "client mode: the fraction of capacity to set");
ABSL_FLAG(int64_t, duration_ms, 0, "client mode: how long the cut lasts (0: until changed)");

namespace retrybudget::bench {
namespace {

// The capacity in force: a fraction of the normal one until a time. Thread-safe.
class Capacity {
 public:
  // Cuts the capacity to `fraction` from `from` until `until`.
  void Set(double fraction, absl::Time from, absl::Time until) {
    absl::MutexLock lock(&mu_);
    fraction_ = fraction;
    from_ = from;
    until_ = until;
  }
  double At(absl::Time now) const {
    absl::MutexLock lock(&mu_);
    return now >= from_ && now < until_ ? fraction_ : 1.0;
  }

 private:
  mutable absl::Mutex mu_;
  double fraction_ ABSL_GUARDED_BY(mu_) = 1.0;
  absl::Time from_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Cumulative counters, read once a second by the stats printer.
struct Counters {
  std::atomic<uint64_t> arrivals{0};
  std::atomic<uint64_t> resends{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> completions{0};
  std::atomic<uint64_t> wasted{0};
};

// One request waiting for a worker.
struct Item {
  grpc::ServerUnaryReactor* reactor;
  WorkResponse* response;
  absl::Time arrived;
  absl::Time caller_deadline;
};

// The FIFO queue between the gRPC handlers and the K workers. Thread-safe.
class WorkQueue {
 public:
  explicit WorkQueue(int64_t max_items) : max_items_(max_items) {}

  // False (nothing queued) when the queue is full.
  bool Push(const Item& item) {
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(items_.size()) >= max_items_) return false;
    items_.push_back(item);
    return true;
  }
  // The oldest item, waiting for one; nullopt once Close() was called and the queue is empty.
  std::optional<Item> Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &WorkQueue::ClosedOrNotEmpty));
    if (items_.empty()) return std::nullopt;
    Item item = items_.front();
    items_.pop_front();
    return item;
  }
  int64_t Size() {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(items_.size());
  }
  // Stops the workers once the item each is serving is done, and returns what was still queued
  // (for the caller to answer without serving it).
  std::deque<Item> Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    return std::exchange(items_, {});
  }

 private:
  bool ClosedOrNotEmpty() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !items_.empty();
  }

  const int64_t max_items_;
  absl::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class BackendService final : public MetastableBackend::CallbackService {
 public:
  BackendService(WorkQueue* queue, Capacity* capacity, Counters* counters)
      : queue_(queue), capacity_(capacity), counters_(counters) {}

  grpc::ServerUnaryReactor* Work(grpc::CallbackServerContext* ctx, const WorkRequest* request,
                                 WorkResponse* response) override {
    counters_->arrivals.fetch_add(1, std::memory_order_relaxed);
    if (request->attempt() > 1) counters_->resends.fetch_add(1, std::memory_order_relaxed);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    const Item item{reactor, response, absl::Now(), absl::FromChrono(ctx->deadline())};
    if (!queue_->Push(item)) {
      counters_->rejected.fetch_add(1, std::memory_order_relaxed);
      reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* SetCapacity(grpc::CallbackServerContext* ctx,
                                        const SetCapacityRequest* request,
                                        SetCapacityResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (!(request->fraction() > 0 && request->fraction() <= 1)) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("fraction ", request->fraction(), " is not in (0, 1]")));
      return reactor;
    }
    const absl::Time now = absl::Now();
    const absl::Time until = request->duration_ms() == 0
                                 ? absl::InfiniteFuture()
                                 : now + absl::Milliseconds(request->duration_ms());
    capacity_->Set(request->fraction(), now, until);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  WorkQueue* const queue_;
  Capacity* const capacity_;
  Counters* const counters_;
};

// One of the K workers: serves the oldest request for S / fraction, whether or not its caller
// still waits (the point of the experiment), then answers it. The service runs on a schedule, not
// on relative sleeps: a request starts when it arrived or when this worker's previous one was due
// to end, whichever is later, and ends S / fraction after that, so a late wake-up (a busy
// machine) delays one answer but never lowers the capacity: K / S per second while busy.
void ServeLoop(WorkQueue* queue, const Capacity* capacity, Counters* counters,
               absl::Duration service) {
  absl::Time last_end = absl::InfinitePast();
  while (std::optional<Item> item = queue->Pop()) {
    const absl::Time start = std::max(item->arrived, last_end);
    last_end = start + service / capacity->At(start);
    absl::SleepFor(last_end - absl::Now());
    const absl::Time done = absl::Now();
    counters->completions.fetch_add(1, std::memory_order_relaxed);
    if (done > item->caller_deadline) counters->wasted.fetch_add(1, std::memory_order_relaxed);
    item->response->set_queued_us(absl::ToInt64Microseconds(start - item->arrived));
    item->reactor->Finish(grpc::Status::OK);
  }
}

// F@START+DURATION -> the cut's fraction, start and duration. INVALID_ARGUMENT naming the value.
struct Trigger {
  double fraction;
  absl::Duration start;
  absl::Duration duration;
};
absl::StatusOr<Trigger> ParseTrigger(const std::string& text) {
  const auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trigger='", text, "': ", why, " (expected F@START+DURATION, e.g. 0.4@10s+5s)"));
  };
  std::vector<std::string> at = absl::StrSplit(text, '@');
  if (at.size() != 2) return bad("no single '@'");
  std::vector<std::string> plus = absl::StrSplit(at[1], '+');
  if (plus.size() != 2) return bad("no single '+'");
  Trigger t;
  if (!absl::SimpleAtod(at[0], &t.fraction) || !(t.fraction > 0 && t.fraction <= 1)) {
    return bad("the fraction is not a number in (0, 1]");
  }
  if (!absl::ParseDuration(plus[0], &t.start) || t.start < absl::ZeroDuration()) {
    return bad("the start is not a duration >= 0");
  }
  if (!absl::ParseDuration(plus[1], &t.duration) || t.duration <= absl::ZeroDuration()) {
    return bad("the duration is not a duration > 0");
  }
  return t;
}

// Prints one stats line per second of the run (aligned on the epoch) until `stop`.
void StatsLoop(absl::Time epoch, const Capacity* capacity, Counters* counters, WorkQueue* queue,
               const std::atomic<bool>* stop) {
  uint64_t last[5] = {0, 0, 0, 0, 0};
  int64_t t = static_cast<int64_t>(absl::ToDoubleSeconds(absl::Now() - epoch));
  if (absl::Now() < epoch) t = -1;
  while (!stop->load()) {
    const absl::Time end = epoch + absl::Seconds(t + 1);
    absl::SleepFor(end - absl::Now());
    const uint64_t now[5] = {counters->arrivals.load(), counters->resends.load(),
                             counters->rejected.load(), counters->completions.load(),
                             counters->wasted.load()};
    std::printf(
        "{\"t\":%d,\"arrivals\":%u,\"resends\":%u,\"rejected\":%u,\"completions\":%u,"
        "\"wasted\":%u,\"queue\":%d,\"fraction\":%.3f}\n",
        static_cast<int>(t), static_cast<unsigned>(now[0] - last[0]),
        static_cast<unsigned>(now[1] - last[1]), static_cast<unsigned>(now[2] - last[2]),
        static_cast<unsigned>(now[3] - last[3]), static_cast<unsigned>(now[4] - last[4]),
        static_cast<int>(queue->Size()), capacity->At(end - absl::Milliseconds(1)));
    std::fflush(stdout);
    for (int i = 0; i < 5; ++i) last[i] = now[i];
    ++t;
  }
  std::printf(
      "{\"totals\":{\"arrivals\":%llu,\"resends\":%llu,\"rejected\":%llu,"
      "\"completions\":%llu,\"wasted\":%llu}}\n",
      static_cast<unsigned long long>(counters->arrivals.load()),
      static_cast<unsigned long long>(counters->resends.load()),
      static_cast<unsigned long long>(counters->rejected.load()),
      static_cast<unsigned long long>(counters->completions.load()),
      static_cast<unsigned long long>(counters->wasted.load()));
  std::fflush(stdout);
}

int SetCapacityClient(const std::string& target) {
  auto stub = MetastableBackend::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  SetCapacityRequest request;
  request.set_fraction(absl::GetFlag(FLAGS_fraction));
  request.set_duration_ms(absl::GetFlag(FLAGS_duration_ms));
  SetCapacityResponse response;
  const grpc::Status s = stub->SetCapacity(&ctx, request, &response);
  if (!s.ok()) {
    std::cerr << "SetCapacity on " << target << ": " << s.error_message() << "\n";
    return 1;
  }
  return 0;
}

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_workers) < 1 || absl::GetFlag(FLAGS_workers) > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers=", absl::GetFlag(FLAGS_workers), " is not in [1, 1000]"));
  }
  if (!(absl::GetFlag(FLAGS_service_ms) > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--service_ms=", absl::GetFlag(FLAGS_service_ms), " is not > 0"));
  }
  if (absl::GetFlag(FLAGS_max_queue) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_queue=", absl::GetFlag(FLAGS_max_queue), " is negative"));
  }
  return absl::OkStatus();
}

int Serve() {
  if (absl::Status s = CheckFlags(); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  const int workers = absl::GetFlag(FLAGS_workers);
  const absl::Duration service = absl::Milliseconds(absl::GetFlag(FLAGS_service_ms));
  int64_t max_queue = absl::GetFlag(FLAGS_max_queue);
  if (max_queue == 0) max_queue = static_cast<int64_t>(30 * workers * (absl::Seconds(1) / service));
  const int64_t epoch_ms = absl::GetFlag(FLAGS_epoch_unix_ms);
  const absl::Time epoch = epoch_ms > 0 ? absl::FromUnixMillis(epoch_ms) : absl::Now();

  Capacity capacity;
  if (!absl::GetFlag(FLAGS_trigger).empty()) {
    absl::StatusOr<Trigger> t = ParseTrigger(absl::GetFlag(FLAGS_trigger));
    if (!t.ok()) {
      std::cerr << t.status().message() << "\n";
      return 2;
    }
    capacity.Set(t->fraction, epoch + t->start, epoch + t->start + t->duration);
  }
  Counters counters;
  WorkQueue queue(max_queue);
  BackendService service_impl(&queue, &capacity, &counters);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service_impl);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "cannot serve on --listen=" << absl::GetFlag(FLAGS_listen) << "\n";
    return 1;
  }
  std::printf("{\"port\":%d}\n", port);
  std::fflush(stdout);

  std::vector<std::thread> pool;
  for (int i = 0; i < workers; ++i) {
    pool.emplace_back(ServeLoop, &queue, &capacity, &counters, service);
  }
  std::atomic<bool> stop{false};
  std::thread stats(StatsLoop, epoch, &capacity, &counters, &queue, &stop);

  // Runs until stdin closes or SIGTERM/SIGINT.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread stdin_watch([] {
    char buf[256];
    while (read(0, buf, sizeof buf) > 0) {
    }
    kill(getpid(), SIGTERM);
  });
  stdin_watch.detach();
  int signo = 0;
  sigwait(&signals, &signo);

  stop = true;
  stats.join();
  for (const Item& item : queue.Close()) {
    item.reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "backend stopping"));
  }
  for (std::thread& t : pool) t.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_set_capacity).empty()) {
    return retrybudget::bench::SetCapacityClient(absl::GetFlag(FLAGS_set_capacity));
  }
  return retrybudget::bench::Serve();
}
