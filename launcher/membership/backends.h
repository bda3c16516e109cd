#pragma once
// The membership backends by --rdzv-backend name: `static` (LocalRendezvous, with --standalone's
// embedded store), `c10d` and `ddpl` (the gRPC backend) and `etcd`, both in the gRPC plugin.
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/environment.h"
#include "launcher/cli/options.h"
#include "launcher/membership/embedded_store.h"
#include "launcher/membership/rendezvous_handler.h"

namespace ddpl::launcher {

// What every backend is made from: the parsed options and this agent's facts.
struct MembershipRequest {
  const LaunchOptions& options;
  const Environment& env;
  std::string run_id;
  int nproc = 1;
  std::string host;
};

// What a backend's factory makes: the whole backend (every role, rendezvous_handler.h), which
// main() hands to the agent, and the store it may serve.
struct MembershipBackend {
  std::unique_ptr<EmbeddedStore> store;  // --standalone's store for the workers; else null
  std::unique_ptr<RendezvousHandler> rdzv;
};

using MembershipFactory = std::function<MembershipBackend(const MembershipRequest&)>;

// Every backend, by name.
const std::map<std::string, MembershipFactory>& membershipBackends();

// The backend that options.rdzv_backend names; throws ddpl::UsageError for an unknown name,
// and what the backend throws (an unreachable service, wrong credentials).
MembershipBackend makeMembership(const MembershipRequest& request);

}  // namespace ddpl::launcher
