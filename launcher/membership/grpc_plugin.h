#pragma once
// Loads libddpl_launch_grpc.so (next to the launcher, in ../lib: common/plugin.h) on first use.
// Everything in `launch` that needs gRPC goes through here, so runs that need none pay nothing
// for it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/plugin.h"
#include "launcher/membership/etcd/etcd_rendezvous.h"
#include "launcher/membership/grpc_rendezvous.h"

namespace ddpl::launcher {

class GrpcPlugin {
 public:
  // Throws ddpl::Error naming the path and the loader's message when it cannot be loaded.
  static GrpcPlugin& get();

  // Returns an opaque server handle; throws ddpl::Error with the server's message.
  // `tcpstore`: torch's TCPStore protocol on the same port (the agent store), with attempt
  // `attempt` open from the start (< 0: none yet), for clients whose socket is
  // `tcpstore_uid`'s (unset: any user's; ServerOptions::tcpstore_uid).
  void* startStore(const std::string& host, int port, const std::string& token, bool tcpstore,
                   int64_t attempt, std::optional<uint32_t> tcpstore_uid);
  void stopStore(void* server);
  // The agent store's next attempt (RendezvousServer::beginTcpStoreAttempt, loopback only).
  void beginStoreAttempt(void* server, int64_t attempt);
  std::unique_ptr<RendezvousHandler> makeGrpc(const GrpcRendezvousConfig& config);
  std::unique_ptr<RendezvousHandler> makeEtcd(const EtcdRendezvousConfig& config);

  static std::string defaultPath();

 private:
  explicit GrpcPlugin(const Plugin& plugin) : plugin_(plugin) {}
  const Plugin& plugin_;
};

}  // namespace ddpl::launcher
