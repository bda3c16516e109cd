#pragma once
// Multi-node membership kept in etcd (--rdzv-backend=etcd): the rounds of the gRPC backend
// (launcher/membership/grpc_rendezvous.h) without a process that hosts them, so the job survives
// the loss of any one machine that etcd itself survives. Lives in the gRPC plugin; no gRPC here.
// Design and key layout: docs/rendezvous.md, "The etcd backend".
#include <chrono>
#include <memory>
#include <string>

#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/rendezvous_handler.h"
#include "launcher/membership/rounds_config.h"

namespace ddpl::launcher {

inline constexpr char kDefaultEtcdPrefix[] = "/ddplaunch";
inline constexpr std::chrono::seconds kDefaultEtcdLeaseTtl{10};

struct EtcdRendezvousConfig {
  RoundsConfig rounds;
  EtcdOptions etcd;
  std::string prefix = kDefaultEtcdPrefix;  // the job's keys live under <prefix>/<run_id>/
  // A node whose keep-alives stop is dropped this long after its last one.
  std::chrono::seconds lease_ttl = kDefaultEtcdLeaseTtl;
};

// Throws NetworkError naming every endpoint tried when etcd cannot be reached within
// etcd.connect_timeout, AuthError for wrong credentials. Threads: as GrpcRendezvous's
// (launcher/membership/multi_node_rendezvous.h), plus a keep-alive thread; details at the class in
// etcd_rendezvous.cc.
std::unique_ptr<RendezvousHandler> makeEtcdRendezvous(const EtcdRendezvousConfig& config);

}  // namespace ddpl::launcher
