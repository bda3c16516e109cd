#pragma once
// Copies of committed checkpoints in another node's memory (docs/checkpoints.md, "Peer
// replicas"): each agent serves a small TCP endpoint that takes the steps its predecessor in
// the ring of nodes pushes, and hands them back to a node that lost its own (a replacement).
//
// The wire, one request per connection, every request naming the server's secret (published
// through the job's store, which only the job's members read):
//   PUSH:  "DDPLREP1 <secret> PUSH <record bytes>\n" <record> <each file's bytes, in order>
//          -> "OK\n" | "ERR <why>\n"
//   LIST:  "DDPLREP1 <secret> LIST <rank> <world size>\n" -> "OK <step> <step> ...\n"
//   GET:   "DDPLREP1 <secret> GET <rank> <step>\n" -> "OK <record bytes>\n" <record> <files>
// Records are the commit records (common/checkpoint_format.h), checked as such; a push larger
// than the per-rank budget, or one that would pass the server's total, is refused, naming the
// sizes. Every socket call has a timeout.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_format.h"

namespace ddpl::launcher {

struct ReplicaEndpoint {
  std::string host;
  int port = 0;
  std::string secret;
  std::string describe() const { return host + ":" + std::to_string(port); }
};
std::string encodeEndpoint(const ReplicaEndpoint& e);  // "host port secret"
std::optional<ReplicaEndpoint> parseEndpoint(const std::string& text);

class ReplicaServer {
 public:
  // Stores pushed steps under `dir`/rank-<R>/step-<N> (the commit format), keeping `keep` per
  // rank, `budget_per_rank` bytes per step and `total_budget` in all. Listens on every
  // interface (other nodes connect), port 0. Throws ddpl::Error when it cannot listen.
  ReplicaServer(std::string dir, uint64_t budget_per_rank, uint64_t total_budget, int64_t keep);
  ~ReplicaServer();
  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;
  int port() const;
  const std::string& secret() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The client side; each throws ddpl::Error (NetworkError for the connection) naming the peer.
// `on_socket`, when given, is called with the push's connected socket and with -1 before it is
// closed, so that another thread may shutdown() it to abandon the push (a new round, the end).
// The connection itself has 5 s at most (a peer on the same network answers sooner).
void pushStep(const ReplicaEndpoint& to, const std::string& step_dir,
              const ckpt::CommitRecord& record, double timeout_sec,
              const std::function<void(int)>& on_socket = {});
std::vector<int64_t> listSteps(const ReplicaEndpoint& from, int64_t rank, int64_t world_size,
                               double timeout_sec);
// Fetches rank's `step` into `rank_dir`/step-<N> as a committed step, with a ".ddpl-origin"
// file naming the peer (workers report it as a peer's replica). Returns the bytes copied.
uint64_t fetchStep(const ReplicaEndpoint& from, int64_t rank, int64_t step,
                   const std::string& rank_dir, double timeout_sec);

inline constexpr const char* kOriginFile = ".ddpl-origin";

}  // namespace ddpl::launcher
