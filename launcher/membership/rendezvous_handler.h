#pragma once
// The seam between supervision and membership. The agent asks for a world before each
// attempt and learns when the world it runs in ends. One node uses LocalRendezvous; jobs of
// several nodes use GrpcRendezvous (launcher/membership/grpc_rendezvous.h, over the gRPC
// service) or the etcd rendezvous (launcher/membership/etcd/etcd_rendezvous.h); what those two
// share, and their threading contract, is launcher/membership/multi_node_rendezvous.h.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

class RendezvousHandler {
 public:
  using Done = std::function<void(std::optional<WorldAssignment> world, std::string error)>;
  using RoundEnded = std::function<void(int64_t round, std::string reason)>;

  virtual ~RendezvousHandler() = default;

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
  virtual std::optional<double> fencedStopWithin(int64_t /*round*/) { return std::nullopt; }

  // Whether this node is still a member of the round of the last assigned world. Asked before a
  // worker failure is counted: a node that was evicted meanwhile (stopped past the heartbeat
  // window, then continued) sees its workers die of the re-formed group, which is a membership
  // change, not a failure of the job. Bounded; true when it cannot be told.
  virtual bool roundStillCurrent() = 0;

  // Publishes that this node's worker group failed (`summary`: the root cause, for the other
  // nodes' reports) and returns the job-wide failure count including this one. Bounded.
  virtual int recordFailure(const std::string& summary) = 0;

  // The root cause another node published, when the job failed there; "" if none.
  virtual std::string jobFailure() = 0;

  // The launcher is done. success: this node's workers all succeeded; waits (bounded by the
  // close timeout) for the other nodes to finish too, so that leaving doesn't end their round.
  // Returns false when the job failed elsewhere meanwhile. Always leaves the rendezvous.
  virtual bool finish(bool success) = 0;

  // A stop signal came: this node is going. Leaves the round now, before its workers are
  // stopped, so that the other nodes learn of a node leaving (and re-form) before their
  // workers fail on the connections to this node's, which they would count as the job's
  // failure. Only while workers run (no join in flight). Bounded; finish() still runs later.
  // Default: nothing (one node).
  virtual void leaveEarly() {}
  // Called on the agent's loop thread once a group's workers are forked and exec'ed: work that
  // no worker needs at once (starting the embedded store's gRPC server) goes here, so that it
  // neither delays the forks nor makes them copy a bigger process.
  virtual void workersStarted() {}

  virtual std::string describe() const = 0;

  // This node's preflight (--preflight), before it joins: a few lines, for the job-wide table
  // that group rank 0's agent logs when the round forms (issue 13). Bounded; never throws.
  virtual void publishPreflight(const std::string& /*report*/) {}

  // This node stops before joining: its preflight failed under --preflight=strict (`reason`:
  // the host and the failed checks). Tells the job at once, instead of leaving the other nodes
  // to wait out the join timeout for it: when min nodes can then no longer come, the round
  // being formed fails on every node waiting in it, with this node's host and reason (and so
  // does a join that comes later, within a join timeout); when they still can, the others go
  // on without it. main() calls it instead of startRendezvous(), then exits. Bounded (a hosting
  // agent keeps serving a little longer so that the other nodes can learn it). Never throws.
  virtual void stopBeforeJoining(const std::string& /*reason*/) {}

  // ---- The job's health across nodes (issue 18). One node has nothing to share: the
  // defaults do nothing.

  // This node's status (a line of the live view), for the other nodes and the user. Returns
  // at once; a background thread publishes the latest one every few seconds.
  virtual void publishStatus(const std::string& /*line*/) {}
  // The latest status of every other node of the round: "node N (host): <line>, Ts ago".
  // Bounded (a few seconds at most).
  virtual std::vector<std::string> otherNodesStatus() { return {}; }
  // Stacks on every node. requestStacks() asks every other node to save its workers' stacks
  // now and returns the request's id (0: no other node); each node's agent hears of it
  // through the callback (on any thread), saves, and answers with answerStacks();
  // stacksAnswers() returns the answers there are now and the nodes yet to answer (it does not
  // wait: the caller answers other nodes' requests meanwhile, which may come at the same
  // moment). All bounded.
  using StacksRequested = std::function<void(int64_t id, std::string why)>;
  virtual void setStacksRequestedCallback(StacksRequested /*requested*/) {}
  virtual int64_t requestStacks(const std::string& /*why*/) { return 0; }
  virtual void answerStacks(int64_t /*id*/, const std::string& /*answer*/) {}
  struct StacksAnswers {
    std::vector<std::string> answers;
    std::vector<int> missing;  // group ranks of the nodes that have not answered yet
  };
  virtual StacksAnswers stacksAnswers(int64_t /*id*/) { return {}; }

  // ---- A small value per node and round, through the job's store (the checkpoint replicas'
  // endpoints, issue 29). One node has no other node: both do nothing. Bounded like the
  // health calls (a few seconds at most); nodeValue returns none when the node has published
  // nothing in the current round.
  virtual void publishNodeValue(const std::string& /*key*/, const std::string& /*value*/) {}
  virtual std::optional<std::string> nodeValue(const std::string& /*key*/, int /*node*/) {
    return std::nullopt;
  }
};

}  // namespace ddpl::launcher
