#include "tools/fleet/cluster_chaos.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/subprocess.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"

namespace retrybudget::fleet {
namespace {

absl::Status Bad(absl::string_view action, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--cluster-chaos: '", action, "': ", why));
}

bool ParseSeconds(absl::string_view text, double* out) {
  return absl::SimpleAtod(text, out) && std::isfinite(*out) && *out >= 0;
}

// grpc.health.v1.Health/Check of the whole server (an empty HealthCheckRequest), called raw:
// the tool has no generated health stub. SERVING is field 1 = 1, i.e. the bytes 08 01.
bool HealthServing(grpc::Channel& channel) {
  static const grpc::internal::RpcMethod kCheck("/grpc.health.v1.Health/Check",
                                                grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  grpc::Slice empty;  // an empty HealthCheckRequest (service ""): one empty slice, a valid message
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      &channel, kCheck, &context, request, &response);
  if (!status.ok()) return false;
  grpc::Slice slice;
  if (!response.TrySingleSlice(&slice).ok() && !response.DumpToSingleSlice(&slice).ok()) {
    return false;
  }
  return slice.size() == 2 && slice.begin()[0] == 0x08 && slice.begin()[1] == 0x01;
}

// One step of the timeline: action `index` done (undo = false) or undone.
struct Step {
  double at;
  size_t index;
  bool undo;
};

}  // namespace

absl::StatusOr<std::vector<ClusterAction>> ParseClusterChaos(absl::string_view spec, int servers,
                                                             int etcd_nodes) {
  std::vector<ClusterAction> plan;
  if (absl::StripAsciiWhitespace(spec).empty()) return plan;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::pair<absl::string_view, absl::string_view> what_when = absl::StrSplit(item, '@');
    if (what_when.second.empty()) return Bad(item, "wants ACTION@SECONDS");
    ClusterAction a;
    std::pair<absl::string_view, absl::string_view> at_for =
        absl::StrSplit(what_when.second, absl::MaxSplits('+', 1));
    if (!ParseSeconds(at_for.first, &a.at)) return Bad(item, "bad time");
    if (!at_for.second.empty()) {
      double d = 0;
      if (!ParseSeconds(at_for.second, &d)) return Bad(item, "bad duration after '+'");
      a.for_seconds = d;
    }
    std::pair<absl::string_view, absl::string_view> verb_server =
        absl::StrSplit(what_when.first, absl::MaxSplits(':', 1));
    const absl::string_view verb = verb_server.first;
    const bool needs_server =
        verb == "kill" || verb == "stop" || verb == "restart" || verb == "term";
    const bool names_member =
        verb == "restart-etcd" || (verb == "stop-etcd" && !verb_server.second.empty());
    if (verb == "kill") {
      a.kind = ClusterAction::Kind::kKill;
    } else if (verb == "term") {
      a.kind = ClusterAction::Kind::kTerm;
    } else if (verb == "stop") {
      a.kind = ClusterAction::Kind::kStop;
      if (!a.for_seconds) return Bad(item, "a stopped server needs +SECONDS to resume");
    } else if (verb == "restart") {
      a.kind = ClusterAction::Kind::kRestart;
      if (a.for_seconds) return Bad(item, "restart takes no +SECONDS");
    } else if (verb == "kill-etcd-leader") {
      a.kind = ClusterAction::Kind::kKillEtcdLeader;
      if (a.for_seconds) return Bad(item, "kill-etcd-leader takes no +SECONDS");
    } else if (verb == "stop-etcd" && names_member) {
      a.kind = ClusterAction::Kind::kStopEtcdMember;
      if (!a.for_seconds) return Bad(item, "a stopped etcd member needs +SECONDS to return");
    } else if (verb == "stop-etcd") {
      a.kind = ClusterAction::Kind::kStopEtcd;
    } else if (verb == "restart-etcd") {
      a.kind = ClusterAction::Kind::kRestartEtcdMember;
      if (a.for_seconds) return Bad(item, "restart-etcd takes no +SECONDS");
    } else if (verb == "lose-quorum") {
      a.kind = ClusterAction::Kind::kLoseQuorum;
      if (!a.for_seconds) return Bad(item, "a lost quorum needs +SECONDS to return");
    } else if (verb == "rolling-restart") {
      a.kind = ClusterAction::Kind::kRollingRestart;
    } else {
      return Bad(item,
                 "unknown action (kill, stop, term, restart, kill-etcd-leader, stop-etcd, "
                 "restart-etcd, lose-quorum, rolling-restart)");
    }
    if (names_member) {
      if (!absl::SimpleAtoi(verb_server.second, &a.server) || a.server < 0 ||
          a.server >= etcd_nodes) {
        return Bad(item, absl::StrCat("the etcd member must be an index below ", etcd_nodes));
      }
    } else if (needs_server) {
      if (verb_server.second == "owner") {
        a.server = -1;
      } else if (!absl::SimpleAtoi(verb_server.second, &a.server) || a.server < 0 ||
                 a.server >= servers) {
        return Bad(item, absl::StrCat("the server must be `owner` or an index below ", servers));
      }
    } else if (!verb_server.second.empty()) {
      return Bad(item, "this action takes no server");
    }
    plan.push_back(a);
  }
  return plan;
}

