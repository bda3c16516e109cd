#pragma once
// The store's plain-socket transport, server side (wire_format.h has the protocol; the
// design and why it exists are in docs/rendezvous.md, "The store's socket transport").
// Internal to the server: included by server.cc and service_core.cc only.
//
// One thread runs an epoll loop over the connections the connection gate hands over (those
// that start with kWireMagic). It reads requests, runs them through the same
// runSessionRequest / ParkedOp as the gRPC Session stream, and writes the answers itself:
// a round trip costs the server one epoll_wait, one read and one write, where gRPC's callback
// stream costs several thread hand-offs (docs/bench-rendezvous.md §7).
//
// Threads: the loop thread reads, runs requests and writes; a parked operation answers on the
// thread that decides it (a set's, the timer's), which appends to the connection's output
// under the connection's mutex and writes it, or leaves it to the loop when the socket is
// full. adopt() comes from the gate's thread, stop() and connections() from anywhere.
//
// Bounds, the same as the Session stream's (StreamLimits): a connection stops being read
// while it has max_stream_pending operations parked or max_stream_queued_bytes of answers
// unwritten; answers count against max_queued_bytes server-wide; requests are at most
// max_value_bytes plus kMessageOverheadBytes; bytes of requests read and not yet handled, all
// connections together, at most max_queued_bytes (past it the connection that would add more
// is closed with RESOURCE_EXHAUSTED); connections that have not shown their token are counted
// apart, against the same limit, so that they cannot use up the others' budget. A connection
// must send its token within hello_timeout, in a first request of at most kMaxHelloFrameBytes.
// How many connections there may be is the connection gate's to decide, for gRPC's and these
// together (at the cap it shuts down the oldest one without its token; the loop then closes it).
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/event_loop.h"
#include "common/log.h"
#include "proto/rendezvous.pb.h"
#include "rendezvous/protocol/tcpstore_format.h"
#include "rendezvous/store/kv_space.h"
#include "rendezvous/store/store.h"


namespace ddpl::rdzv::grpc_detail {

class Core;
class ParkedOp;
struct Answer;

struct WireOptions {
  Duration hello_timeout{std::chrono::seconds(10)};
  // After an error that ends a connection, how long it is still read (and the input dropped)
  // so that the error frame reaches the client before the close.
  Duration linger{std::chrono::seconds(1)};
  // Called with a connection's descriptor just before it is closed (on the loop thread, or in
  // stop()), while its number cannot yet be another connection's: the connection gate's
  // count of it ends here (ConnectionGate::wireClosed).
  std::function<void(int fd)> before_close;
};

struct WireStats {
  int64_t open = 0;             // connections held now
  int64_t accepted = 0;         // adopted since start
  int64_t hello_timeouts = 0;   // closed for not sending the token in time
  int64_t protocol_errors = 0;  // closed for a malformed or oversized frame
  int64_t input_refused = 0;    // closed because the server's input buffers were full
  int64_t torch_open = 0;       // of `open`: torch TCPStore clients
  int64_t torch_refused = 0;    // torch clients refused: not a node of the job, no attempt open
  int64_t torch_errors = 0;     // torch connections ended for a malformed, unknown or oversized
                                // query, a bound, or a wait past the server's max wait
};

class WireServer {
 public:
  WireServer(Core* core, WireOptions options);
  ~WireServer();  // stop()
  WireServer(const WireServer&) = delete;
  WireServer& operator=(const WireServer&) = delete;

  // Takes over a connected non-blocking socket whose first bytes are kWireMagic (not yet
  // read). Returns false after stop(); the caller then closes it.
  bool adopt(int fd, const std::string& peer);

  // torch's TCPStore protocol (wire_server_tcpstore.cc): the job's store for workers that
  // connect as c10d::TCPStore clients (TORCHELASTIC_USE_AGENT_STORE=True). Takes over a
  // connection whose first bytes are tcpstore::kHello (not yet read) when an attempt is open
  // and admits its peer; otherwise logs why (rate-limited) and returns false: the caller
  // closes it.
  bool adoptTorch(int fd, const std::string& peer);
  // Opens attempt `attempt` of the job: the previous attempt's connections are closed and its
  // keys deleted, so nothing of a dead attempt is seen by the next; connections from now on
  // get a fresh namespace. `peers`: the IP addresses admitted (the job's nodes); `loopback`:
  // 127.0.0.0/8 and ::1 too.
  void beginTorchAttempt(int64_t attempt, std::vector<std::string> peers, bool loopback);

