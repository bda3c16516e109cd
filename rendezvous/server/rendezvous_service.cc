// The Rendezvous service: Join (parked until the node's round completes), Heartbeat, Leave
// and the Watch stream, over the RendezvousState that Core holds.
//
// Threads: handlers run on the gRPC callback thread that received the call. A parked join is
// completed by Core::apply on whichever thread's call or timer tick decided its round (a
// gRPC thread or the TimerQueue thread); a watch stream is told its round ended the same way,
// and its OnWriteDone/OnCancel/OnDone run on gRPC threads. Core::mu guards the state machine
// and the join and watcher tables; each WatchCall's own mu_ guards its writes.
#include "common/log.h"
#include "rendezvous/protocol/write_queue.h"
#include "rendezvous/server/service_core.h"

namespace ddpl::rdzv::grpc_detail {

namespace {

// Timeouts from the wire as durations, saturated at kMaxTimeout ("wait very long").
Duration fromWire(int64_t ms) {
  return ms > kMaxTimeout.count() ? kMaxTimeout : Duration(std::max<int64_t>(ms, 0));
}

}  // namespace

RdzvStatus joinSpecFromWire(const pb::JoinRequest& r, JoinSpec* spec) {
  auto bad = [&](const char* what, int64_t v) {
    return RdzvStatus{RdzvCode::kInvalidArgument,
                      fmt::format("join run '{}' as node '{}': {} {} is out of range", r.run_id(),
                                  r.node_id(), what, v)};
  };
  if (r.join_timeout_ms() <= 0) return bad("join timeout (ms)", r.join_timeout_ms());
  if (r.last_call_timeout_ms() < 0) return bad("last-call timeout (ms)", r.last_call_timeout_ms());
  spec->run_id = r.run_id();
  spec->node = {r.node_id(), r.local_world_size(), r.version(), r.address()};
  spec->config = {r.min_nodes(), r.max_nodes(), fromWire(r.join_timeout_ms()),
                  fromWire(r.last_call_timeout_ms())};
  return {};
}

namespace {

class JoinCall : public grpc::ServerUnaryReactor, public JoinWaiter {
 public:
  JoinCall(Core* core, grpc::CallbackServerContext* ctx, const pb::JoinRequest* req,
           pb::JoinResponse* resp)
      : core_(core), ctx_(ctx), req_(req), resp_(resp) {}

  void start() {
    JoinSpec spec;
    grpc::Status s = core_->authorize(ctx_);
    if (s.ok()) s = toGrpc(joinSpecFromWire(*req_, &spec));
    if (!s.ok()) {
      Finish(s);
      unref();
      return;
    }
    include_members_ = req_->include_members();
    lists_ = include_members_ || !req_->own_place_only();
    Effects fx;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      ticket_ = core_->state.join(spec, Clock::now(), fx);
      core_->joins[ticket_] = this;
    }
    core_->apply(fx);
    if (ctx_->IsCancelled()) cancel();
    unref();
  }

  // Called by Core::apply once this call has been taken out of Core::joins.
  void complete(const JoinOutcome& o) override {
    if (!o.status.ok()) {
      Finish(toGrpc(o.status));
      return;
    }
    const RoundMembership& m = *o.round;
    resp_->set_round(m.round);
    resp_->set_group_rank(o.group_rank);
    resp_->set_group_world_size(static_cast<int32_t>(m.nodes.size()));
    resp_->set_world_size(m.world_size);
    const auto me = static_cast<size_t>(o.group_rank);
    resp_->set_rank_offset(m.rank_offsets.at(me));
    resp_->set_local_world_size(m.nodes.at(me).local_world_size);
    if (lists_) {
      resp_->mutable_local_world_sizes()->Reserve(static_cast<int>(m.nodes.size()));
      for (const auto& n : m.nodes) resp_->add_local_world_sizes(n.local_world_size);
    }
    resp_->set_master_address(m.nodes.front().address);
    resp_->set_agent_store(!core_->cfg.tcpstore_run_id.empty() &&
                           core_->cfg.tcpstore_run_id == m.run_id);
    resp_->set_store_prefix(fmt::format("{}/{}/", m.run_id, m.round));
    resp_->set_heartbeat_interval_ms(
        std::max<int64_t>(core_->cfg.heartbeat_window.count() / 3, 100));
    resp_->set_heartbeat_window_ms(core_->cfg.heartbeat_window.count());
    resp_->set_epoch_ms(core_->cfg.epoch_ms + std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  m.run_created - core_->cfg.started)
                                                  .count());
    if (include_members_) {
      for (const auto& n : m.nodes) {
        auto* mem = resp_->add_members();
        mem->set_node_id(n.node_id);
        mem->set_address(n.address);
      }
    }
    Finish(grpc::Status::OK);
  }

