#pragma once
// Internal to the store client (grpc_store.cc, wire_link.cc): one long-lived channel for a
// store's operations, whatever carries it. Two links exist: the gRPC Session stream
// (grpc_store.cc) and the plain socket (wire_link.cc, docs/rendezvous.md "The store's socket
// transport"). Both send StoreRequests tagged with ids and get StoreResponses back; this base
// keeps what they share: the operations waiting for an answer, and the quiet sets
// (GrpcStoreOptions::quiet_sets) sent without waiting and confirmed by any later answer.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/store/store.h"

namespace ddpl::rdzv::grpc_detail {

namespace pb = ::ddpl::rendezvous::v1;

// The first failure of a quiet set, kept until the store's next operation reports it. Shared
// by a store and its links.
struct DeferredError {
  std::mutex mu;
  std::atomic<bool> any{false};  // lets the operations skip the lock while nothing failed
  grpc::Status status;
  std::string what;  // "set 'k'"

  void record(grpc::Status s, std::string w);
  bool take(grpc::Status* s, std::string* w);
};

// One operation sent on a link, waiting for its response.
struct PendingOp {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;  // not OK: the link broke before the response came
  pb::StoreResponse resp;

  void complete(grpc::Status s, pb::StoreResponse* r);
  bool isDone();
};

class SessionLink {
 public:
  enum class Sent { kYes, kBroken, kNoRoom };

  explicit SessionLink(std::shared_ptr<DeferredError> deferred) : deferred_(std::move(deferred)) {}
  virtual ~SessionLink() = default;

  // Sends `req` (moved from only when sent). `op` waits for the answer; without one the request
  // goes quiet (a set: answered only if it fails), unless kMaxQuietSets are unconfirmed
  // already (kNoRoom: nothing sent). kBroken: the link broke before, nothing was sent.
  virtual Sent send(pb::StoreRequest& req, const std::shared_ptr<PendingOp>& op,
                    const std::string& quiet_what = {}) = 0;
  // Waits until `op` (sent on this link) is done; false when `deadline` passed first.
  virtual bool await(PendingOp& op, Clock::time_point deadline) = 0;
  // Ends the link: the server unparks its operations, pending ones here fail. Returns once
  // nothing of the link's runs any more, or after `limit`.
  virtual void close(Duration limit) = 0;

  // Sends a ping (id 0) and waits for its answer: the token was accepted and the link works
  // end to end; `max_value_bytes` gets the server's limit from it (left alone when the answer
  // has none). On failure the link is closed and the status says why.
  grpc::Status handshake(Duration timeout, int64_t* max_value_bytes, const std::string& token);

  bool hasUnconfirmed();
  // The operation stopped waiting (its deadline passed): a late response is dropped.
  void forget(uint64_t id);
  bool broken();

 protected:
  // Caller holds mu_ and the link is not broken: files `req` under its id (or among the quiet
  // sets) in sending order. The caller then sends it, in that same order.
  Sent registerLocked(pb::StoreRequest& req, const std::shared_ptr<PendingOp>& op,
                      const std::string& quiet_what);
  // A response arrived: completes its operation, or records a quiet set's failure.
  void onResponse(pb::StoreResponse& resp);
  // The link ended: fails every pending operation with `why` and reports the quiet sets it
  // may have lost. Later calls find nothing left to fail.
  void onBroken(const grpc::Status& why);
  // What a failed send of the handshake reports.
  virtual grpc::Status whyBroken() = 0;

  std::shared_ptr<DeferredError> deferred_;
  std::mutex mu_;  // guards everything below
  bool broken_ = false;

 private:
  // Caller holds mu_. The server answered the request sent `seq`-th: it handled every earlier
  // one of this link, the quiet sets among them included.
  void confirmLocked(uint64_t seq);

  struct Pending {
    std::shared_ptr<PendingOp> op;
    uint64_t seq;  // its place in the order of sending
  };
  struct Quiet {
    uint64_t seq, id;
    std::string what;
  };
  std::unordered_map<uint64_t, Pending> pending_;
  uint64_t sent_seq_ = 0;
  std::deque<Quiet> quiet_;  // sent quiet, not yet confirmed; oldest first; <= kMaxQuietSets
};

// The store's socket transport (wire_link.cc). Connects to `endpoint` (host:port) within
// `timeout` and greets the server; on success `*link` is ready and `*max_value_bytes` holds the
// server's limit. UNIMPLEMENTED: the server does not serve the socket transport (a server from
// before it, or TLS), or the endpoint is not host:port: use gRPC. UNAVAILABLE: nothing
// answered, try again. UNAUTHENTICATED: the token was refused.
grpc::Status openWireLink(const std::string& endpoint, const std::string& token, Duration timeout,
                          std::shared_ptr<DeferredError> deferred,
                          std::shared_ptr<SessionLink>* link, int64_t* max_value_bytes);

}  // namespace ddpl::rdzv::grpc_detail
