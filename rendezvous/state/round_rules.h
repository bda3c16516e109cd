#pragma once
// The rules of a round, written once for every place that forms or reads one: the server's state
// machine (rendezvous_state.h), the etcd backend (which forms rounds in etcd) and the clients
// that turn a round into ranks. Pure: no clock, no I/O; inline, so that the client library
// (exported on its own) needs no other library for it.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace ddpl::rdzv::round_rules {

// A forming round, as whoever counts it sees it now.
struct FormingRound {
  int joined = 0;     // nodes in it (at most max nodes)
  int min_nodes = 1;  // --nnodes MIN
  // Max nodes less those that stopped before joining: no round waits for a node that will not
  // come.
  int can_come = 1;
  // Every node expected back after the previous round ended is in (false when none is
  // expected): nobody else is known to be coming.
  bool all_expected_back = false;
};

enum class Closing {
  kNotYet,              // fewer than min nodes
  kLastCall,            // min nodes are in: closes when the last call ends
  kEveryoneWhoCanCome,  // closes now: max nodes, or all that can still come, are in
  kAllExpectedBack,     // closes now, without a last call: recovery is not delayed
};

inline Closing closing(const FormingRound& r) {
  if (r.joined >= std::max(r.min_nodes, r.can_come)) return Closing::kEveryoneWhoCanCome;
  if (r.joined < r.min_nodes) return Closing::kNotYet;
  return r.all_expected_back ? Closing::kAllExpectedBack : Closing::kLastCall;
}

// Closes now (no last call to wait out).
inline bool closesNow(Closing c) {
  return c == Closing::kEveryoneWhoCanCome || c == Closing::kAllExpectedBack;
}

// Ranks of a complete round whose nodes are in group-rank order: node i's global ranks start at
// the sum of the local world sizes before it; the world is the sum of them all.
struct RankLayout {
  std::vector<int64_t> offsets;  // per node: the global rank of its local rank 0
  int64_t world_size = 0;
};

inline RankLayout rankLayout(const std::vector<int>& local_world_sizes) {
  RankLayout layout;
  layout.offsets.reserve(local_world_sizes.size());
  for (int lws : local_world_sizes) {
    layout.offsets.push_back(layout.world_size);
    layout.world_size += lws;
  }
  return layout;
}

// A node's place in a complete round: all it needs of the round to give its workers their ranks.
// One type for every hop from the round to the worker environment: the client library's
// RoundAssignment and the launcher's WorldAssignment derive from it, and each backend (gRPC,
// etcd, static) fills it, so that a field is added, or its width chosen, once, and passing a
// place on is one assignment that cannot drop a field. Header-only like the rest of this file:
// the client library is exported without the state machine. Zeros by default (the client's
// reply before it is read); WorldAssignment keeps its own defaults of one node, one worker.
struct NodePlace {
  int64_t round = 0;
  int group_rank = 0;        // this node's rank among nodes
  int group_world_size = 0;  // number of nodes
  int rank_offset = 0;       // global rank of this node's local rank 0
  int world_size = 0;        // sum of every node's local world size
  // When the service that numbered the round started (Unix ms; 0 where rounds outlive it, as in
  // etcd): a restarted service counts rounds from 0 again, so (epoch_ms, round) is what only
  // grows over a job's life, and what the checkpoint fence compares.
  int64_t epoch_ms = 0;
};
// The wire's fields are int32: a place read from a reply, or published, keeps its width.
static_assert(sizeof(int) == sizeof(int32_t), "NodePlace's ints carry the wire's int32 fields");

// A worker's global rank.
inline int64_t globalRank(int64_t rank_offset, int local_rank) { return rank_offset + local_rank; }

}  // namespace ddpl::rdzv::round_rules
