#pragma once
// Multi-node membership for the agent, over the gRPC rendezvous service. Lives in the gRPC
// plugin (libddpl_launch_grpc.so) with EmbeddedStore's server half, so that `launch` itself
// loads gRPC only for jobs that use it. No gRPC in this header.
#include <chrono>
#include <memory>
#include <string>

#include "common/defaults.h"
#include "launcher/membership/rendezvous_handler.h"

namespace ddpl::launcher {

struct ElasticConfig {
  std::string run_id;
  std::string endpoint;  // host:port of the rendezvous service
  std::string token;     // empty: none
  std::string tls_ca_file;
  std::string node_id;     // unique per agent (host name and pid)
  std::string local_addr;  // empty: the address of the interface that reaches the endpoint
  int local_world_size = 1;
  int min_nodes = 1;
  int max_nodes = 1;
  // Once the job-wide failure count passes this, the job has failed: no node joins again.
  int max_restarts = 0;
  enum class Host { kAuto, kYes, kNo };
  // kAuto: host the service when the endpoint names this machine and its port is free (the
  // first agent to bind it wins; the rest are clients).
  Host host = Host::kAuto;
  std::chrono::milliseconds join_timeout{defaults::kJoinTimeout};
  std::chrono::milliseconds last_call_timeout{defaults::kLastCallTimeout};
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};        // connect + store calls
  std::chrono::milliseconds heartbeat_window{defaults::kHeartbeatWindow};  // when hosting
  std::chrono::milliseconds exit_barrier_timeout{std::chrono::seconds(300)};
};

// Throws ddpl::NetworkError naming the endpoint when the service cannot be reached within
// read_timeout, ddpl::AuthError for a wrong token. Which threads call what, and what blocks
// how long: launcher/membership/multi_node_rendezvous.h (the contract of both multi-node backends)
// and the class comment in elastic_rendezvous.cc.
std::unique_ptr<RendezvousHandler> makeElasticRendezvous(const ElasticConfig& config);

// The local address used to reach host:port (no packet is sent: a UDP connect picks the route).
std::string routeAddressTo(const std::string& host, int port);

}  // namespace ddpl::launcher
