#pragma once
// Membership, one of the roles a rendezvous backend plays (rendezvous_handler.h has them all):
// the agent asks for a world before each attempt, learns when the world it runs in ends, and
// says when its workers started or when it leaves; main() shares the preflight through it
// before the first join. Only the agent and main() hold this role. One node has
// LocalRendezvous; jobs of several nodes GrpcRendezvous or the etcd rendezvous, over
// MultiNodeRendezvous (multi_node_rendezvous.h: their threading contract).
//
// Every method is pure: what one node does (nothing, for most of the leaving ones) is said in
// LocalRendezvous, next to why.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "rendezvous/state/round_rules.h"

namespace ddpl::launcher {

// The node's place in the round (round_rules::NodePlace: the same type the rendezvous client
// returns, so that the gRPC backend passes it on in one assignment), and what the launcher
// adds for its workers.
struct WorldAssignment : rdzv::round_rules::NodePlace {
  // One node of one worker until a backend fills the place: what a world that never formed
  // (MultiNodeRendezvous::failedForGood) reports.
  WorldAssignment() {
    group_world_size = 1;
    world_size = 1;
  }
  std::string run_id;
  int restart_count = 0;    // job-wide worker-group failures so far (same on every node)
  std::string master_addr;  // where the job's TCPStore listens (rank 0's, or the agent's)
  int master_port = 0;
  // The agent hosts the job's TCPStore (TORCHELASTIC_USE_AGENT_STORE=True): workers connect
  // to MASTER_ADDR:MASTER_PORT as clients, rank 0 hosts nothing.
  bool agent_store = false;
  // Added to every worker's environment for this attempt (the store endpoint, for example).
  std::map<std::string, std::string> worker_env;
};

class Membership {
 public:
  using Done = std::function<void(std::optional<WorldAssignment> world, std::string error)>;
  using RoundEnded = std::function<void(int64_t round, std::string reason)>;

  virtual ~Membership() = default;

  // Starts looking for the next world. `done` runs exactly once, possibly on another thread,
  // possibly before this returns; with no world, `error` says why (and which limit passed).
  virtual void startRendezvous(Done done) = 0;

  // `ended` runs (on any thread) when the round of the last assigned world is no longer
  // valid: a node died, left or wants in. Set once, before the first startRendezvous.
  virtual void setRoundEndedCallback(RoundEnded ended) = 0;

  // When `round` ended because this node fenced itself (it could not reach the service for 2/3
  // of its heartbeat window, or etcd for 2/3 of its lease TTL): the seconds within which its
  // workers must be gone, shorter than the agent's shutdown grace (rendezvous_client.h,
  // fenceAfter). None otherwise.
  virtual std::optional<double> fencedStopWithin(int64_t round) = 0;

  // Whether this node is still a member of the round of the last assigned world. Asked before a
  // worker failure is counted: a node that was evicted meanwhile (stopped past the heartbeat
  // window, then continued) sees its workers die of the re-formed group, which is a membership
  // change, not a failure of the job. Bounded; true when it cannot be told.
  virtual bool roundStillCurrent() = 0;

  // A stop signal came: this node is going. Leaves the round now, before its workers are
  // stopped, so that the other nodes learn of a node leaving (and re-form) before their
  // workers fail on the connections to this node's, which they would count as the job's
  // failure. Only while workers run (no join in flight). Bounded; JobOutcome::finish() still
  // runs later.
  virtual void leaveEarly() = 0;

  // Called on the agent's loop thread once a group's workers are forked and exec'ed: work that
  // no worker needs at once (starting the embedded store's gRPC server) goes here, so that it
  // neither delays the forks nor makes them copy a bigger process.
  virtual void workersStarted() = 0;

  // This node's preflight (--preflight), before it joins: a few lines, for the job-wide table
  // that group rank 0's agent logs when the round forms (issue 13). Bounded; never throws.
  virtual void publishPreflight(const std::string& report) = 0;

  // This node stops before joining: its preflight failed under --preflight=strict (`reason`:
  // the host and the failed checks). Tells the job at once, instead of leaving the other nodes
  // to wait out the join timeout for it: when min nodes can then no longer come, the round
  // being formed fails on every node waiting in it, with this node's host and reason (and so
  // does a join that comes later, within a join timeout); when they still can, the others go
  // on without it. main() calls it instead of startRendezvous(), then exits. Bounded (a hosting
  // agent keeps serving a little longer so that the other nodes can learn it). Never throws.
  virtual void stopBeforeJoining(const std::string& reason) = 0;

  // The backend in a few words ("elastic via host:port").
  virtual std::string describe() const = 0;
};

}  // namespace ddpl::launcher
