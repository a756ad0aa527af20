#include "server/cluster_mode.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/security/credentials.h"
#include "retrybudget/clock.h"
#include "server/log_rate_limit.h"

namespace retrybudget {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool ValidHostPort(absl::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int port = 0;
  return absl::SimpleAtoi(s.substr(colon + 1), &port) && port > 0 && port < 65536;
}

}  // namespace

absl::Status ValidateClusterFlags(const ClusterFlags& f) {
  if (!f.enabled()) {
    if (!f.advertise.empty() || !f.etcd_ca.empty() || !f.etcd_cert.empty() ||
        !f.etcd_key.empty()) {
      return absl::InvalidArgumentError(
          "--advertise and --etcd_ca/--etcd_cert/--etcd_key need --etcd_endpoints (cluster mode)");
    }
    return absl::OkStatus();
  }
  for (absl::string_view e : absl::StrSplit(f.etcd_endpoints, ',')) {
    if (!ValidHostPort(e)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd_endpoints=", f.etcd_endpoints, ": \"", e, "\" is not HOST:PORT"));
    }
  }
  if (!f.advertise.empty() && !ValidHostPort(f.advertise)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--advertise=", f.advertise, " is not HOST:PORT"));
  }
  if (f.advertise.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--advertise=", f.advertise, " has a '/'"));
  }
  if (f.etcd_prefix.empty() || f.etcd_prefix.front() != '/' || f.etcd_prefix.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_prefix=", f.etcd_prefix, " must start with '/' and not end with one"));
  }
  if (f.shards < 1 || f.shards > cluster::kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards=", f.shards, " must be in [1, ", cluster::kMaxShards, "]"));
  }
  if (f.lease_ttl < absl::Seconds(2) || f.lease_ttl != absl::Seconds(absl::ToInt64Seconds(f.lease_ttl))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd_lease_ttl=", absl::FormatDuration(f.lease_ttl),
        " must be whole seconds, at least 2s"));
  }
  if (f.etcd_cert.empty() != f.etcd_key.empty()) {
    return absl::InvalidArgumentError("--etcd_cert and --etcd_key go together");
  }
  if (!f.etcd_cert.empty() && f.etcd_ca.empty()) {
    return absl::InvalidArgumentError("--etcd_cert/--etcd_key need --etcd_ca");
  }
  return absl::OkStatus();
}

ClusterMode::ClusterMode(ClusterFlags flags, std::unique_ptr<etcd::EtcdClient> etcd,
                         cluster::ShardMap map, std::function<void(absl::string_view)> log)
    : flags_(std::move(flags)), log_(std::move(log)), etcd_(std::move(etcd)), map_(map) {
  router_ = std::make_unique<ClusterRouter>(
      etcd_.get(), map_, ClusterRouterOptions{.prefix = flags_.etcd_prefix, .log = log_});
}

ClusterMode::~ClusterMode() {
  etcd_->EndCallsBy(absl::Now());  // a join in progress gives up at once
  joiner_ = std::jthread();
  health_ = std::jthread();
  router_->Stop();
  ownership_.reset();  // without a Shutdown: as a crash (Leave() hands over)
}

