#pragma once
// Internal to the gRPC layer: what the Store and Rendezvous services share. Included only by
// the service .cc files (service_core.cc, store_service.cc, store_session.cc,
// rendezvous_service.cc).
//
// Threads: every method here may run on any gRPC callback thread (a call arriving, a stream
// reading or writing, a call being cancelled) or on the TimerQueue's one thread (a parked
// get's deadline, the state machine's tick, the periodic stats line). Core's fields are
// either immutable after construction (cfg), internally synchronised (kv, timers, atomics),
// or guarded by Core::mu.
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/server/service.h"
#include "rendezvous/state/rendezvous_state.h"
#include "rendezvous/state/timer_queue.h"
#include "rendezvous/store/kv_space.h"

namespace ddpl::rdzv::grpc_detail {

namespace pb = ::ddpl::rendezvous::v1;

// Thrown inside handlers; becomes the call's (or the Session operation's) status.
struct RpcError {
  grpc::StatusCode code;
  std::string message;
};

grpc::StatusCode toGrpc(RdzvCode c);
grpc::Status toGrpc(const RdzvStatus& s);

// A parked Join call, completed by Core::apply once the state machine decides its outcome.
class JoinWaiter {
 public:
  virtual void complete(const JoinOutcome& outcome) = 0;

 protected:
  ~JoinWaiter() = default;
};

// A Watch stream, told by Core::apply when its round ends. Core::apply takes a reference
// while it tells it outside Core::mu.
class RoundWatcher {
 public:
  virtual void ref() = 0;
  virtual void unref() = 0;
  virtual void sendInvalidated(const Invalidation& inv) = 0;
  virtual const std::string& node() const = 0;

 protected:
  ~RoundWatcher() = default;
};

class Core {
 public:
  explicit Core(const ServiceConfig& c);
  ~Core();

  // Checks the call's token. A refusal is counted and logged at most once per
  // kRefusalLogInterval, with the number refused since the last line.
  grpc::Status authorize(grpc::CallbackServerContext* ctx);
  // The same check for a token that came another way (the socket transport's first
  // request); null: none was sent.
  grpc::Status authorizeToken(const std::string& peer, const std::string* token);

  template <typename Body>
  grpc::Status guard(grpc::CallbackServerContext* ctx, Body&& body) {
    grpc::Status s = authorize(ctx);
    if (!s.ok()) return s;
    return run(std::forward<Body>(body));
  }

  // Runs one operation: what it throws becomes its status. Shared by the unary calls and the
  // Session stream, whose token was checked once when it opened.
  template <typename Body>
  grpc::Status run(Body&& body) {
    try {
      body();
      return grpc::Status::OK;
    } catch (const RpcError& e) {
      return grpc::Status(e.code, e.message);
    } catch (const InvalidArgument& e) {
      return grpc::Status(grpc::INVALID_ARGUMENT, e.what());
    } catch (const StoreError& e) {
      return grpc::Status(grpc::FAILED_PRECONDITION, e.what());
    } catch (const std::exception& e) {
      return internalError(e);
    }
  }

  template <typename Body>
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, Body&& body) {
    auto* r = ctx->DefaultReactor();
    r->Finish(guard(ctx, std::forward<Body>(body)));
    return r;
  }

  void checkValue(const std::string& key, size_t size) const;
  // The timeout a get/wait asked for, range-checked and capped at cfg.max_wait.
  Duration waitTimeout(int64_t timeout_ms) const;
  // Counts one more parked get/wait/multiGet, or throws RESOURCE_EXHAUSTED naming the limit.
  void admitPark();

  // Acts on what the state machine decided: completes joins, tells watchers, deletes the
  // keys of forgotten runs, logs, and re-arms the tick timer. Called without mu held.
  void apply(Effects& fx);
  void rescheduleLocked();  // caller holds mu
  void onTick();            // on the timer thread
  void logStats();          // the timer thread every cfg.stats_interval, or any thread

  ServerStats stats();