  // Closes every connection (their parked operations are cancelled) and ends the loop.
  // Returns once no parked operation can still answer into a connection. Idempotent.
  void stop();

  WireStats stats() const;

 private:
  struct TorchAttempt {
    bool open = false;
    int64_t attempt = 0;
    std::string ns;       // "tcpstore/<serial>/": its keys in the KvSpace
    std::vector<std::string> peers;
    bool loopback = false;
  };
  struct Conn;
  struct OutChunk;
  using ConnPtr = std::shared_ptr<Conn>;

  void loop();
  ConnPtr find(uint64_t id);
  void onReadable(const ConnPtr& c, uint32_t events);
  void processFrames(const ConnPtr& c);
  enum class Next { kGoOn, kPaused, kClosed };
  Next afterRequest(const ConnPtr& c);  // back-pressure after each request handled
  void consumed(const ConnPtr& c, size_t bytes);
  void endTurn(const ConnPtr& c, bool ended, bool more);
  bool hello(const ConnPtr& c, const ::ddpl::rendezvous::v1::StoreRequest& req);
  void handle(const ConnPtr& c, const ::ddpl::rendezvous::v1::StoreRequest& req);
  // Holds `op` on the connection under `slot` until it answers, and starts it.
  void startParked(const ConnPtr& c, uint64_t slot, std::shared_ptr<ParkedOp> op);
  void respond(const ConnPtr& c, Answer a);
  void fail(const ConnPtr& c, int code, const std::string& message);
  void close(const ConnPtr& c);

  // torch's protocol (wire_server_tcpstore.cc).
  void processTorch(const ConnPtr& c);
  bool handleTorch(const ConnPtr& c, tcpstore::Request& q);  // false: the connection ended
  void replyTorch(const ConnPtr& c, std::string bytes, KvSpace::Value value = nullptr);
  void replyTorchLocked(Conn& c, std::string bytes, KvSpace::Value value = nullptr);
  // `op`: WAIT, or BARRIER parked on its release key.
  bool parkTorch(const ConnPtr& c, std::vector<std::string> keys, const char* op);  // false: ended
  bool barrierTorch(const ConnPtr& c, const tcpstore::Request& q);                  // false: ended
  bool listKeysTorch(const ConnPtr& c);                                             // false: ended
  // Deletes the keys of attempt `serial` (its namespace and its barriers' release keys).
  int64_t deleteTorchKeys(uint64_t serial);
  void cancelTorchWaits(const ConnPtr& c);
  void endTorch(const ConnPtr& c, const std::string& why);  // logged, then closed
  void warnTorch(const std::string& what);                  // rate-limited
  void expire(std::chrono::steady_clock::time_point now);
  int nextTimeoutMs(std::chrono::steady_clock::time_point now);
  void runResumes();

  // Under the connection's mutex.
  std::string& tailLocked(Conn& c);  // where the next small answer is appended
  void appendMessageLocked(Conn& c, const ::ddpl::rendezvous::v1::StoreResponse& resp);
  void appendAnswerLocked(Conn& c, const Answer& a);
  void dropOutLocked(Conn& c);
  void flushLocked(Conn& c);
  void armLocked(Conn& c);
  bool overLimitLocked(const Conn& c) const;
  void maybeResumeLocked(Conn& c);
  void accountOutLocked(Conn& c, int64_t before);

  Core* core_;
  WireOptions options_;
  uint32_t max_frame_bytes_;
  EventLoop loop_;  // the connections, by id
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::vector<char> read_buf_;           // the loop thread's
  std::atomic<int64_t> input_bytes_{0};  // requests read and not yet handled, all connections
  std::atomic<int64_t> hello_bytes_{0};  // the same, of connections without their token yet
  std::atomic<int64_t>& inputCounter(const Conn& c);  // which of the two counts c's input

  // Guards the members below; may be taken under a connection's mutex,
  // never the other way round.
  mutable std::mutex mu_;
  bool stopped_ = false;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, ConnPtr> conns_;
  // Deadlines in the order they were set: each kind has one fixed delay, so the front is due
  // first.
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> hellos_, lingers_;
  std::vector<uint64_t> resumes_;  // connections to read again (back-pressure lifted)
  WireStats stats_;
  TorchAttempt torch_;
  // How many attempts were opened (the current one's number): connections remember theirs.
  // Changed under mu_; read without it by the queries.
  std::atomic<uint64_t> torch_serial_{0};
  tcpstore::Limits torch_limits_;  // from the Core's limits, set once
  log::Limiter torch_warnings_{std::chrono::seconds(10)};
};

}  // namespace ddpl::rdzv::grpc_detail
