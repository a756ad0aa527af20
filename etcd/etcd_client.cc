#include "etcd/etcd_client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <stop_token>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "retrybudget/mutex.h"

namespace retrybudget::etcd {
namespace {

// Pause before a failed keep-alive round or a broken watch is tried again (on the next
// endpoint): short against any lease TTL, long enough not to spin on a dead cluster.
constexpr absl::Duration kRetryPause = absl::Milliseconds(100);

// gRPC keep-alive pings on each channel (see Create).
constexpr int kKeepaliveTimeMs = 10'000;
constexpr int kKeepaliveTimeoutMs = 5'000;

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what,
                      absl::string_view endpoint) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("etcd ", what, " at ", endpoint, ": ", status.error_message()));
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  return KeyValue{.key = kv.key(),
                  .value = kv.value(),
                  .create_revision = kv.create_revision(),
                  .mod_revision = kv.mod_revision(),
                  .version = kv.version(),
                  .lease = kv.lease()};
}

std::vector<KeyValue> FromProto(const google::protobuf::RepeatedPtrField<mvccpb::KeyValue>& kvs) {
  std::vector<KeyValue> out;
  out.reserve(kvs.size());
  for (const mvccpb::KeyValue& kv : kvs) out.push_back(FromProto(kv));
  return out;
}

void ToProto(const Compare& compare, etcdserverpb::Compare* out) {
  out->set_result(etcdserverpb::Compare::EQUAL);
  out->set_key(compare.key);
  switch (compare.target) {
    case Compare::Target::kCreateRevision:
      out->set_target(etcdserverpb::Compare::CREATE);
      out->set_create_revision(compare.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(etcdserverpb::Compare::MOD);
      out->set_mod_revision(compare.number);
      break;
    case Compare::Target::kValue:
      out->set_target(etcdserverpb::Compare::VALUE);
      out->set_value(compare.value);
      break;
    case Compare::Target::kLease:
      out->set_target(etcdserverpb::Compare::LEASE);
      out->set_lease(compare.number);
      break;
  }
}

void ToProto(const Op& op, etcdserverpb::RequestOp* out) {
  switch (op.type) {
    case Op::Type::kPut: {
      etcdserverpb::PutRequest* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case Op::Type::kDelete:
      out->mutable_request_delete_range()->set_key(op.key);
      break;
    case Op::Type::kDeletePrefix: {
      etcdserverpb::DeleteRangeRequest* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(PrefixRangeEnd(op.key));
      break;
    }
    case Op::Type::kGet:
      out->mutable_request_range()->set_key(op.key);
      break;
    case Op::Type::kGetPrefix: {
      etcdserverpb::RangeRequest* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(PrefixRangeEnd(op.key));
      break;
    }
  }
}

// The gRPC target of HOST:PORT: an IP address literal names itself (ipv4: / ipv6: schemes, no
// resolver in the way of a reconnect), anything else goes through DNS.
std::string ChannelTarget(absl::string_view address) {
  const size_t colon = address.rfind(':');
  const absl::string_view host = address.substr(0, colon);
  in6_addr ip6;
  in_addr ip4;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      inet_pton(AF_INET6, std::string(host.substr(1, host.size() - 2)).c_str(), &ip6) == 1) {
    return absl::StrCat("ipv6:", address);
  }
  if (inet_pton(AF_INET, std::string(host).c_str(), &ip4) == 1) {
    return absl::StrCat("ipv4:", address);
  }
  return std::string(address);
}

// One channel to one member, and its stubs. Immutable.
struct Connection {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  absl::Time created;
};

// One member: its current connection, replaced by a fresh one when it has failed for longer
// than `renew_after` without a success. (gRPC 1.51's channel can stay in TRANSIENT_FAILURE,
// answering "connection refused" from memory, for many seconds after the member is back; a new
// channel connects at once.) Thread-safe.
class Endpoint {
 public:
  Endpoint(std::string address, grpc::ChannelArguments args, absl::Duration renew_after,
           std::shared_ptr<grpc::ChannelCredentials> credentials)
      : address_(std::move(address)),
        args_(std::move(args)),
        renew_after_(renew_after),
        credentials_(credentials != nullptr ? std::move(credentials)
                                            : grpc::InsecureChannelCredentials()) {
    connection_ = Connect();
  }

  std::shared_ptr<const Connection> connection() {
    MutexLock lock(&mu_);
    return connection_;
  }

  void Succeeded(const Connection& used) {
    MutexLock lock(&mu_);
    if (&used == connection_.get()) last_success_ = absl::Now();
  }

  // After a failure of `used` with UNAVAILABLE.
  void Failed(const Connection& used) {
    MutexLock lock(&mu_);
    if (&used != connection_.get()) return;  // already replaced
    const absl::Time now = absl::Now();
    if (now - std::max(last_success_, connection_->created) > renew_after_) {
      connection_ = Connect();
    }
  }

 private:
  std::shared_ptr<const Connection> Connect() {
    auto connection = std::make_shared<Connection>();
    connection->address = address_;
    connection->channel = grpc::CreateCustomChannel(ChannelTarget(address_), credentials_, args_);
    connection->kv = etcdserverpb::KV::NewStub(connection->channel);
    connection->lease = etcdserverpb::Lease::NewStub(connection->channel);
    connection->watch = etcdserverpb::Watch::NewStub(connection->channel);
    connection->created = absl::Now();
    return connection;
  }

  const std::string address_;
  const grpc::ChannelArguments args_;
  const absl::Duration renew_after_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  Mutex mu_;
  std::shared_ptr<const Connection> connection_ ABSL_GUARDED_BY(mu_);
  absl::Time last_success_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Which endpoint calls go to. Shared by the client and its background threads.
// Deadlines of every unary call and keep-alive round, and the calls in flight, so that
// EndCallsBy() can cut them all short for a bounded shutdown.
class CallGate {
 public:
  // Sets `context`'s deadline (now + timeout, or the end set by EndCallsBy when sooner) and
  // records it as in flight until Leave().
  void Enter(grpc::ClientContext* context, absl::Duration timeout) {
    MutexLock lock(&mu_);
    context->set_deadline(absl::ToChronoTime(std::min(absl::Now() + timeout, end_)));
    in_flight_.push_back(context);
  }
  void Leave(grpc::ClientContext* context) {
    MutexLock lock(&mu_);
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), context));
  }
  void EndBy(absl::Time deadline) {
    MutexLock lock(&mu_);
    end_ = std::min(end_, deadline);
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

 private:
  Mutex mu_;
  absl::Time end_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(mu_);
};

