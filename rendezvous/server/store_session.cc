// The Store.Session stream: one client's store operations on one long-lived stream.
//
// The token is checked once, when the stream opens; each operation then runs through the
// same ops:: functions and ParkedOp as its unary call (dispatched through store_ops.h), and
// its answer (or its error status) is queued as one response tagged with the request's id.
// Parked operations answer out of order.
//
// Back-pressure (limits in StreamLimits, docs/rendezvous.md "Limits"): the stream reads its
// next request only while it has fewer than max_stream_pending operations unanswered (parked,
// or answered and not yet written) and fewer than max_stream_queued_bytes of answers queued,
// and, while it holds any answer, only while the Session streams of its connection together
// hold fewer than max_stream_queued_bytes and all streams and sockets of the server fewer
// than max_queued_bytes. Past any of these it stops reading; HTTP/2 flow control then stops
// the client once its window is full, and reading resumes when its answers are written. An
// answer counts what it costs in memory (Answer::cost: its wire bytes plus the queue entry),
// and a get's value is shared with the store, not copied, until the answer is written. An
// answer that would take the bytes queued by all streams past max_queued_bytes is replaced by
// RESOURCE_EXHAUSTED naming the limit. A connection holds at most max_sessions_per_connection
// streams (a client that ignores HTTP/2's SETTINGS is refused past it here). When the stream
// ends, everything it queued is freed, and the heap trimmed once enough was (Core::released).
//
// Threads: OnReadDone, OnWriteDone, OnCancel and OnDone run on gRPC callback threads (one
// read and one write callback may run at once); a parked operation answers on the thread
// that decides it (a set's, the timer's, or OnCancel's). mu_ guards the stream's state and
// is never held while calling into gRPC.
//
// Reference-counted: gRPC holds one reference until OnDone, each parked operation one until
// it has answered.
#include <fmt/format.h>

#include "common/log.h"
#include "rendezvous/protocol/write_queue.h"
#include "rendezvous/server/service_core.h"

namespace ddpl::rdzv::grpc_detail {

namespace {

class StoreSession : public grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse> {
 public:
  StoreSession(Core* core, grpc::CallbackServerContext* ctx) : core_(core) {
    ++core_->sessions;
    grpc::Status s = core_->authorize(ctx);
    if (s.ok()) {
      peer_ = ctx->peer();
      connection_ = core_->admitLongCall(peer_, "a store session", &s);
    }
    if (!s.ok()) {
      finished_ = true;
      Finish(s);
      return;
    }
    StartRead(&req_);
  }

  ~StoreSession() override {
    --core_->sessions;
    if (connection_) {
      core_->closeSession(peer_, connection_);
      core_->released(peak_bytes_ + Core::kStreamOverheadBytes);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side (or the stream broke: OnCancel follows). Finish once the
      // parked operations have answered and their answers are written.
      std::unique_lock<std::mutex> lock(mu_);
      reads_done_ = true;
      finishIfIdle(lock);
      return;
    }
    handle(req_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      if (overLimitLocked()) {
        // Resumed by respond() or OnWriteDone once the client has caught up.
        reading_paused_ = true;
        ++core_->paused_reads;
        return;
      }
    }
    StartRead(&req_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok || finished_) {
      adjustQueued([&] { writes_.abandon(); });
      return;  // the stream broke: OnCancel finishes it
    }
    Writes::Start next;
    adjustQueued([&] { next = writes_.next(); });
    bool resume = resumeLocked();
    if (!next.msg) finishIfIdle(lock);
    if (lock.owns_lock()) lock.unlock();
    if (next.msg) StartWrite(next.msg);
    if (resume) StartRead(&req_);
  }

  void OnCancel() override {
    std::vector<std::shared_ptr<ParkedOp>> parked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
      adjustQueued([&] { writes_.clear(); });
      for (auto& [id, op] : parked_) parked.push_back(op);
    }
    for (auto& op : parked) op->cancel();  // their answers go nowhere: finished_
    Finish(grpc::Status(grpc::CANCELLED, "store session cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      adjustQueued([&] { writes_.abandon(); });
    }
    unref();
  }