  void OnCancel() override { cancel(); }
  void OnDone() override { unref(); }

 private:
  void cancel() {
    Effects fx;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      auto it = core_->joins.find(ticket_);
      if (ticket_ == 0 || it == core_->joins.end() || it->second != this) return;
      core_->joins.erase(it);
      core_->state.cancelJoin(ticket_, Clock::now(), fx);
    }
    core_->apply(fx);
    Finish(grpc::Status(grpc::CANCELLED, "join cancelled"));
  }

  void unref() {
    if (--refs_ == 0) delete this;
  }

  Core* core_;
  grpc::CallbackServerContext* ctx_;
  const pb::JoinRequest* req_;
  pb::JoinResponse* resp_;
  bool include_members_ = false;
  bool lists_ = true;      // every node's local world size, for clients that want (or predate) it
  JoinTicket ticket_ = 0;  // guarded by core_->mu
  std::atomic<int> refs_{2};
};

// The watch stream of one member for one round. Sends `watching` once registered and
// `invalidated` (then finishes) when the round ends; if the stream breaks first, the node is
// evicted. At most two events ever queue. Reference-counted: gRPC holds one reference until
// OnDone, and Core::apply holds one while it notifies outside its lock.
class WatchCall : public grpc::ServerWriteReactor<pb::WatchEvent>, public RoundWatcher {
 public:
  WatchCall(Core* core, grpc::CallbackServerContext* ctx, const pb::WatchRequest* req)
      : core_(core), ctx_(ctx), run_(req->run_id()), node_(req->node_id()), round_(req->round()) {}

  void start() {
    grpc::Status s = core_->authorize(ctx_);
    if (s.ok()) {
      // A watch lasts the round: it counts against its connection's limit of long-lived calls,
      // as a Session stream does (issue 33).
      peer_ = ctx_->peer();
      connection_ = core_->admitLongCall(peer_, "a watch", &s);
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(core_->mu);
      s = toGrpc(core_->state.checkMember(run_, node_, round_));
      if (s.ok()) {
        core_->watchers[{run_, round_}].insert(this);
        ++core_->watcher_count;
      }
    }
    if (!s.ok()) {
      finishOnce(s);
      return;
    }
    pb::WatchEvent ev;
    ev.mutable_watching();
    send(std::move(ev), false);
  }

  const std::string& node() const override { return node_; }
  void ref() override { ++refs_; }
  void unref() override {
    if (--refs_ != 0) return;
    if (connection_) {
      core_->closeSession(peer_, connection_);
      core_->released(Core::kStreamOverheadBytes);
    }
    delete this;
  }

  void sendInvalidated(const Invalidation& inv) override {
    pb::WatchEvent ev;
    auto* i = ev.mutable_invalidated();
    i->set_round(inv.round);
    i->set_reason(inv.reason);
    i->set_nodes_waiting(inv.nodes_waiting);
    send(std::move(ev), true);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok || finished_) {
      writes_.abandon();
      return;  // the stream broke (OnCancel finishes it) or the last event went out
    }
    auto next = writes_.next();
    if (next.last) finished_ = true;
    lock.unlock();
    write(next);
  }

  void OnCancel() override {
    bool registered = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      // A node that lost its connection for a while watches its round again on a new one, and
      // the old stream may break only after that (the kernel learns of the old socket when the
      // link heals): it is not the node's loss then.
      registered = unregisterLocked() && !watchedElsewhereLocked();
    }
    if (registered && !core_->shutting_down) {
      Effects fx;
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        core_->state.nodeLost(run_, node_, round_, "its watch stream broke", Clock::now(), fx);
      }
      core_->apply(fx);
    }
    finishOnce(grpc::Status(grpc::CANCELLED, "watch cancelled"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      unregisterLocked();
    }
    unref();
  }

  // Caller holds core_->mu. Whether another stream of this node watches the same round.
  bool watchedElsewhereLocked() const {
    auto it = core_->watchers.find({run_, round_});
    if (it == core_->watchers.end()) return false;
    for (const RoundWatcher* w : it->second)
      if (w != this && w->node() == node_) return true;
    return false;
  }

  // Caller holds core_->mu. Returns whether this watcher was still registered.
  bool unregisterLocked() {
    auto it = core_->watchers.find({run_, round_});
    if (it == core_->watchers.end() || it->second.erase(this) == 0) return false;
    --core_->watcher_count;
    if (it->second.empty()) core_->watchers.erase(it);
    return true;
  }

 private:
  void send(pb::WatchEvent ev, bool last) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_ || last_queued_) return;  // nothing is sent after the last event
    last_queued_ = last;
    auto start = writes_.push(std::move(ev), 0, last);
    // Finished once the last event is being written; until then OnCancel may still finish.
    if (start.last) finished_ = true;
    lock.unlock();
    write(start);
  }

  // Outside mu_: gRPC may run OnWriteDone on this thread before StartWrite returns.
  void write(const WriteQueue<pb::WatchEvent>::Start& w) {
    if (!w.msg) return;
    if (w.last)
      StartWriteAndFinish(w.msg, grpc::WriteOptions(), grpc::Status::OK);
    else
      StartWrite(w.msg);
  }

  void finishOnce(const grpc::Status& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(s);
  }

  Core* core_;
  grpc::CallbackServerContext* ctx_;
  std::string run_, node_;
  int64_t round_;
  std::string peer_;
  std::shared_ptr<Core::ConnectionUse> connection_;  // this stream counts in its connection's
  std::mutex mu_;             // guards the three below; never held while calling into gRPC
  bool finished_ = false;     // Finish or StartWriteAndFinish called
  bool last_queued_ = false;  // the last event is queued or written
  WriteQueue<pb::WatchEvent> writes_;
  std::atomic<int> refs_{1};
};