// Enter() on construction, Leave() on destruction.
class GatedCall {
 public:
  GatedCall(CallGate& gate, grpc::ClientContext* context, absl::Duration timeout)
      : gate_(gate), context_(context) {
    gate_.Enter(context_, timeout);
  }
  GatedCall(const GatedCall&) = delete;
  GatedCall& operator=(const GatedCall&) = delete;
  ~GatedCall() { gate_.Leave(context_); }

 private:
  CallGate& gate_;
  grpc::ClientContext* const context_;
};

class EndpointRing {
 public:
  explicit EndpointRing(std::vector<std::unique_ptr<Endpoint>> endpoints)
      : endpoints_(std::move(endpoints)) {}

  size_t size() const { return endpoints_.size(); }
  CallGate& gate() const { return gate_; }
  size_t current() const { return current_.load(std::memory_order_relaxed); }
  Endpoint& at(size_t index) const { return *endpoints_[index % endpoints_.size()]; }

  // Moves to the endpoint after `failed`, unless another caller already moved on.
  void Advance(size_t failed) {
    size_t expected = failed;
    current_.compare_exchange_strong(expected, (failed + 1) % endpoints_.size(),
                                     std::memory_order_relaxed);
  }

 private:
  const std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  mutable CallGate gate_;
};

class KeepAliveImpl : public KeepAlive {
 public:
  KeepAliveImpl(std::shared_ptr<EndpointRing> ring, const EtcdClientOptions& options,
                const LeaseGrant& grant, absl::Duration interval,
                std::function<void(const KeepAliveAnswer&)> on_answer)
      : ring_(std::move(ring)),
        clock_(options.clock),
        // A renewal slower than the interval is overtaken by the next one: give up on it then.
        call_timeout_(std::min(options.call_timeout, interval)),
        lease_(grant.id),
        interval_(interval),
        on_answer_(std::move(on_answer)),
        last_{.sent = grant.sent, .ttl = grant.ttl} {
    thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  }