 private:
  void handle(const pb::StoreRequest& req) {
    SessionStep step = runSessionRequest(*core_, req);
    if (step.what == SessionStep::kQuiet) return;
    if (step.what == SessionStep::kAnswer) {
      respond(answerOf(std::move(step.resp)));
      return;
    }
    uint64_t slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot = next_slot_++;
    }
    ++refs_;
    auto op = std::make_shared<ParkedOp>(core_, std::move(step.park), step.timeout,
                                         [this, id = req.id(), c = req.op_case(), slot](
                                             const grpc::Status& st, KvSpace::Values& values) {
                                           Answer resp = parkedAnswer(id, c, st, values);
                                           {
                                             std::lock_guard<std::mutex> lock(mu_);
                                             parked_.erase(slot);
                                           }
                                           respond(std::move(resp));
                                           unref();
                                         });
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(mu_);
      parked_.emplace(slot, op);
      cancelled = finished_;
    }
    op->start();
    // OnCancel ran while this one was being parked and could not see it.
    if (cancelled) op->cancel();
  }

  void respond(Answer resp) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return;
    admitAnswer(*core_, resp, static_cast<int64_t>(writes_.bytes()));
    auto size = resp.cost();
    Writes::Start start;
    adjustQueued([&] { start = writes_.push(std::move(resp), static_cast<size_t>(size)); });
    bool resume = resumeLocked();
    lock.unlock();
    // Never under mu_: gRPC may run OnWriteDone on this thread before StartWrite returns.
    if (start.msg) StartWrite(start.msg);
    if (resume) StartRead(&req_);
  }

  // Caller holds mu_. Runs `change` on writes_ and carries the change in bytes over to the
  // connection's and the server-wide counts.
  template <typename Change>
  void adjustQueued(Change change) {
    auto before = static_cast<int64_t>(writes_.bytes());
    change();
    auto after = static_cast<int64_t>(writes_.bytes());
    core_->queued_bytes += after - before;
    if (connection_) connection_->queued_bytes += after - before;
    peak_bytes_ = std::max(peak_bytes_, after);
  }

  // Caller holds mu_.
  bool overLimitLocked() const {
    auto unanswered =
        static_cast<int64_t>(parked_.size() + writes_.queued()) + (writes_.writing() ? 1 : 0);
    return overLimit(*core_, unanswered, static_cast<int64_t>(writes_.bytes()),
                     connection_->queued_bytes.load());
  }

  // Caller holds mu_: true when reading was paused and may go on (the caller then calls
  // StartRead outside the lock).
  bool resumeLocked() {
    if (!reading_paused_ || finished_ || overLimitLocked()) return false;
    reading_paused_ = false;
    return true;
  }

  // Caller holds mu_ through `lock`; releases it when it finishes the stream.
  void finishIfIdle(std::unique_lock<std::mutex>& lock) {
    if (finished_ || !reads_done_ || writes_.writing() || !parked_.empty()) return;
    finished_ = true;
    lock.unlock();
    Finish(grpc::Status::OK);
  }

  void unref() {
    if (--refs_ == 0) delete this;
  }

  Core* core_;
  pb::StoreRequest req_;  // the read in flight; used only by the read loop
  std::mutex mu_;         // guards everything below; never held while calling into gRPC
  bool finished_ = false;
  bool reads_done_ = false;
  bool reading_paused_ = false;
  using Writes = WriteQueue<pb::StoreResponse, Answer>;
  Writes writes_;
  int64_t peak_bytes_ = 0;
  std::string peer_;
  std::shared_ptr<Core::ConnectionUse> connection_;  // null: refused, never read
  uint64_t next_slot_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ParkedOp>> parked_;
  std::atomic<int> refs_{1};
};

}  // namespace

grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* newStoreSession(
    Core* core, grpc::CallbackServerContext* ctx) {
  return new StoreSession(core, ctx);
}

}  // namespace ddpl::rdzv::grpc_detail
