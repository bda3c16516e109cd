#pragma once
// What an agent uses to take part in a run: join a round, keep its membership alive, learn
// at once when the round ends, and leave. No gRPC in this header.
//
//   RendezvousClient client({.endpoint = "head:29400", .token = token});
//   RoundAssignment a = client.join({.run_id = "job7", .node_id = host, .local_world_size = 8,
//                                    .min_nodes = 2, .max_nodes = 4});
//   auto watch = client.watch(a, [&](const RoundChange& c) { /* stop workers, re-join */ });
//   ... start workers with RANK = a.rank_offset + local_rank, WORLD_SIZE = a.world_size,
//       store keys under a.store_prefix ...
//   client.leave(a.run_id, a.node_id);
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/client/grpc_store.h"
#include "rendezvous/state/rendezvous_state.h"
#include "rendezvous/state/round_rules.h"

namespace ddpl::rdzv {

struct RendezvousClientOptions {
  std::string endpoint;     // host:port
  std::string token;        // empty: none
  std::string tls_ca_file;  // empty: plaintext
  std::string tls_cert_file, tls_key_file;
  Duration connect_timeout = kDefaultConnectTimeout;
  Duration call_timeout{std::chrono::seconds(30)};  // heartbeat and leave
};

struct JoinOptions {
  std::string run_id;
  std::string node_id;  // unique per node in the run (e.g. host name + launcher pid)
  int32_t local_world_size = 1;
  std::string version;  // empty: this build's DDPL_VERSION; nodes must agree
  std::string address;  // how other nodes reach this one (becomes MASTER_ADDR on rank 0)
  int32_t min_nodes = 1;
  int32_t max_nodes = 1;
  Duration join_timeout = kDefaultJoinTimeout;
  Duration last_call_timeout = kDefaultLastCallTimeout;
  bool include_members = false;  // also fetch every node's id, address and local world size
};

struct NodeInfo {
  std::string node_id;
  std::string address;
};

// This node's place (round, group rank and size, rank offset, world size: all workers of all
// nodes) is the one type the launcher passes on to its workers (round_rules.h: why one type).
struct RoundAssignment : round_rules::NodePlace {
  std::string run_id;
  std::string node_id;
  int32_t local_world_size = 0;
  // By group rank, only when JoinOptions::include_members (O(N) per reply: a node needs only
  // its own place, above).
  std::vector<int32_t> local_world_sizes;
  std::vector<int32_t> rank_offsets;
  std::string master_address;  // group rank 0's address
  // The server hosts the run's TCPStore (torch's protocol, on its own port) for this round.
  bool agent_store = false;
  std::string store_prefix;  // this run's and round's key namespace
  Duration heartbeat_interval{};
  Duration heartbeat_window{};  // the server's eviction limit; zero from a server that predates it
  std::vector<NodeInfo> members;  // by group rank, when JoinOptions::include_members
};

struct RoundChange {
  std::string run_id;
  int64_t round = 0;
  std::string reason;  // the server's words, e.g. "node 'b' evicted: no heartbeat ..."
  int32_t nodes_waiting = 0;
  bool connection_lost = false;  // the watch could not reach the server
  // This node fenced itself: no heartbeat was answered for fenceAfter(window). Its workers must
  // be gone within stop_within, however long the agent's usual shutdown grace.
  bool fenced = false;
  Duration stop_within{};
};

// Fencing (docs/network-faults.md). The server evicts a node whose heartbeats it has not received
// for its window W, and only then can a round form without it. An agent heartbeats every W/6 and
// counts from the send of its last answered heartbeat (which the server received no earlier): it
// stops its workers after 2W/3 of silence, and kills whatever is left W/6 later, so they are gone
// by 5W/6 on its clock. That holds against the server's W as long as the two clocks' rates
// differ by less than 9% ((1 + d) * 5/6 < 1 / (1 + d)); the rest of the margin covers
// scheduling and signal delivery. A server silent for up to W/2 (2W/3 less a heartbeat
// interval) costs nothing.
inline Duration fenceAfter(Duration window) { return window * 2 / 3; }
inline Duration stopGrace(Duration window) { return window / 6; }
inline Duration heartbeatEvery(Duration window) { return window / 6; }

// Keeps a membership alive: heartbeats every heartbeat_interval and holds the watch stream.
// Destroying it stops both (the server then evicts the node if its round is still current:
// call leave() first to go quietly).
class RoundWatch {
 public:
  virtual ~RoundWatch() = default;
  virtual bool changed() const = 0;  // the callback has run
};

class RoundWatchImpl;

class RendezvousClient {
 public:
  // Connects with bounded retry and jittered backoff (ddpl::NetworkError naming the endpoint
  // after connect_timeout; ddpl::AuthError at once for a wrong token).
  explicit RendezvousClient(const RendezvousClientOptions& options);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  // Blocks until this node's round completes. Throws TimeoutError when the join timeout
  // passes with too few nodes, InvalidArgument for bad options, StoreError for refusals
  // (version skew, duplicate node id, run full), AuthError, NetworkError once the server has
  // been unreachable for connect_timeout (a server that restarts within it gets the join
  // again). Timeouts up to INT64_MAX ms mean "very long" (capped at ten years).
  RoundAssignment join(const JoinOptions& options);

  // The same without blocking a thread: `done` runs once on a client thread with either the
  // assignment or the exception join() would have thrown. Unlike join(), an unreachable
  // server is reported at once (NetworkError), not retried.
  void joinAsync(const JoinOptions& options,
                 std::function<void(RoundAssignment, std::exception_ptr)> done);

  // Returns how many nodes wait for the next round. Throws StoreError when the round is no
  // longer current (the agent should re-join).
  int32_t heartbeat(const RoundAssignment& assignment);

  // Retries an unreachable server for connect_timeout, as join() does.
  void leave(const std::string& run_id, const std::string& node_id);

  // This node stops before joining (its preflight failed): the run's other nodes are told at
  // once (rendezvous_state.h, withdraw). `options` gives the run, the node and the job's shape
  // (run_id, node_id, min/max nodes, join timeout). One call bounded by call_timeout, retried
  // while unavailable for connect_timeout; throws as leave() does (StoreError "UNIMPLEMENTED"
  // from a server that predates it).
  struct Withdrawal {
    int32_t stopped_nodes = 0;
    int32_t can_come = 0;
    bool failed = false;  // the job cannot form: its waiting nodes were failed
  };
  Withdrawal withdraw(const JoinOptions& options, const std::string& reason);

  // `on_change` runs at most once, on a background thread, when the round ends or the
  // server can no longer be reached. Returns once the server has registered the watch (at
  // most call_timeout), so a change after that is reported with the server's reason.
  std::unique_ptr<RoundWatch> watch(const RoundAssignment& assignment,
                                    std::function<void(const RoundChange&)> on_change);

  const std::string& endpoint() const;

 private:
  friend class RoundWatchImpl;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddpl::rdzv