  ~KeepAliveImpl() override {
    thread_.request_stop();
    thread_.join();
  }

  int64_t lease() const override { return lease_; }
  KeepAliveAnswer last_answer() const override {
    ReaderMutexLock lock(&mu_);
    return last_;
  }
  bool lost() const override {
    ReaderMutexLock lock(&mu_);
    return lost_;
  }

 private:
  void Run(std::stop_token stop) {
    absl::Time next = clock_->Now() + interval_;
    while (clock_->SleepUntil(next, stop)) {
      const size_t index = ring_->current();
      Endpoint& endpoint = ring_->at(index);
      const std::shared_ptr<const Connection> connection = endpoint.connection();
      const absl::Time sent = clock_->Now();
      absl::StatusOr<absl::Duration> ttl = Renew(*connection);
      if (!ttl.ok()) {
        if (absl::IsUnavailable(ttl.status())) endpoint.Failed(*connection);
        ring_->Advance(index);
        next = clock_->Now() + std::min(kRetryPause, interval_);
        continue;
      }
      endpoint.Succeeded(*connection);
      const KeepAliveAnswer answer{.sent = sent, .ttl = *ttl};
      {
        MutexLock lock(&mu_);
        if (*ttl > absl::ZeroDuration()) {
          last_ = answer;
        } else {
          lost_ = true;
        }
      }
      if (on_answer_) on_answer_(answer);
      if (*ttl <= absl::ZeroDuration()) return;
      next = sent + interval_;
    }
  }

  // One renewal on one short stream: the TTL etcd restarted (<= 0: no such lease).
  absl::StatusOr<absl::Duration> Renew(const Connection& endpoint) {
    grpc::ClientContext context;
    const GatedCall gated(ring_->gate(), &context, call_timeout_);
    auto stream = endpoint.lease->LeaseKeepAlive(&context);
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease_);
    etcdserverpb::LeaseKeepAliveResponse response;
    const bool answered = stream->Write(request) && stream->Read(&response);
    context.TryCancel();
    const grpc::Status status = stream->Finish();
    if (!answered) {
      return FromGrpc(
          status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no answer") : status,
          "LeaseKeepAlive", endpoint.address);
    }
    return absl::Seconds(response.ttl());
  }

  const std::shared_ptr<EndpointRing> ring_;
  Clock* const clock_;
  const absl::Duration call_timeout_;
  const int64_t lease_;
  const absl::Duration interval_;
  const std::function<void(const KeepAliveAnswer&)> on_answer_;
  mutable Mutex mu_;
  KeepAliveAnswer last_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::jthread thread_;  // last: starts after every member is set, stops first
};

class WatchImpl : public Watch {
 public:
  WatchImpl(std::shared_ptr<EndpointRing> ring, const EtcdClientOptions& options,
            std::string prefix, int64_t start_revision,
            std::function<void(const WatchBatch&)> on_batch)
      : ring_(std::move(ring)),
        clock_(options.clock),
        prefix_(std::move(prefix)),
        next_revision_(start_revision),
        on_batch_(std::move(on_batch)) {
    thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
  }

  ~WatchImpl() override {
    thread_.request_stop();
    {
      MutexLock lock(&mu_);
      if (context_ != nullptr) context_->TryCancel();
    }
    thread_.join();
  }

 private:
  void Run(std::stop_token stop) {
    while (!stop.stop_requested()) {
      const size_t index = ring_->current();
      Endpoint& endpoint = ring_->at(index);
      const std::shared_ptr<const Connection> connection = endpoint.connection();
      if (RunOneStream(*connection, stop)) {
        endpoint.Succeeded(*connection);
      } else {
        endpoint.Failed(*connection);
      }
      if (stop.stop_requested()) return;
      ring_->Advance(index);
      clock_->SleepUntil(clock_->Now() + kRetryPause, stop);
    }
  }

