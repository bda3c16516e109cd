#pragma once
// Multi-node membership for the agent, over the gRPC rendezvous service. Lives in the gRPC
// plugin (libddpl_launch_grpc.so) with EmbeddedStore's server half, so that `launch` itself
// loads gRPC only for jobs that use it. No gRPC in this header.
#include <chrono>
#include <memory>
#include <string>

#include "common/defaults.h"
#include "launcher/membership/rendezvous_handler.h"
#include "launcher/membership/rounds_config.h"

namespace ddpl::launcher {

// The gRPC backend: the rounds' settings and where the rendezvous service is.
struct GrpcRendezvousConfig : RoundsConfig {
  std::string endpoint;  // host:port of the rendezvous service
  std::string token;     // empty: none
  std::string tls_ca_file;
  enum class Host { kAuto, kYes, kNo };
  // kAuto: host the service when the endpoint names this machine and its port is free (the
  // first agent to bind it wins; the rest are clients).
  Host host = Host::kAuto;
  std::chrono::milliseconds heartbeat_window{defaults::kHeartbeatWindow};  // when hosting
  // When hosting: serve the job's TCPStore too (torch's protocol on the service's port, a
  // namespace per round, the round's nodes admitted), so that every node's workers connect to
  // the endpoint as clients (TORCHELASTIC_USE_AGENT_STORE=True). Whether a round has it is the
  // server's answer, not this flag: a standalone rdzv-server does not, and rank 0 then hosts.
  bool agent_store = false;
};

// Throws ddpl::NetworkError naming the endpoint when the service cannot be reached within
// read_timeout, ddpl::AuthError for a wrong token. Which threads call what, and what blocks
// how long: launcher/membership/multi_node_rendezvous.h (the contract of both multi-node backends)
// and the class comment in grpc_rendezvous.cc.
std::unique_ptr<RendezvousHandler> makeGrpcRendezvous(const GrpcRendezvousConfig& config);

}  // namespace ddpl::launcher