  // What the long-lived calls of one gRPC connection hold together (gRPC's peer string names
  // the connection: its address and port): its Session streams, Watch streams and parked
  // unary store calls, each of which pins gRPC's call state for as long as it lasts. A call
  // takes it when it starts and drops it when it ends; the entry goes with the last one.
  struct ConnectionUse {
    std::atomic<int64_t> queued_bytes{0};  // answers queued by all its streams
    int sessions = 0;                      // guarded by Core::connections_mu_
  };
  // Null when the connection already holds cfg.max_sessions_per_connection such calls: the
  // caller refuses the call (RESOURCE_EXHAUSTED) and ends the connection
  // (cfg.on_too_many_streams), since only a client that ignores the stream limit its SETTINGS
  // announced gets here.
  std::shared_ptr<ConnectionUse> openSession(const std::string& peer);
  // openSession for a call that is starting: null with `refused` set to RESOURCE_EXHAUSTED
  // (naming `what` and the limit), and the connection ended, when it is past the limit.
  std::shared_ptr<ConnectionUse> admitLongCall(const std::string& peer, const char* what,
                                               grpc::Status* refused);
  void closeSession(const std::string& peer, const std::shared_ptr<ConnectionUse>& use);

  // A stream or connection that ended gave back about `bytes` (its queued answers at their
  // peak, its share of gRPC's buffers). glibc keeps freed memory in its heaps; once enough was
  // given back, one malloc_trim on the timer thread returns it to the system (a burst of
  // streams ending is trimmed once, shortly after the last).
  void released(int64_t bytes);
  // What gRPC holds for a long-lived call besides its answers (the call, its buffers, requests
  // read and not yet handled), for released(): measured about 33 KB per stream of 3,000 on one
  // connection, each with 11 KB of requests unread.
  static constexpr int64_t kStreamOverheadBytes = 32 << 10;

  ServiceConfig cfg;
  KvSpace kv;
  TimerQueue timers;
  std::atomic<int64_t> parked_store{0};
  std::atomic<int64_t> unauthenticated{0};
  // Bytes of responses queued on Session streams (written or waiting to be), all streams.
  std::atomic<int64_t> queued_bytes{0};
  std::atomic<int64_t> refused_for_memory{0};  // Session answers replaced by RESOURCE_EXHAUSTED
  std::atomic<int64_t> paused_reads{0};        // times a Session stream stopped reading
  std::atomic<int64_t> sessions{0};
  std::atomic<bool> shutting_down{false};

  // The last round handed to cfg.on_round_formed; the mutex orders the calls.
  std::mutex round_formed_mu;
  int64_t round_formed = -1;

  std::mutex mu;  // guards everything below
  RendezvousState state;
  std::unordered_map<JoinTicket, JoinWaiter*> joins;
  std::map<std::pair<std::string, int64_t>, std::set<RoundWatcher*>> watchers;
  int64_t watcher_count = 0;
  int64_t runs_forgotten = 0;
  TimerQueue::TimerId tick_timer = 0;
  std::optional<TimePoint> tick_at;

 private:
  grpc::Status internalError(const std::exception& e);
  void armStats();
  void flushRefusals();  // on the timer thread: the refusals counted since the last line

  std::mutex refusal_mu_;  // guards the refusal log's state
  Clock::time_point refusal_logged_at_{};
  int64_t refusals_unlogged_ = 0;
  bool refusal_flush_armed_ = false;
  std::string last_refusal_;
  std::mutex stats_mu_;
  std::string last_stats_line_;  // guarded by stats_mu_
  std::mutex connections_mu_;
  std::unordered_map<std::string, std::shared_ptr<ConnectionUse>> connections_;
  std::atomic<int64_t> released_bytes_{0};  // given back since the last trim
  std::atomic<bool> trim_armed_{false};
};

// How long the refusal log stays quiet after a line.
inline constexpr Duration kRefusalLogInterval{std::chrono::seconds(10)};

// ---- store operations --------------------------------------------------------------------

