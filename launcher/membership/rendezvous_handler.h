#pragma once
// A rendezvous backend: the seam between supervision and membership, as the four roles its
// callers use, each in its own header:
// - Membership (membership.h): the next world, the end of the current one, leaving, the
//   preflight shared before joining. The agent and main().
// - JobOutcome (job_outcome.h): the job-wide failure count, the root cause found elsewhere,
//   the end of the run. The agent.
// - HealthBus (health_bus.h): the nodes' status lines and stacks on demand. The live view and
//   the stacks service (and the agent, which posts the other nodes' requests to its loop).
// - NodeValues (node_values.h): a small value per node and round. The checkpoint keeper and
//   the live view.
// Each part takes only the role it uses, so that a reader (and a test's fake) sees what it can
// do to the job; only the agent, which wires its parts to their roles, and the backend
// registry (backends.h, the gRPC plugin's boundary) hold the whole backend.
//
// One node has LocalRendezvous (local_rendezvous.h); jobs of several nodes GrpcRendezvous
// (grpc_rendezvous.h, over the gRPC service) or the etcd rendezvous (etcd/etcd_rendezvous.h);
// what those two share, and their threading contract, is multi_node_rendezvous.h. Every backend
// plays every role: one node's bus and values do nothing, which is what they mean there.
#include "launcher/membership/health_bus.h"
#include "launcher/membership/job_outcome.h"
#include "launcher/membership/membership.h"
#include "launcher/membership/node_values.h"

namespace ddpl::launcher {

class RendezvousHandler : public Membership,
                          public JobOutcome,
                          public HealthBus,
                          public NodeValues {
 public:
  ~RendezvousHandler() override = default;
};

}  // namespace ddpl::launcher