class RendezvousService final : public pb::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(Core* core) : core_(core) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const pb::JoinRequest* req,
                                 pb::JoinResponse* resp) override {
    auto* call = new JoinCall(core_, ctx, req, resp);
    call->start();
    return call;
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const pb::HeartbeatRequest* req,
                                      pb::HeartbeatResponse* resp) override {
    return core_->unary(ctx, [&] {
      int32_t waiting = 0;
      RdzvStatus st;
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        st = core_->state.heartbeat(req->run_id(), req->node_id(), req->round(), Clock::now(),
                                    &waiting);
        core_->rescheduleLocked();
      }
      if (!st.ok()) throw RpcError{toGrpc(st.code), st.message};
      resp->set_nodes_waiting(waiting);
    });
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const pb::LeaveRequest* req,
                                  pb::LeaveResponse*) override {
    return core_->unary(ctx, [&] {
      Effects fx;
      RdzvStatus st;
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        st = core_->state.leave(req->run_id(), req->node_id(), Clock::now(), fx);
      }
      core_->apply(fx);
      if (!st.ok()) throw RpcError{toGrpc(st.code), st.message};
    });
  }

  grpc::ServerUnaryReactor* Withdraw(grpc::CallbackServerContext* ctx,
                                     const pb::WithdrawRequest* req,
                                     pb::WithdrawResponse* resp) override {
    return core_->unary(ctx, [&] {
      if (req->join_timeout_ms() <= 0)
        throw RpcError{grpc::INVALID_ARGUMENT,
                       fmt::format("withdraw node '{}' from run '{}': join timeout {} ms is out "
                                   "of range",
                                   req->node_id(), req->run_id(), req->join_timeout_ms())};
      JoinSpec spec;
      spec.run_id = req->run_id();
      spec.node.node_id = req->node_id();
      spec.config.min_nodes = req->min_nodes();
      spec.config.max_nodes = req->max_nodes();
      spec.config.join_timeout = fromWire(req->join_timeout_ms());
      Effects fx;
      RdzvStatus st;
      RendezvousState::Withdrawal w;
      {
        std::lock_guard<std::mutex> lock(core_->mu);
        st = core_->state.withdraw(spec, req->reason(), Clock::now(), fx, &w);
      }
      core_->apply(fx);  // fails the parked joins, re-arms the timer
      if (!st.ok()) throw RpcError{toGrpc(st.code), st.message};
      resp->set_stopped_nodes(w.stopped);
      resp->set_can_come(w.can_come);
      resp->set_failed(w.failed);
    });
  }

  grpc::ServerWriteReactor<pb::WatchEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                  const pb::WatchRequest* req) override {
    auto* call = new WatchCall(core_, ctx, req);
    call->start();
    return call;
  }

 private:
  Core* core_;
};

}  // namespace

std::unique_ptr<grpc::Service> makeRendezvousService(Core* core) {
  return std::make_unique<RendezvousService>(core);
}

}  // namespace ddpl::rdzv::grpc_detail