// The operations, one overload per request type; shared by the unary handlers and the
// Session stream through visitStoreOp (store_ops.h). They throw RpcError or a ddpl error;
// Core::run turns that into the operation's status.
namespace ops {

void apply(Core& c, const pb::PingRequest& req, pb::PingResponse* resp);
void apply(Core& c, const pb::SetRequest& req, pb::SetResponse* resp);
void apply(Core& c, const pb::AddRequest& req, pb::AddResponse* resp);
void apply(Core& c, const pb::CompareSetRequest& req, pb::CompareSetResponse* resp);
void apply(Core& c, const pb::CheckRequest& req, pb::CheckResponse* resp);
void apply(Core& c, const pb::DeleteKeyRequest& req, pb::DeleteKeyResponse* resp);
void apply(Core& c, const pb::NumKeysRequest& req, pb::NumKeysResponse* resp);
void apply(Core& c, const pb::MultiSetRequest& req, pb::MultiSetResponse* resp);

// The operations that may park: what to wait for, and how the values fill the response.
struct Park {
  std::vector<std::string> keys;
  int64_t timeout_ms = 0;
  bool want_values = false;
  const char* op = "";
};

Park park(const pb::GetRequest& r);
Park park(const pb::WaitRequest& r);
Park park(const pb::MultiGetRequest& r);

void fill(pb::GetResponse* resp, std::vector<Bytes>& v);
void fill(pb::WaitResponse* resp, std::vector<Bytes>& v);
void fill(pb::MultiGetResponse* resp, std::vector<Bytes>& v);
void fill(pb::GetResponse* resp, const KvSpace::Values& v);
void fill(pb::WaitResponse* resp, const KvSpace::Values& v);
void fill(pb::MultiGetResponse* resp, const KvSpace::Values& v);

}  // namespace ops

// A get, wait or multiGet whose keys are not all there yet, for a unary call or a Session
// stream alike. Exactly one of three things finishes it, decided by KvSpace::cancelWait/the
// ready callback: the keys arrive (on the thread of the set that supplied the last one), its
// deadline passes (the TimerQueue thread), or its caller goes away (cancel(), on a gRPC
// thread). KvSpace's callback holds it until then; the timer holds only a weak reference, so
// that an answered operation does not wait in memory for its deadline.
class ParkedOp : public std::enable_shared_from_this<ParkedOp> {
 public:
  // Runs exactly once: OK with the values (in key order, when wanted), DEADLINE_EXCEEDED
  // naming the missing keys, or CANCELLED.
  using Done = std::function<void(const grpc::Status&, KvSpace::Values& values)>;

  // The caller has counted it with Core::admitPark.
  ParkedOp(Core* core, ops::Park park, Duration timeout, Done done)
      : core_(core), park_(std::move(park)), timeout_(timeout), done_(std::move(done)) {}

  void start();
  // The caller went away. Safe at any time, also after the operation finished.
  void cancel();

 private:
  static constexpr TimerQueue::TimerId kFinished = ~TimerQueue::TimerId{0};

  void finishing();
  void ready(KvSpace::Values values);
  void timedOut();

  Core* core_;
  ops::Park park_;
  Duration timeout_;
  Done done_;
  std::atomic<KvSpace::WaitId> wait_id_{0};
  std::atomic<TimerQueue::TimerId> timer_{0};
};

// ---- one request of a store session (the gRPC Session stream and the plain-socket
// transport, wire_server.cc, run requests through these alike) ----------------------------

struct SessionStep {
  enum What { kAnswer, kQuiet, kPark };
  What what = kAnswer;
  pb::StoreResponse resp;  // kAnswer: the answer (an error included), tagged with the id
  ops::Park park;          // kPark: admitted (counted by Core::admitPark), with its timeout
  Duration timeout{};
};

// Runs an immediate operation, or range-checks and admits a parked one for the caller to
// start as a ParkedOp. A quiet set that succeeded needs no answer (kQuiet).
SessionStep runSessionRequest(Core& c, const pb::StoreRequest& req);

