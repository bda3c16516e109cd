#include "launcher/membership/backends.h"

#include <unistd.h>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/etcd/etcd_config.h"
#include "launcher/membership/grpc_plugin.h"
#include "launcher/membership/grpc_rendezvous.h"
#include "launcher/membership/local_rendezvous.h"

namespace ddpl::launcher {
namespace {

std::chrono::milliseconds ms(double sec) {
  return std::chrono::milliseconds(static_cast<int64_t>(sec * 1000));
}

RoundsConfig roundsConfig(const MembershipRequest& r) {
  const LaunchOptions& o = r.options;
  RoundsConfig c;
  c.run_id = r.run_id;
  c.node_id = r.host + "-" + std::to_string(getpid());
  c.local_addr = o.local_addr;
  c.local_world_size = r.nproc;
  c.min_nodes = o.nnodes_min;
  c.max_nodes = o.nnodes_max;
  c.max_restarts = o.max_restarts;
  c.join_timeout = ms(o.rdzv_conf.join_timeout_sec);
  c.last_call_timeout = ms(o.rdzv_conf.last_call_timeout_sec);
  c.read_timeout = ms(o.rdzv_conf.read_timeout_sec);
  c.exit_barrier_timeout = ms(o.rdzv_conf.exit_barrier_timeout_sec);
  return c;
}

GrpcRendezvousConfig grpcConfig(const MembershipRequest& r) {
  const LaunchOptions& o = r.options;
  GrpcRendezvousConfig c;
  static_cast<RoundsConfig&>(c) = roundsConfig(r);
  c.endpoint = o.rdzv_endpoint;  // checked by the parser; GrpcRendezvous adds the default port
  c.token = o.rdzv_token;
  c.tls_ca_file = o.rdzv_conf.tls_ca_file;
  if (o.rdzv_conf.is_host)
    c.host =
        *o.rdzv_conf.is_host ? GrpcRendezvousConfig::Host::kYes : GrpcRendezvousConfig::Host::kNo;
  c.heartbeat_window = ms(o.rdzv_conf.heartbeat_timeout_sec);
  c.agent_store = o.agent_store;
  return c;
}

// One node: the agent hosts the job's TCPStore (torch's protocol, our store behind it), as
// torchrun's agent does; --rdzv-conf agent_store=0 or TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
// leave it to rank 0. Several static nodes know nothing of each other's addresses, so rank 0
// hosts it there. --standalone also hands workers our gRPC store (DDPL_STORE_ADDR and token).
MembershipBackend staticBackend(const MembershipRequest& r) {
  const LaunchOptions& o = r.options;
  MembershipBackend m;
  bool agent_store = o.agent_store && o.nnodes_max == 1;
  // A build without gRPC (the GPU kit's) has no plugin to serve it: workers that were told the
  // agent hosts the store would wait on a port nobody serves (a lent GPU host's first warm
  // run hung there), so rank 0 hosts it, as with agent_store=0.
  if (agent_store && !o.standalone && access(GrpcPlugin::defaultPath().c_str(), R_OK) != 0) {
    log::debug("no gRPC plugin at {}: rank 0 hosts the job's TCPStore", GrpcPlugin::defaultPath());
    agent_store = false;
  }
  if (o.standalone || agent_store)
    m.store = std::make_unique<EmbeddedStore>("127.0.0.1", agent_store,
                                              agent_store ? o.master_port.value_or(0) : 0);
  m.rdzv =
      std::make_unique<LocalRendezvous>(r.run_id, r.nproc, o.master_addr, o.master_port,
                                        m.store.get(), o.node_rank, o.nnodes_max, o.standalone);
  return m;
}

MembershipBackend grpcBackend(const MembershipRequest& r) {
  const LaunchOptions& o = r.options;
  if (!o.rdzv_conf.etcd.empty())
    log::warn("--rdzv-conf {}...: etcd keys, ignored by --rdzv-backend={}",
              o.rdzv_conf.etcd.begin()->first, o.rdzv_backend);
  MembershipBackend m;
  m.rdzv = GrpcPlugin::get().makeGrpc(grpcConfig(r));
  return m;
}

MembershipBackend etcdBackend(const MembershipRequest& r) {
  MembershipBackend m;
  m.rdzv = GrpcPlugin::get().makeEtcd(etcdRendezvousConfig(r.options, roundsConfig(r), r.env));
  return m;
}

}  // namespace

const std::map<std::string, MembershipFactory>& membershipBackends() {
  // c10d: torchrun's name for its own service, which ours stands in for.
  static const std::map<std::string, MembershipFactory> kBackends = {
      {"static", staticBackend},
      {"c10d", grpcBackend},
      {"ddpl", grpcBackend},
      {"etcd", etcdBackend},
  };
  return kBackends;
}

MembershipBackend makeMembership(const MembershipRequest& request) {
  const auto& backends = membershipBackends();
  auto it = backends.find(request.options.rdzv_backend);
  if (it == backends.end())
    throw UsageError("--rdzv-backend: '" + request.options.rdzv_backend + "' is not supported");
  return it->second(request);
}

}  // namespace ddpl::launcher
