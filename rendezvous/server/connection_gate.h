#pragma once
// The server's own accept loop, in front of gRPC. gRPC 1.51 can neither cap the connections
// it accepts nor close one from a handler; this gate can, because it accepts each TCP
// connection itself and hands it to gRPC (ExternalConnectionAcceptor: the same handshakes,
// TLS included, as gRPC's own listener). It keeps a duplicate of each socket, which lets it
// shut one down (shutdown(2) is seen by gRPC's side as the peer going away) and, for gRPC's,
// tells it when the connection ends (EPOLLRDHUP/HUP); the store socket tells it itself.
//
// Threads: one gate thread owns the listening sockets and the epoll loop; noteCall() comes
// from gRPC's callback threads; stats() from anywhere. One mutex guards the table.
#include <grpcpp/server_builder.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/event_loop.h"
#include "rendezvous/store/store.h"

namespace ddpl::rdzv::grpc_detail {

struct GateOptions {
  // Connections held at once. At the cap, the oldest connection that has not yet made an
  // authorized call is closed to make room; when every one has, the new one is closed.
  int max_connections = 4096;
  // A connection whose call was refused for its token (and that never made an authorized
  // one) is shut down after this delay, long enough for the refusal to reach the client.
  Duration refused_close_delay{std::chrono::milliseconds(200)};
  std::string log_name = "rdzv";
  // Set: each connection's first bytes are looked at (without reading them) before it is
  // handed to gRPC; one that starts with kWireMagic (wire_format.h) goes to this instead,
  // which returns false to have it closed. One that sends nothing for sniff_timeout goes to
  // gRPC, whose handshake timeout then applies. Unset (TLS servers): every connection is
  // gRPC's at once.
  std::function<bool(int fd, const std::string& peer)> adopt_wire;
  // Set: connections that start with torch's TCPStore hello (tcpstore_format.h) go to this,
  // which returns false to have them closed. Unset: they go to gRPC, which drops them.
  std::function<bool(int fd, const std::string& peer)> adopt_torch;
  // Set: a connection in torch's TCPStore protocol, which carries no token, goes to
  // adopt_torch only when its client's socket is on this host and owned by this uid
  // (common/peer_uid.h); any other, and one whose owner cannot be told, is closed with a
  // rate-limited line naming both uids. gRPC's and the store socket's connections are not
  // asked: every call of theirs must carry the token, whoever makes it.
  std::optional<uint32_t> torch_uid;
  Duration sniff_timeout{std::chrono::seconds(10)};
};

struct GateStats {
  int64_t open = 0;             // connections held now, gRPC's (the store socket's are its own)
  int64_t accepted = 0;         // since start
  int64_t rejected_at_cap = 0;  // closed on arrival: the cap was reached by authorized peers
  int64_t evicted = 0;          // never-authorized connections closed to make room
  int64_t closed_refused = 0;   // closed after a call refused for its token
  int64_t to_wire = 0;          // handed to the store's socket transport
  int64_t to_torch = 0;         // handed to it as torch TCPStore clients
  int64_t refused_uid = 0;      // torch TCPStore clients closed: not torch_uid's socket
};

class ConnectionGate {
 public:
  // Binds and listens on every address `host` resolves to (like gRPC's own listener; port 0
  // picks a free port, the same for all). Throws NetworkError naming host:port and why.
  ConnectionGate(const std::string& host, int port, GateOptions options);
  ~ConnectionGate();  // stop()
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  int port() const { return port_; }

  // Starts accepting: each connection is handed to gRPC through `acceptor` (the server must
  // be started). Until then the kernel's backlog holds connecting clients.
  void start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Before start(): where connections that start with the store socket's magic go
  // (GateOptions::adopt_wire).
  void setWire(std::function<bool(int fd, const std::string& peer)> adopt) {
    options_.adopt_wire = std::move(adopt);
  }
  void setTorch(std::function<bool(int fd, const std::string& peer)> adopt) {
    options_.adopt_torch = std::move(adopt);
  }
  // Stops accepting and closes the listening sockets; connections already handed over stay
  // gRPC's (its Shutdown closes them). Idempotent.
  void stop();