  // Watches on one stream until it breaks or the watch is stopped. Returns whether etcd
  // answered on it at all.
  bool RunOneStream(const Connection& endpoint, std::stop_token stop) {
    grpc::ClientContext context;
    // etcd ends the stream when its member has no leader, rather than leaving it silent.
    context.AddMetadata("hasleader", "true");
    {
      MutexLock lock(&mu_);
      if (stop.stop_requested()) return true;
      context_ = &context;
    }
    auto stream = endpoint.watch->Watch(&context);
    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixRangeEnd(prefix_));
    create->set_start_revision(next_revision_);
    etcdserverpb::WatchResponse response;
    bool answered = false;
    if (stream->Write(request)) {
      while (stream->Read(&response)) {
        answered = true;
        if (response.compact_revision() > 0) {
          next_revision_ = response.compact_revision();
          on_batch_({.events = {}, .revision = response.header().revision(), .compacted = true});
          break;  // the stream's watch is cancelled; start again from the compaction revision
        }
        if (response.canceled()) break;
        // A watch "from now" resumes after the revision it was created at, so that a reconnect
        // before any event loses nothing.
        if (response.created() && next_revision_ == 0) {
          next_revision_ = response.header().revision() + 1;
        }
        if (response.events_size() == 0) continue;
        WatchBatch batch{
            .events = {}, .revision = response.header().revision(), .compacted = false};
        for (const mvccpb::Event& event : response.events()) {
          batch.events.push_back({.type = event.type() == mvccpb::Event::DELETE
                                              ? WatchEvent::Type::kDelete
                                              : WatchEvent::Type::kPut,
                                  .kv = FromProto(event.kv())});
          next_revision_ = std::max(next_revision_, event.kv().mod_revision() + 1);
        }
        on_batch_(batch);
      }
    }
    context.TryCancel();
    stream->Finish().IgnoreError();
    MutexLock lock(&mu_);
    context_ = nullptr;
    return answered;
  }

  const std::shared_ptr<EndpointRing> ring_;
  Clock* const clock_;
  const std::string prefix_;
  int64_t next_revision_;  // only the watch thread touches it
  const std::function<void(const WatchBatch&)> on_batch_;
  Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::jthread thread_;  // last: starts after every member is set, stops first
};

class EtcdClientImpl : public EtcdClient {
 public:
  EtcdClientImpl(EtcdClientOptions options, std::vector<std::string> addresses,
                 std::shared_ptr<EndpointRing> ring)
      : options_(std::move(options)), addresses_(std::move(addresses)), ring_(std::move(ring)) {}

  const std::vector<std::string>& endpoints() const override { return addresses_; }
  size_t endpoint_in_use() const override { return ring_->current(); }