absl::StatusOr<std::unique_ptr<ClusterMode>> ClusterMode::Create(
    const ClusterFlags& flags, std::function<void(absl::string_view)> log) {
  if (auto s = ValidateClusterFlags(flags); !s.ok()) return s;
  etcd::EtcdClientOptions options{.endpoints = flags.etcd_endpoints};
  if (!flags.etcd_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadPem("etcd_ca", flags.etcd_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!flags.etcd_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPem("etcd_cert", flags.etcd_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem("etcd_key", flags.etcd_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    options.credentials = grpc::SslCredentials(ssl);
  }
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd = etcd::EtcdClient::Create(options);
  if (!etcd.ok()) return etcd.status();
  // The flag's number of shards; Join checks it against etcd's before anything is served.
  return std::unique_ptr<ClusterMode>(
      new ClusterMode(flags, *std::move(etcd), cluster::ShardMap(flags.shards), std::move(log)));
}

absl::Status ClusterMode::Join(BudgetCore* core, BudgetServer* server, const std::string& advertise,
                               std::function<void(const absl::Status&)> refused) {
  server->SetServing(false);
  if (flags_.exit_if_etcd_unavailable) return TryJoin(core, server, advertise);
  joiner_ = std::jthread([this, core, server, advertise,
                          refused = std::move(refused)](std::stop_token stop) {
    JoinUntilDone(stop, core, server, advertise, refused);
  });
  return absl::OkStatus();
}

void ClusterMode::JoinUntilDone(std::stop_token stop, BudgetCore* core, BudgetServer* server,
                                const std::string& advertise,
                                const std::function<void(const absl::Status&)>& refused) {
  // etcd's failures are logged at most every 10 s (each line counts those held back).
  LogRateLimiter limit(absl::Seconds(10));
  absl::Duration backoff = absl::Milliseconds(200);
  const absl::Time since = absl::Now();
  for (int attempt = 1; !stop.stop_requested(); ++attempt) {
    const absl::Status status = TryJoin(core, server, advertise);
    if (status.ok()) {
      if (attempt > 1 && log_) {
        log_(absl::StrCat("etcd reached after ", attempt, " attempts in ",
                          absl::FormatDuration(absl::Trunc(absl::Now() - since,
                                                           absl::Milliseconds(1))),
                          "; joined"));
      }
      return;
    }
    if (absl::IsFailedPrecondition(status) || absl::IsInvalidArgument(status)) {
      if (refused) refused(status);
      return;
    }
    if (std::optional<std::string> line = limit.Admit(absl::StrCat(
            "cannot join the cluster yet (health NOT_SERVING, Syncs refused UNAVAILABLE; trying "
            "etcd again): ",
            status.message()));
        line.has_value() && log_) {
      log_(*line);
    }
    Clock::Real()->SleepUntil(absl::Now() + backoff, stop);
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
}

absl::Status ClusterMode::TryJoin(BudgetCore* core, BudgetServer* server,
                                  const std::string& advertise) {
  absl::StatusOr<cluster::ShardMap> map =
      cluster::ShardMap::Join(*etcd_, flags_.etcd_prefix, flags_.shards);
  if (!map.ok()) return map.status();
  absl::StatusOr<std::unique_ptr<cluster::OwnershipManager>> ownership =
      cluster::OwnershipManager::Start(
          etcd_.get(), map_,
          {.prefix = flags_.etcd_prefix,
           .server_id = advertise,
           .advertise = advertise,
           .lease_ttl = flags_.lease_ttl,
           .before_release = router_->BeforeReleaseCallback(),
           .before_release_all = router_->BeforeReleaseAllCallback(),
           .on_change = router_->OnChangeCallback()});
  if (!ownership.ok()) return ownership.status();
  ownership_ = *std::move(ownership);
  router_->Start(core, ownership_.get());
  joined_.store(ownership_.get(), std::memory_order_release);
  if (log_) {
    log_(absl::StrCat("cluster mode: joined as ", advertise, " (", map_.shards(),
                      " shards, lease TTL ", absl::FormatDuration(flags_.lease_ttl),
                      ", etcd prefix ", flags_.etcd_prefix, ")"));
  }
  health_ = std::jthread([this, server](std::stop_token stop) {
    bool serving = false;
    while (!stop.stop_requested()) {
      const bool alive = ownership_->SurelyAlive(absl::Now());
      if (alive != serving) {
        server->SetServing(alive);
        serving = alive;
        if (log_) {
          log_(alive ? "health SERVING: this server holds a live etcd lease"
                     : "health NOT_SERVING: this server cannot be sure of its etcd lease");
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  return absl::OkStatus();
}

v1::ListShardsResponse ClusterMode::ListShards() const {
  v1::ListShardsResponse response;
  response.set_cluster_mode(true);
  const cluster::OwnershipManager* ownership = joined_.load(std::memory_order_acquire);
  for (int s = 0; s < map_.shards(); ++s) {
    v1::ShardInfo* info = response.add_shards();
    info->set_shard(s);
    if (ownership == nullptr) continue;
    if (std::optional<cluster::ShardOwner> owner = ownership->OwnerOf(s)) {
      info->set_owner_id(owner->server_id);
      info->set_owner_address(owner->address);
    }
    info->set_owned_here(ownership->FencingToken(s).has_value());
  }
  return response;
}

void ClusterMode::Leave(absl::Time deadline) {
  // Whatever etcd does, nothing waits for it past the deadline: the background calls in flight
  // (joining, reconciler, writer, keep-alive) are cancelled now, so that the final states go out
  // at once.
  etcd_->EndCallsBy(deadline);
  joiner_ = std::jthread();  // if it had not joined yet, there is nothing to hand over
  health_ = std::jthread();
  router_->Stop();  // no reservation is written any more: no Sync runs
  if (ownership_ != nullptr) {
    if (absl::Status s = ownership_->Shutdown(); !s.ok() && log_) {
      log_(absl::StrCat("leaving the cluster: ", s.message()));
    }
  }
  router_->Stop();
}

}  // namespace retrybudget
