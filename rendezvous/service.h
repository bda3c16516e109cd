#pragma once
// Internal to the gRPC layer: the thin adapter from the Store and Rendezvous services to
// KvSpace and RendezvousState. Included only by server.cc and service.cc.
#include <grpcpp/grpcpp.h>

#include <memory>

#include "rendezvous/server.h"

namespace ddpl::rdzv::grpc_detail {

struct ServiceConfig {
  std::string token;
  int64_t max_value_bytes = kDefaultMaxValueBytes;
  Duration max_wait = std::chrono::hours(2);
  Duration heartbeat_window = kDefaultHeartbeatWindow;
  std::string log_name = "rdzv";
};

class Core;

class Services {
 public:
  explicit Services(const ServiceConfig& config);
  ~Services();
  grpc::Service* store();
  grpc::Service* rendezvous();
  // Call before grpc::Server::Shutdown: broken watch streams then no longer evict nodes.
  void beginShutdown();
  ServerStats stats() const;

 private:
  std::unique_ptr<Core> core_;
  std::unique_ptr<grpc::Service> store_;
  std::unique_ptr<grpc::Service> rendezvous_;
};

}  // namespace ddpl::rdzv::grpc_detail