  absl::StatusOr<RangeResult> Get(absl::string_view key) override {
    etcdserverpb::RangeRequest request;
    request.set_key(std::string(key));
    return Range(request);
  }

  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) override {
    etcdserverpb::RangeRequest request;
    request.set_key(std::string(prefix));
    request.set_range_end(PrefixRangeEnd(prefix));
    return Range(request);
  }

  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease) override {
    etcdserverpb::PutRequest request;
    request.set_key(std::string(key));
    request.set_value(std::string(value));
    request.set_lease(lease);
    etcdserverpb::PutResponse response;
    absl::Status status = Call("Put", [&](const Connection& e, grpc::ClientContext* c) {
      return e.kv->Put(c, request, &response);
    });
    if (!status.ok()) return status;
    return response.header().revision();
  }

  absl::StatusOr<int64_t> Delete(absl::string_view key) override {
    etcdserverpb::DeleteRangeRequest request;
    request.set_key(std::string(key));
    etcdserverpb::DeleteRangeResponse response;
    absl::Status status = Call("DeleteRange", [&](const Connection& e, grpc::ClientContext* c) {
      return e.kv->DeleteRange(c, request, &response);
    });
    if (!status.ok()) return status;
    return response.deleted();
  }

  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares, const std::vector<Op>& then,
                                const std::vector<Op>& otherwise) override {
    etcdserverpb::TxnRequest request;
    for (const Compare& compare : compares) ToProto(compare, request.add_compare());
    for (const Op& op : then) ToProto(op, request.add_success());
    for (const Op& op : otherwise) ToProto(op, request.add_failure());
    etcdserverpb::TxnResponse response;
    absl::Status status = Call("Txn", [&](const Connection& e, grpc::ClientContext* c) {
      return e.kv->Txn(c, request, &response);
    });
    if (!status.ok()) return status;
    TxnResult result{
        .succeeded = response.succeeded(), .revision = response.header().revision(), .gets = {}};
    for (const etcdserverpb::ResponseOp& op : response.responses()) {
      if (op.has_response_range()) result.gets.push_back(FromProto(op.response_range().kvs()));
    }
    return result;
  }

  absl::StatusOr<LeaseGrant> GrantLease(absl::Duration ttl) override {
    etcdserverpb::LeaseGrantRequest request;
    request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
    etcdserverpb::LeaseGrantResponse response;
    absl::Time sent;
    absl::Status status = Call("LeaseGrant", [&](const Connection& e, grpc::ClientContext* c) {
      sent = options_.clock->Now();
      return e.lease->LeaseGrant(c, request, &response);
    });
    if (!status.ok()) return status;
    if (!response.error().empty()) {
      return absl::UnavailableError(absl::StrCat("etcd LeaseGrant: ", response.error()));
    }
    return LeaseGrant{.id = response.id(), .ttl = absl::Seconds(response.ttl()), .sent = sent};
  }

  absl::Status RevokeLease(int64_t lease) override {
    etcdserverpb::LeaseRevokeRequest request;
    request.set_id(lease);
    etcdserverpb::LeaseRevokeResponse response;
    return Call("LeaseRevoke", [&](const Connection& e, grpc::ClientContext* c) {
      return e.lease->LeaseRevoke(c, request, &response);
    });
  }

  absl::StatusOr<std::unique_ptr<KeepAlive>> StartKeepAlive(
      const LeaseGrant& grant, absl::Duration interval,
      std::function<void(const KeepAliveAnswer&)> on_answer) override {
    if (interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("keep-alive interval must be positive, not ",
                                                     absl::FormatDuration(interval)));
    }
    return std::make_unique<KeepAliveImpl>(ring_, options_, grant, interval, std::move(on_answer));
  }

  void EndCallsBy(absl::Time deadline) override { ring_->gate().EndBy(deadline); }

  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      absl::string_view prefix, int64_t start_revision,
      std::function<void(const WatchBatch&)> on_batch) override {
    if (!on_batch) return absl::InvalidArgumentError("WatchPrefix needs a callback");
    return std::make_unique<WatchImpl>(ring_, options_, std::string(prefix), start_revision,
                                       std::move(on_batch));
  }

 private:
  absl::StatusOr<RangeResult> Range(const etcdserverpb::RangeRequest& request) {
    etcdserverpb::RangeResponse response;
    absl::Status status = Call("Range", [&](const Connection& e, grpc::ClientContext* c) {
      return e.kv->Range(c, request, &response);
    });
    if (!status.ok()) return status;
    return RangeResult{.kvs = FromProto(response.kvs()), .revision = response.header().revision()};
  }

  // Runs `attempt` on the endpoint in use; on UNAVAILABLE moves on and tries the next one, each
  // endpoint at most once. Any other failure also moves the next call on.
  template <typename Attempt>
  absl::Status Call(absl::string_view what, Attempt attempt) {
    absl::Status last;
    for (size_t tries = 0; tries < ring_->size(); ++tries) {
      const size_t index = ring_->current();
      Endpoint& endpoint = ring_->at(index);
      const std::shared_ptr<const Connection> connection = endpoint.connection();
      grpc::ClientContext context;
      grpc::Status status;
      {
        const GatedCall gated(ring_->gate(), &context, options_.call_timeout);
        status = attempt(*connection, &context);
      }
      if (status.ok()) {
        endpoint.Succeeded(*connection);
        return absl::OkStatus();
      }
      last = FromGrpc(status, what, connection->address);
      ring_->Advance(index);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      endpoint.Failed(*connection);
    }
    return last;
  }

  const EtcdClientOptions options_;
  const std::vector<std::string> addresses_;
  const std::shared_ptr<EndpointRing> ring_;
};

}  // namespace

