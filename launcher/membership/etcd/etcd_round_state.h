#pragma once
// The etcd backend's records (what etcd_rendezvous.cc's key layout stores): the round's state
// and a joiner's place, and how they read and write as JSON. No I/O.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddpl::launcher::etcd_detail {

struct NodeEntry {
  std::string id;
  int nproc = 1;
  std::string addr;
};

struct RoundState {
  int64_t round = 0;
  bool complete = false;
  std::vector<NodeEntry> nodes;       // the members of a complete round, by id; else empty
  std::vector<std::string> expected;  // survivors of the previous round, expected back
  std::string reason;                 // why the previous round ended
  int min_nodes = 1, max_nodes = 1;
  // When the run's first node opened round 0 (unix ms, its clock), carried by every later
  // state: the job's keys gone and the run id used again, rounds count from 0 again, so
  // (epoch_ms, round) is what only grows (the checkpoint fence's order). 0: written by an agent
  // that predates it.
  int64_t epoch_ms = 0;
  // A forming round's nodes that stopped before joining (node id -> why), until stopped_until
  // (unix seconds, the writer's clock: a join timeout after the last stop). As the gRPC
  // service's rounds (rendezvous_state.h): the round waits for no more nodes than can come,
  // and fails when min nodes cannot. Agents that predate it ignore the fields.
  std::map<std::string, std::string> stopped;
  double stopped_until = 0;

  bool has(const std::string& id) const;
  std::string encode() const;
  // The stops still in force at unix time `now`.
  std::map<std::string, std::string> stops(double now) const;
  // The value comes from etcd, written by another agent (or anyone with access): parsed,
  // never trusted to be well-formed. Throws StoreError naming `key`.
  static RoundState decode(const std::string& key, const std::string& v);
};

// A joiner's place: its nproc and address, written by itself.
std::string encodeJoin(const NodeEntry& n);
NodeEntry decodeJoin(const std::string& key, const std::string& id, const std::string& v);

double unixNow();

}  // namespace ddpl::launcher::etcd_detail