  // A call from `peer` (gRPC's "ipv4:a.b.c.d:port" / "ipv6:[..]:port") was authorized or
  // refused for its token.
  void noteCall(const std::string& peer, bool authorized);

  // Ends `peer`'s connection now, authorized or not: it broke a rule no conforming client
  // breaks (more streams than the server's SETTINGS allow, which gRPC 1.51 enforces only on a
  // client that acknowledged them).
  void closePeer(const std::string& peer);

  // The store socket is about to close `fd`, a connection it adopted: it no longer counts.
  // Called before close(2), so the number cannot belong to a newer connection yet. (The gate
  // keeps no duplicate of a store socket and does not watch it for its end: this call is
  // how it learns, which saves a dup, an epoll add and remove and a wake-up per connection.)
  void wireClosed(int fd);

  GateStats stats() const;

 private:
  struct Conn {
    int dup_fd = -1;
    int grpc_fd = -1;  // the descriptor gRPC owns; its inode tells whether it still does
    uint64_t inode = 0;
    std::string peer;
    uint64_t order = 0;  // arrival order: eviction takes the oldest
    bool authorized = false;
    bool wire = false;  // the store socket's (WireServer owns grpc_fd), not gRPC's
    bool closing = false;
    std::chrono::steady_clock::time_point close_at{};
  };

  void loop();
  void acceptAll(int listen_fd);
  void admit(int listen_fd, int fd);
  void handToGrpc(int listen_fd, int fd, const std::string& peer);
  // Keeps a duplicate of `fd`, handed to gRPC or the store socket, so that it counts against
  // the cap until it ends and can be shut down. False when it cannot be duplicated.
  bool track(int fd, const std::string& peer, bool wire);
  enum class Route { kWait, kWire, kTorch, kGrpc, kGone };
  // A look at the first bytes without reading them (kWait: none yet, or a prefix of the magic).
  static Route firstBytesSay(int fd);
  void sniff(int fd);  // its first bytes came: route it
  void route(int listen_fd, int fd, const std::string& peer, Route to);
  // GateOptions::torch_uid: whether `fd`'s client is that user's (else counted and logged).
  bool torchClientAdmitted(int fd, const std::string& peer);
  struct Sniffing;
  void expireSniffsLocked(std::chrono::steady_clock::time_point now,
                          std::vector<std::pair<int, Sniffing>>& late);
  void dropLocked(int dup_fd);   // forget a connection that ended
  void shutDownLocked(Conn& c);  // end it: gRPC sees the peer gone
  bool evictOneLocked();
  void sweepLocked();  // connections gRPC closed without a shutdown(2)
  void runDueClosesLocked(std::chrono::steady_clock::time_point now);
  int nextTimeoutMs(std::chrono::steady_clock::time_point now) const;
  void warnRateLimited(const std::string& what);

  GateOptions options_;
  int port_ = 0;
  std::vector<int> listen_fds_;
  EventLoop loop_;  // the listening sockets, sniffed connections and gRPC's duplicates
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;

  mutable std::mutex mu_;
  std::unordered_map<int, Conn> conns_;           // by dup_fd
  std::unordered_map<std::string, int> by_peer_;  // peer -> dup_fd
  std::unordered_map<int, int> by_grpc_fd_;       // grpc_fd -> dup_fd
  uint64_t next_order_ = 0;
  // Connections whose first bytes have not been seen yet (adopt_wire set), by fd.
  struct Sniffing {
    int listen_fd = -1;
    std::string peer;
    std::chrono::steady_clock::time_point until{};
  };
  std::unordered_map<int, Sniffing> sniffing_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int>> sniff_order_;
  bool close_pending_ = false;
  GateStats stats_;
  std::chrono::steady_clock::time_point accept_paused_until_{};
  std::chrono::steady_clock::time_point next_sweep_{};
  std::chrono::steady_clock::time_point warned_at_{};
  int64_t unwarned_ = 0;
  std::string last_unwarned_;
};

}  // namespace ddpl::rdzv::grpc_detail