Compare Compare::CreateRevisionIs(std::string key, int64_t revision) {
  return {
      .target = Target::kCreateRevision, .key = std::move(key), .number = revision, .value = {}};
}
Compare Compare::ModRevisionIs(std::string key, int64_t revision) {
  return {.target = Target::kModRevision, .key = std::move(key), .number = revision, .value = {}};
}
Compare Compare::ValueIs(std::string key, std::string value) {
  return {.target = Target::kValue, .key = std::move(key), .number = 0, .value = std::move(value)};
}
Compare Compare::LeaseIs(std::string key, int64_t lease) {
  return {.target = Target::kLease, .key = std::move(key), .number = lease, .value = {}};
}

Op Op::Put(std::string key, std::string value, int64_t lease) {
  return {.type = Type::kPut, .key = std::move(key), .value = std::move(value), .lease = lease};
}
Op Op::Delete(std::string key) {
  return {.type = Type::kDelete, .key = std::move(key), .value = {}, .lease = 0};
}
Op Op::DeletePrefix(std::string prefix) {
  return {.type = Type::kDeletePrefix, .key = std::move(prefix), .value = {}, .lease = 0};
}
Op Op::Get(std::string key) {
  return {.type = Type::kGet, .key = std::move(key), .value = {}, .lease = 0};
}
Op Op::GetPrefix(std::string prefix) {
  return {.type = Type::kGetPrefix, .key = std::move(prefix), .value = {}, .lease = 0};
}

std::string PrefixRangeEnd(absl::string_view prefix) {
  // The smallest key greater than every key that starts with `prefix`: the prefix with its last
  // byte that is not 0xff incremented and what follows dropped; "\0" (every key) when all bytes
  // are 0xff or the prefix is empty.
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) != 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdClientOptions options) {
  if (options.clock == nullptr) return absl::InvalidArgumentError("EtcdClient needs a clock");
  std::vector<std::string> addresses;
  for (absl::string_view part : absl::StrSplit(options.endpoints, ',', absl::SkipWhitespace())) {
    const size_t colon = part.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(part.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", part, "' is not HOST:PORT (in '", options.endpoints, "')"));
    }
    addresses.emplace_back(part);
  }
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no etcd endpoint in '", options.endpoints, "'"));
  }
  std::vector<std::unique_ptr<Endpoint>> endpoints;
  const int backoff_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  for (const std::string& address : addresses) {
    grpc::ChannelArguments args;
    // Reconnect soon after etcd comes back. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also
    // the connection attempt's timeout, and a slow handshake must not fail for it.)
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(backoff_ms, 100));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
    // Each client has its own connections: two clients in one process (two servers in a test)
    // must not share a subchannel, so that one can lose its connection without the other.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A member that hangs (stopped, cut off) with a watch stream open is noticed by pings:
    // within about kKeepaliveTime + kKeepaliveTimeout. (etcd refuses pings more often than every
    // 5 s by default: --grpc-keepalive-min-time.)
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    // A name may be re-resolved when its connection fails: at most this often, not gRPC's
    // default of every 30 s, so a restarted member is found again within a second.
    args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, backoff_ms);
    endpoints.push_back(
        std::make_unique<Endpoint>(address, std::move(args), 2 * options.max_reconnect_backoff,
                                   options.credentials));
  }
  auto ring = std::make_shared<EndpointRing>(std::move(endpoints));
  return std::make_unique<EtcdClientImpl>(std::move(options), std::move(addresses),
                                          std::move(ring));
}

}  // namespace retrybudget::etcd
