#pragma once
// The rendezvous server, embeddable: `rdzv-server` runs one, and `launch --standalone`
// starts one on a free loopback port and hands its endpoint and token to the workers
// (DDPL_STORE_ADDR / DDPL_STORE_TOKEN / DDPL_STORE_PREFIX). No gRPC in this header.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/client/grpc_store.h"
#include "rendezvous/state/rendezvous_state.h"

namespace ddpl::rdzv {

// Back-pressure and memory bounds of the Store service (defaults documented in
// docs/rendezvous.md, "Limits").
struct StreamLimits {
  // Operations of one Session stream not answered yet (parked, or answered but not written
  // to the client): at this many the server stops reading that stream (HTTP/2 flow control
  // then stops the client) until some are answered and written.
  int64_t max_stream_pending = 1024;
  // Bytes of answers one Session stream has queued for a client that does not read them: at
  // this many the server stops reading that stream.
  int64_t max_stream_queued_bytes = int64_t{64} << 20;
  // Bytes of answers all Session streams together may queue; an answer that would pass it is
  // replaced by RESOURCE_EXHAUSTED naming the limit (the operation itself has run).
  int64_t max_queued_bytes = int64_t{256} << 20;
  // Gets, waits and multiGets parked at once on the whole server (unary and Session); one
  // more is answered RESOURCE_EXHAUSTED.
  int64_t max_parked = 100000;
};

// Connections. The server accepts them itself (gRPC 1.51 cannot cap them or close one from a
// handler) and hands each to gRPC: it holds at most max_connections, and a peer refused for
// its token is closed at once.
struct ConnectionLimits {
  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; Session streams are held to it by the server too,
  // for a client that ignores the SETTINGS. Each stream costs gRPC about 33 KB (its call, its
  // buffers, requests not read yet) besides the answers it queues: 8,192 let one connection
  // pin 270 MB of that alone. A process with more agents than this on one server raises it.
  int max_streams_per_connection = 1024;
  // A connection without a call for this long is closed (GOAWAY); clients reconnect on their
  // next call. Members and workers always hold a stream open, so only idle peers go.
  Duration max_connection_idle{std::chrono::seconds(30)};
  int max_connections = 4096;
  // Set: as many as the open-file limit fits, whatever max_connections says, without the
  // warning an operator's setting gets when it does not fit. For a server that holds a
  // connection per rank of a job of any size: the agent store, whose torch clients are every
  // worker of the job (raise the open-file limit for jobs of thousands of ranks).
  bool max_connections_from_file_limit = false;
  // Memory gRPC may use for connections and their buffers; past it, gRPC refuses new
  // connections and shrinks buffers. 0: gRPC's default (unbounded).
  int64_t max_grpc_memory_bytes = int64_t{1} << 30;
  int max_grpc_threads = 0;  // 0: gRPC's default
};

inline constexpr Duration kDefaultStatsInterval{std::chrono::minutes(5)};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                             // 0: pick a free port; read it back with port()
  std::string token;                        // empty: anyone may call (logged as a warning at start)
  std::string tls_cert_file, tls_key_file;  // both set: TLS
  std::string tls_client_ca_file;           // set: clients must present a certificate from it
  int64_t max_value_bytes = kDefaultMaxValueBytes;
  Duration heartbeat_window = kDefaultHeartbeatWindow;
  // Upper bound on the timeout a client may ask a get/wait to be parked for.
  Duration max_wait = std::chrono::hours(2);
  // A run with no nodes left is forgotten, with its keys, after this long.
  Duration run_retention = kDefaultRunRetention;
  StreamLimits limits;
  ConnectionLimits connections;
  // How often the server logs a line with its runs, keys and streams (only when something
  // changed since the last line). 0: never.
  Duration stats_interval = kDefaultStatsInterval;
  std::string log_name = "rdzv";  // prefix of this server's log lines
  // Serve the store's socket transport on the same port (docs/rendezvous.md, "The store's
  // socket transport"): clients that start with its magic bytes get the store without gRPC.
  // Always off with TLS: that transport is plaintext.
  bool store_socket = true;
  // Serve torch's TCPStore protocol on the same port too (connections that start with its
  // VALIDATE): the job's store for workers that connect as c10d::TCPStore clients
  // (TORCHELASTIC_USE_AGENT_STORE=True). No client is admitted until
  // beginTcpStoreAttempt() opens an attempt. Off with TLS: that protocol has no encryption
  // and no token, which is why it admits only the job's own addresses.
  bool tcpstore = false;
  // With tcpstore: an attempt opened before the first connection is accepted (< 0: none
  // until beginTcpStoreAttempt()), for these peers.
  int64_t tcpstore_attempt = -1;
  std::vector<std::string> tcpstore_peer_ips;
  bool tcpstore_loopback = true;
  // With tcpstore: set, a torch client is served only when its socket is on this host and
  // owned by this uid (the kernel's socket diagnostics, common/peer_uid.h): an address says
  // nothing about which local user connected, and the protocol has no token. launch sets its
  // own euid for the store it hosts for one node's job. Unset: the addresses above decide.
  // gRPC and the store socket are not asked: every call of theirs needs the token.
  std::optional<uint32_t> tcpstore_uid;
  // With tcpstore: each round of this run that completes opens attempt <round>, admitting its
  // members' addresses (as they joined with them) and loopback when the server listens on
  // loopback; the members learn so in their join's answer (RoundAssignment::agent_store).
  std::string tcpstore_run_id;
};

