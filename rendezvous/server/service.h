#pragma once
// Internal to the gRPC layer: the thin adapter from the Store and Rendezvous services to
// KvSpace and RendezvousState. Included only by server.cc and the service .cc files:
//   service_core.{h,cc}     what both services share (Core), the store operations, ParkedOp
//   store_service.cc        the Store service's unary calls
//   store_session.cc        the Store.Session stream
//   rendezvous_service.cc   Join, Heartbeat, Leave, Watch
//   store_ops.h             the one list of store operations (server and client)
//   write_queue.h           one write in flight plus a queue, for every streaming reactor
#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>

#include "rendezvous/server/server.h"

namespace ddpl::rdzv::grpc_detail {

struct ServiceConfig {
  std::string token;
  int64_t max_value_bytes = kDefaultMaxValueBytes;
  Duration max_wait = std::chrono::hours(2);
  Duration heartbeat_window = kDefaultHeartbeatWindow;
  // When this server started, on the wall clock (Unix ms) and on the state's clock: a run's epoch
  // (JoinResponse.epoch_ms) is the wall time the state first saw it. Rounds count from 0 again
  // in a restarted server, or for a run it had forgotten, so (epoch, round) is what only grows
  // over a job's life.
  int64_t epoch_ms = 0;
  Clock::time_point started{};
  Duration run_retention = kDefaultRunRetention;
  StreamLimits limits;
  // Session streams one gRPC connection may hold open (ConnectionLimits::
  // max_streams_per_connection): HTTP/2's own limit binds only a client that acknowledges the
  // server's SETTINGS, this one binds every client.
  int max_sessions_per_connection = 1024;
  Duration stats_interval = kDefaultStatsInterval;
  std::string log_name = "rdzv";
  // Told of every call's token check, with gRPC's name for the peer (the connection gate
  // closes refused peers and spares authorized ones). Empty: no one is told.
  std::function<void(const std::string& peer, bool authorized)> on_token_checked;
  // Told of a connection that opened more Session streams than max_sessions_per_connection
  // (the connection gate ends it). Empty: the stream is refused, the connection stays.
  std::function<void(const std::string& peer)> on_too_many_streams;
  // Non-empty: this run's rounds are served torch's TCPStore protocol (the agent store). Each
  // round of it that completes is handed to on_round_formed (in round order, before any member
  // learns of the round), and its members are told so (JoinResponse.agent_store).
  std::string tcpstore_run_id;
  std::function<void(const RoundMembership& round)> on_round_formed;
};

class Core;
class WireServer;
struct WireOptions;

// Keys the server deletes with a run it forgets: the store prefix it hands the run's workers
// ("<run>/<round>/") and the agents' job-wide namespace ("ddpl-agents/<run>/").
std::vector<std::string> runKeyPrefixes(const std::string& run_id);

class Services {
 public:
  explicit Services(const ServiceConfig& config);
  ~Services();
  grpc::Service* store();
  grpc::Service* rendezvous();
  // Call before grpc::Server::Shutdown: broken watch streams then no longer evict nodes.
  void beginShutdown();
  ServerStats stats() const;
  std::vector<RendezvousServer::RunValues> nodeValues(const std::string& key,
                                                      size_t max_runs) const;
  void logStats();  // the periodic stats line, now
  // Starts the store's socket transport (wire_server.h) over the same Core. Once.
  WireServer* startWire(const WireOptions& options);

 private:
  std::unique_ptr<Core> core_;
  std::unique_ptr<grpc::Service> store_;
  std::unique_ptr<grpc::Service> rendezvous_;
  std::unique_ptr<WireServer> wire_;  // last: stopped before the Core it serves goes
};

}  // namespace ddpl::rdzv::grpc_detail