ClusterChaos::ClusterChaos(testing::ClusterUnderTest& cluster, std::vector<ClusterAction> plan,
                           std::string tenant, std::chrono::steady_clock::time_point start)
    : cluster_(cluster), plan_(std::move(plan)), tenant_(std::move(tenant)), start_(start) {
  for (int i = 0; i < cluster_.server_count(); ++i) {
    addresses_.push_back(cluster_.server(i).address());
  }
  health_.resize(addresses_.size());
  health_thread_ = std::jthread([this](std::stop_token stop) { WatchHealth(stop); });
  thread_ = std::jthread([this](std::stop_token stop) { Play(stop); });
}

void ClusterChaos::WatchHealth(std::stop_token stop) {
  // A restarted server must be seen at once: reconnect backoff of 50-100 ms, not gRPC's 1-120 s.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 100);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const std::string& address : addresses_) {
    channels.push_back(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  std::mutex mu;
  std::condition_variable_any cv;
  while (!stop.stop_requested()) {
    for (size_t i = 0; i < channels.size(); ++i) {
      const double sent = Now();
      health_[i].emplace_back(sent, HealthServing(*channels[i]));
    }
    std::unique_lock lock(mu);
    cv.wait_for(lock, stop, std::chrono::milliseconds(50), [] { return false; });
  }
}

std::string ClusterChaos::Terminate(int server, const std::string& who) {
  const double at = Now();
  hits_.push_back({.at = at, .server = server, .what = absl::StrCat("SIGTERM ", who)});
  absl::StatusOr<int> exited = cluster_.server(server).Stop(SIGTERM, absl::Seconds(10));
  const double seconds = Now() - at;
  const std::string how =
      exited.ok() ? DescribeWaitStatus(*exited) : absl::StrCat("FAILED: ", exited.status().message());
  stops_.push_back({.at = at, .server = server, .seconds = seconds, .exit = how});
  return absl::StrFormat("SIGTERM %s (%s after %.3f s)", who, how, seconds);
}

absl::Status ClusterChaos::Restart(int server) {
  restarts_.push_back({.at = Now(), .server = server});
  absl::Status st = cluster_.RestartServer(server);
  if (!st.ok()) restarts_.back().error = std::string(st.message());
  return st;
}

ClusterChaos::~ClusterChaos() { Finish(); }

double ClusterChaos::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ClusterChaos::Record(const std::string& what) {
  events_.push_back(absl::StrFormat("%.3f %s", Now(), what));
}

void ClusterChaos::Play(std::stop_token stop) {
  std::vector<Step> steps;
  for (size_t i = 0; i < plan_.size(); ++i) {
    steps.push_back({plan_[i].at, i, false});
    if (plan_[i].for_seconds && plan_[i].kind != ClusterAction::Kind::kRollingRestart) {
      steps.push_back({plan_[i].at + *plan_[i].for_seconds, i, true});
    }
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.at < b.at; });
  std::vector<int> hit(plan_.size(), -1);  // the server each action hit (0 for etcd), -1: none
  std::vector<bool> undone(plan_.size(), false);
  std::vector<std::vector<int>> members(plan_.size());  // the etcd members each action killed
  std::mutex mu;
  std::condition_variable_any cv;
  auto sleep_until = [&](double seconds) {
    std::unique_lock lock(mu);
    return !cv.wait_until(lock, stop,
                          start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(seconds)),
                          [] { return false; });
  };
  auto undo = [&](size_t i) {
    const ClusterAction& a = plan_[i];
    undone[i] = true;
    absl::Status st;
    std::string what;
    switch (a.kind) {
      case ClusterAction::Kind::kKill:
      case ClusterAction::Kind::kTerm:
        st = Restart(hit[i]);
        what = absl::StrCat("restart server ", hit[i]);
        break;
      case ClusterAction::Kind::kStop:
        st = cluster_.ResumeServer(hit[i]);
        what = absl::StrCat("SIGCONT server ", hit[i]);
        break;
      case ClusterAction::Kind::kStopEtcd:
        st = cluster_.StartAllEtcd();
        what = "start all etcd";
        break;
      case ClusterAction::Kind::kStopEtcdMember:
      case ClusterAction::Kind::kLoseQuorum:
        what = absl::StrCat("start etcd member(s) ", absl::StrJoin(members[i], ","));
        for (int m : members[i]) {
          if (st.ok()) st = cluster_.etcd().RestartEtcdNode(m);
        }
        if (st.ok() && a.kind == ClusterAction::Kind::kLoseQuorum) {
          absl::StatusOr<int> leader = cluster_.etcd().WaitForEtcdLeader(absl::Seconds(20));
          st = leader.status();
          if (leader.ok()) absl::StrAppend(&what, ", quorum back (leader member ", *leader, ")");
        }
        break;
      default:
        return;
    }
    Record(st.ok() ? what : absl::StrCat(what, " FAILED: ", st.message()));
  };
  for (const Step& step : steps) {
    if (!sleep_until(step.at)) break;
    const ClusterAction& a = plan_[step.index];
    if (step.undo) {
      if (hit[step.index] >= 0) undo(step.index);
      continue;
    }
    int server = a.server;
    std::string who = absl::StrCat("server ", server);
    if (server < 0 &&
        (a.kind == ClusterAction::Kind::kKill || a.kind == ClusterAction::Kind::kStop ||
         a.kind == ClusterAction::Kind::kRestart || a.kind == ClusterAction::Kind::kTerm)) {
      absl::StatusOr<int> owner = cluster_.OwnerOf(tenant_);
      if (!owner.ok()) {
        Record(absl::StrCat("no owner of '", tenant_, "' to hit: ", owner.status().message()));
        continue;
      }
      server = *owner;
      who = absl::StrCat("server ", server, " (owner of '", tenant_, "')");
    }
    absl::Status st;
    std::string what;
    switch (a.kind) {
      case ClusterAction::Kind::kKill:
        hits_.push_back({.at = Now(), .server = server, .what = absl::StrCat("kill -9 ", who)});
        st = cluster_.KillServer(server);
        what = absl::StrCat("kill -9 ", who);
        break;
      case ClusterAction::Kind::kTerm:
        what = Terminate(server, who);
        break;
      case ClusterAction::Kind::kStop:
        hits_.push_back({.at = Now(), .server = server, .what = absl::StrCat("SIGSTOP ", who)});
        st = cluster_.PauseServer(server);
        what = absl::StrCat("SIGSTOP ", who);
        break;
      case ClusterAction::Kind::kRollingRestart: {
        const double gap = a.for_seconds.value_or(2);
        bool stopped = false;
        for (int i = 0; i < cluster_.server_count() && !stopped; ++i) {
          const std::string name = absl::StrCat("server ", i);
          Record(Terminate(i, name));
          absl::Status restarted = Restart(i);
          if (restarted.ok()) restarted = cluster_.WaitUntilJoined(i, absl::Seconds(10));
          Record(restarted.ok()
                     ? absl::StrCat("restart ", name, ", joined")
                     : absl::StrCat("restart ", name, " FAILED: ", restarted.message()));
          if (i + 1 < cluster_.server_count()) stopped = !sleep_until(Now() + gap);
        }
        what = "rolling restart done";
        break;
      }
      case ClusterAction::Kind::kRestart:
        st = Restart(server);
        what = absl::StrCat("restart ", who);
        break;
      case ClusterAction::Kind::kKillEtcdLeader: {
        absl::StatusOr<int> leader = cluster_.KillEtcdLeader();
        st = leader.status();
        what = leader.ok() ? absl::StrCat("kill -9 etcd leader (member ", *leader, ")")
                           : "kill -9 etcd leader";
        break;
      }
      case ClusterAction::Kind::kStopEtcd:
        st = cluster_.StopAllEtcd();
        what = "kill -9 all etcd";
        break;
      case ClusterAction::Kind::kRestartEtcdMember:
        st = cluster_.etcd().KillEtcdNode(a.server);
        if (st.ok()) st = cluster_.etcd().RestartEtcdNode(a.server);
        what = absl::StrCat("kill -9 etcd member ", a.server, ", started again");
        break;
      case ClusterAction::Kind::kStopEtcdMember:
        st = cluster_.etcd().KillEtcdNode(a.server);
        members[step.index] = {a.server};
        what = absl::StrCat("kill -9 etcd member ", a.server);
        break;
      case ClusterAction::Kind::kLoseQuorum: {
        const int n = cluster_.etcd().etcd_node_count();
        for (int m = 0; m <= n / 2 && st.ok(); ++m) {
          st = cluster_.etcd().KillEtcdNode(m);
          members[step.index].push_back(m);
        }
        what = absl::StrCat("kill -9 etcd members ", absl::StrJoin(members[step.index], ","),
                            " of ", n, " (no quorum)");
        break;
      }
    }
    if (st.ok()) hit[step.index] = std::max(server, 0);  // etcd actions: 0, done
    Record(st.ok() ? what : absl::StrCat(what, " FAILED: ", st.message()));
  }
  // Undo what is still in force: the final Syncs need servers and etcd.
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (!undone[i] && plan_[i].kind != ClusterAction::Kind::kKill &&
        plan_[i].kind != ClusterAction::Kind::kTerm && hit[i] >= 0 && plan_[i].for_seconds) {
      undo(i);
    }
  }
}

std::vector<std::string> ClusterChaos::Finish() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
  if (health_thread_.joinable()) {
    health_thread_.request_stop();
    health_thread_.join();
    // Each start: the first poll sent after it that answered SERVING.
    for (ServerRestart& r : restarts_) {
      if (!r.error.empty() || r.server < 0 || r.server >= static_cast<int>(health_.size())) {
        continue;
      }
      for (const auto& [sent, serving] : health_[r.server]) {
        if (sent >= r.at && serving) {
          r.serving_after = sent - r.at;
          break;
        }
      }
    }
  }
  return events_;
}

}  // namespace retrybudget::fleet