// What one queued answer costs in memory besides its bytes on the wire: the queue's entry,
// the message object and its sub-message. Measured: 1,024 streams holding 1,023 numKeys
// answers each (6 bytes on the wire) took 139 MB more than the same streams holding one; the
// server used to count those answers as 6 bytes each (6,000 such streams: 818 MB used, 30 MB
// counted).
inline constexpr int64_t kAnswerOverheadBytes = 160;

// An answer on its way to a Session stream or a store socket. The values of a get or
// multiGet are not copied into `resp`: they are the store's own, shared (KvSpace::Value), and
// put into the message (gRPC) or the socket (wire_server.cc) only when the answer is written.
struct Answer {
  pb::StoreResponse resp;  // a get/multiGet's has its result case set, without the values
  KvSpace::Values values;  // the get's or multiGet's values, in key order
  int64_t wire_bytes = 0;  // the serialized StoreResponse with its values
  // What it counts against the bounds on queued answers while it waits: its bytes on the
  // wire (each value in full, though shared: a value the store has since replaced lives on in
  // the answer) plus kAnswerOverheadBytes.
  int64_t cost() const { return wire_bytes + kAnswerOverheadBytes; }
};

// An answer of `resp`, values (if any) already in it.
Answer answerOf(pb::StoreResponse resp);

// The answer of a parked operation of request `id` (op `c`), OK or not; `values` are moved
// into it.
Answer parkedAnswer(uint64_t id, pb::StoreRequest::OpCase c, const grpc::Status& s,
                    KvSpace::Values& values);
// The same, as a message with the values copied in (unary calls, tests).
pb::StoreResponse parkedAnswer(uint64_t id, pb::StoreRequest::OpCase c, const grpc::Status& s,
                               std::vector<Bytes>& values);

// Moves `a` into `*out`, its values copied into the message: what gRPC then writes (for
// WriteQueue<pb::StoreResponse, Answer>).
void intoMessage(Answer&& a, pb::StoreResponse* out);

// Replaces what `resp` holds by the error `s`, keeping its id.
void setOpError(pb::StoreResponse& resp, const grpc::Status& s);
void setOpError(Answer& a, const grpc::Status& s);

// Admits an answer against StreamLimits::max_queued_bytes, the bytes of answers queued by all
// streams and sockets together, for a stream or socket that holds `own_bytes` already. One
// that would take that count past the limit is replaced, here, by RESOURCE_EXHAUSTED naming
// the limit (the operation itself has run), unless it is small (kSmallAnswerBytes) and its
// stream holds nothing: a client that reads its answers is served while others that do not
// fill the server's budget. The error is admitted past the limit too, but the stream or
// socket then stops being read while the server is over the limit and it still holds an
// answer (overLimit below), so answers past the limit cannot pile up: at most one per stream
// or socket, and one per parked operation answered.
void admitAnswer(Core& c, Answer& a, int64_t own_bytes);
inline constexpr int64_t kSmallAnswerBytes = 4 << 10;

// Whether a stream or socket that holds `own_bytes` of answers (and `unanswered` operations)
// must stop being read: past its own limits, or, while it holds anything, when its
// connection's streams together (`connection_bytes`; the socket's own for a store socket) or
// all of them on the server are at theirs. A stream that holds nothing is always read: the
// one answer it may then add is its share past the bounds.
bool overLimit(const Core& c, int64_t unanswered, int64_t own_bytes, int64_t connection_bytes);

// A JoinRequest from the wire as the state machine's JoinSpec: timeouts range-checked
// (INVALID_ARGUMENT naming the value) and saturated at kMaxTimeout; the state machine checks
// the rest (ids, sizes, min:max, world size).
RdzvStatus joinSpecFromWire(const pb::JoinRequest& r, JoinSpec* spec);

std::unique_ptr<grpc::Service> makeStoreService(Core* core);
std::unique_ptr<grpc::Service> makeRendezvousService(Core* core);
grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* newStoreSession(
    Core* core, grpc::CallbackServerContext* ctx);

}  // namespace ddpl::rdzv::grpc_detail
