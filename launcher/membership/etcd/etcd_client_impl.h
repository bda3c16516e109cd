#pragma once
// What etcd_client.cc, etcd_lease_keeper.cc and etcd_watch.cc share: the endpoints and the call
// that tries them in turn. Internal to the etcd client: it includes gRPC and etcd's protos.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "etcd/rpc.grpc.pb.h"
#include "launcher/membership/etcd/etcd_client.h"

namespace ddpl::launcher {
namespace etcd_detail {

using Clock = std::chrono::steady_clock;
namespace pb = etcdserverpb;

struct Endpoint {
  std::string name;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Auth::Stub> auth;
};

// Errors worth another endpoint (or another try on the same one): the member is down or
// unreachable, or it has no leader for the moment (etcd answers UNAVAILABLE: "etcdserver: no
// leader", "leader changed", "request timed out").
bool retryable(const grpc::Status& s);
// etcd's answers that mean the credentials are missing or wrong.
bool authFailure(const grpc::Status& s);
EtcdKv fromPb(const mvccpb::KeyValue& kv);
// gRPC takes deadlines on the system clock only; ours are steady.
std::chrono::system_clock::time_point wallDeadline(Clock::time_point t);
std::string describe(std::chrono::milliseconds d);
// For the long-lived streams (watches, lease keep-alives), as clientv3's WithRequireLeader:
// a member cut from its leader would keep such a stream open and silent (its watches see no
// new revision, its keep-alives renew nothing) until the partition heals. With this metadata
// etcd ends the stream ("no leader") about three election timeouts after the member lost its
// leader, and refuses a new one while it has none, so the stream moves to a member that has.
inline void requireLeader(grpc::ClientContext& ctx) { ctx.AddMetadata("hasleader", "true"); }

}  // namespace etcd_detail

struct EtcdClient::Impl {
  using Endpoint = etcd_detail::Endpoint;

  EtcdOptions o;
  std::vector<Endpoint> eps;
  std::atomic<size_t> current{0};  // the endpoint that answered last: tried first
  std::mutex token_mu;
  std::string token;

  // Runs `fn` on one endpoint after another until one answers, for at most `timeout`.
  // Throws with every endpoint's last error when none does.
  grpc::Status invoke(const std::string& op, std::chrono::milliseconds timeout,
                      const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& fn,
                      bool with_token = true);
  void authenticate(std::chrono::milliseconds timeout);
  std::string tokenNow();
  etcdserverpb::RangeResponse range(const std::string& key, const std::string& range_end);
};

}  // namespace ddpl::launcher