struct ServerStats {
  int64_t parked_store_calls = 0;  // gets and waits waiting for keys
  int64_t parked_joins = 0;
  int64_t watchers = 0;
  int64_t unauthenticated_calls = 0;
  int64_t runs = 0;            // runs held (forming, running, or empty within retention)
  int64_t runs_forgotten = 0;  // removed after their retention
  int64_t keys = 0;            // keys in the store
  int64_t sessions = 0;        // open Session streams
  int64_t queued_bytes = 0;    // answers queued on Session streams
  int64_t refused_for_memory = 0;
  int64_t paused_reads = 0;
  uint64_t runs_visited = 0;
  int64_t connections = 0;           // held now
  int64_t connections_accepted = 0;  // since start
  int64_t connections_rejected = 0;  // closed on arrival: the cap, all held by authorized peers
  int64_t connections_evicted = 0;   // never-authorized ones closed to make room at the cap
  int64_t refused_peers_closed = 0;  // closed after a call refused for its token
  int64_t store_sockets = 0;  // of `connections`: on the store's socket transport
  int64_t tcpstore_clients = 0;   // of those: torch TCPStore clients
  int64_t tcpstore_refused = 0;   // torch clients refused (not the job's node or user, no
                                  // attempt open)
  int64_t tcpstore_errors = 0;    // torch connections ended by the server (bad query, bound)  // runs examined
                              // by the state machine's timers (work, see tests)
};

// Threading contract:
// - Serving needs no thread of the caller's: the constructor returns once the server listens, and
//   the calls are served on threads the server owns (gRPC's callback threads; one timer thread
//   for deadlines, evictions and the stats line; one connection-gate thread that accepts). No
//   callback into the embedding program ever runs on them: state is reached only through
//   the network API or the methods below.
// - port(), endpoint() and stats() are safe from any thread at any time while the object lives.
// - shutdown() is idempotent and safe from any thread except one of the server's own (a gRPC
//   callback would wait for itself); a second caller returns only once the first has finished,
//   so whoever returns from shutdown() may destroy the server. wait() blocks any number of
//   threads until then. Do not call shutdown() from a signal handler: block the signals and
//   sigwait on a thread of your own (rdzv-server's main.cc does so).
// - The destructor calls shutdown(); no other thread may still be using the object when it runs.
class RendezvousServer {
 public:
  // Validates the options and starts serving. Throws ddpl::InvalidArgument for bad options
  // and ddpl::NetworkError naming host:port when it cannot listen (port in use, bad address).
  explicit RendezvousServer(const ServerOptions& options);
  ~RendezvousServer();  // shutdown()
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const;              // the bound port, also when started with port 0
  std::string endpoint() const;  // host:port for clients ([v6]:port for IPv6 hosts)

  // Ends parked calls (CANCELLED) and stops serving. Idempotent; safe from any thread
  // other than a gRPC callback.
  void shutdown();
  // Blocks until shutdown() has been called (by another thread or a signal handler's helper).
  void wait();

  ServerStats stats() const;

  // What the agents of each run published with publishNodeValue(key) in its current round
  // (the dashboard's rows): one entry per run (at most `max_runs`), a value per member node
  // (none where it has published nothing). Reads only; bounded by the runs and their members.
  struct RunValues {
    std::string run_id;
    int64_t round = 0;
    bool complete = false;  // the round formed (else: still joining)
    std::vector<std::optional<std::string>> values;  // by node rank
  };
  std::vector<RunValues> nodeValues(const std::string& key, size_t max_runs) const;

  // ServerOptions::tcpstore: opens attempt `attempt` of the job for torch's TCPStore clients.
  // The previous attempt's connections are closed and its keys deleted; from now on clients
  // from `peer_ips` (and loopback when `loopback`) are admitted and see a fresh namespace.
  // Throws ddpl::InvalidArgument when the server was started without tcpstore.
  void beginTcpStoreAttempt(int64_t attempt, const std::vector<std::string>& peer_ips,
                            bool loopback);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::rdzv
