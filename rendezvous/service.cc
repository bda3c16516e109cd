#include "rendezvous/service.h"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "common/errors.h"
#include "common/log.h"
#include "ddpl/config.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/grpc_common.h"
#include "rendezvous/kv_space.h"
#include "rendezvous/rendezvous_state.h"
#include "rendezvous/timer_queue.h"
#include "rendezvous/token.h"

namespace ddpl::rdzv::grpc_detail {

namespace pb = ::ddpl::rendezvous::v1;

namespace {

// Thrown inside handlers; becomes the call's status.
struct RpcError {
  grpc::StatusCode code;
  std::string message;
};

grpc::StatusCode toGrpc(RdzvCode c) {
  switch (c) {
    case RdzvCode::kOk:
      return grpc::OK;
    case RdzvCode::kInvalidArgument:
      return grpc::INVALID_ARGUMENT;
    case RdzvCode::kFailedPrecondition:
      return grpc::FAILED_PRECONDITION;
    case RdzvCode::kDeadlineExceeded:
      return grpc::DEADLINE_EXCEEDED;
    case RdzvCode::kResourceExhausted:
      return grpc::RESOURCE_EXHAUSTED;
    case RdzvCode::kNotFound:
      return grpc::NOT_FOUND;
    case RdzvCode::kCancelled:
      return grpc::CANCELLED;
  }
  return grpc::UNKNOWN;
}

grpc::Status toGrpc(const RdzvStatus& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(toGrpc(s.code), s.message);
}

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

class WatchCall;
class JoinCall;

class Core {
 public:
  explicit Core(const ServiceConfig& c)
      : cfg(c), state(RendezvousStateOptions{c.heartbeat_window}) {}

  ~Core() { timers.stop(); }

  grpc::Status authorize(grpc::CallbackServerContext* ctx) {
    if (cfg.token.empty()) return grpc::Status::OK;
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenHeader);
    bool ok = it != md.end() &&
              constantTimeEquals(std::string(it->second.data(), it->second.size()), cfg.token);
    if (ok) return grpc::Status::OK;
    ++unauthenticated;
    log::warn("[{}] refused a call from {}: {} token", cfg.log_name, ctx->peer(),
              it == md.end() ? "missing" : "wrong");
    return grpc::Status(grpc::UNAUTHENTICATED,
                        it == md.end() ? "this server requires a token and the call had none"
                                       : "the call's token does not match the server's");
  }

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
      log::error("[{}] internal error: {}", cfg.log_name, e.what());
      return grpc::Status(grpc::INTERNAL, e.what());
    }
  }

  template <typename Body>
  grpc::ServerUnaryReactor* unary(grpc::CallbackServerContext* ctx, Body&& body) {
    auto* r = ctx->DefaultReactor();
    r->Finish(guard(ctx, std::forward<Body>(body)));
    return r;
  }

  void checkValue(const std::string& key, size_t size) const {
    if (static_cast<int64_t>(size) > cfg.max_value_bytes)
      throw RpcError{grpc::RESOURCE_EXHAUSTED,
                     fmt::format("value for key '{}' is {} bytes; this server's limit is {} bytes",
                                 key, size, cfg.max_value_bytes)};
  }

  Duration waitTimeout(int64_t timeout_ms) const {
    if (timeout_ms < 0)
      throw RpcError{grpc::INVALID_ARGUMENT, fmt::format("negative timeout {}ms", timeout_ms)};
    return std::min(Duration(timeout_ms), cfg.max_wait);
  }

  // Acts on what the state machine decided: completes joins, tells watchers, logs, and
  // re-arms the tick timer. Called without mu held.
  void apply(Effects& fx);
  void rescheduleLocked();
  void onTick();

  ServiceConfig cfg;
  KvSpace kv;
  TimerQueue timers;
  std::atomic<int64_t> parked_store{0};
  std::atomic<int64_t> unauthenticated{0};
  std::atomic<bool> shutting_down{false};

  std::mutex mu;  // guards everything below
  RendezvousState state;
  std::unordered_map<JoinTicket, JoinCall*> joins;
  std::map<std::pair<std::string, int64_t>, std::set<WatchCall*>> watchers;
  int64_t watcher_count = 0;
  TimerQueue::TimerId tick_timer = 0;
  std::optional<TimePoint> tick_at;
};

// ---- store operations --------------------------------------------------------------------

// The operations that answer at once, shared by the unary handlers and the Session stream.
// They throw RpcError or a ddpl error; Core::run turns that into the operation's status.
namespace ops {

void ping(Core& c, pb::PingResponse* resp) {
  resp->set_server_version(DDPL_VERSION);
  resp->set_max_value_bytes(c.cfg.max_value_bytes);
}

void set(Core& c, const pb::SetRequest& req, pb::SetResponse*) {
  c.checkValue(req.key(), req.value().size());
  c.kv.set(req.key(), bytes(req.value()));
}

void add(Core& c, const pb::AddRequest& req, pb::AddResponse* resp) {
  resp->set_value(c.kv.add(req.key(), req.delta()));
}

void compareSet(Core& c, const pb::CompareSetRequest& req, pb::CompareSetResponse* resp) {
  c.checkValue(req.key(), req.desired().size());
  Bytes v = c.kv.compareSet(req.key(), bytes(req.expected()), bytes(req.desired()));
  resp->set_value(v.data(), v.size());
}

void check(Core& c, const pb::CheckRequest& req, pb::CheckResponse* resp) {
  resp->set_all_present(c.kv.check({req.keys().begin(), req.keys().end()}));
}

void deleteKey(Core& c, const pb::DeleteKeyRequest& req, pb::DeleteKeyResponse* resp) {
  resp->set_existed(c.kv.deleteKey(req.key()));
}

void numKeys(Core& c, const pb::NumKeysRequest& req, pb::NumKeysResponse* resp) {
  resp->set_count(c.kv.numKeys(req.prefix()));
}

void multiSet(Core& c, const pb::MultiSetRequest& req, pb::MultiSetResponse*) {
  if (req.keys_size() != req.values_size())
    throw RpcError{grpc::INVALID_ARGUMENT, fmt::format("multiSet: {} keys but {} values",
                                                       req.keys_size(), req.values_size())};
  std::vector<Bytes> values;
  values.reserve(req.values_size());
  for (int i = 0; i < req.keys_size(); ++i) {
    c.checkValue(req.keys(i), req.values(i).size());
    values.push_back(bytes(req.values(i)));
  }
  c.kv.multiSet({req.keys().begin(), req.keys().end()}, std::move(values));
}

// The operations that may park: what to wait for, and how the values fill the response.
struct Park {
  std::vector<std::string> keys;
  int64_t timeout_ms = 0;
  bool want_values = false;
  const char* op = "";
};

Park park(const pb::GetRequest& r) { return {{r.key()}, r.timeout_ms(), true, "get"}; }
Park park(const pb::WaitRequest& r) {
  return {{r.keys().begin(), r.keys().end()}, r.timeout_ms(), false, "wait"};
}
Park park(const pb::MultiGetRequest& r) {
  return {{r.keys().begin(), r.keys().end()}, r.timeout_ms(), true, "multiGet"};
}

void fill(pb::GetResponse* resp, std::vector<Bytes>& v) {
  resp->set_value(v[0].data(), v[0].size());
}
void fill(pb::WaitResponse*, std::vector<Bytes>&) {}
void fill(pb::MultiGetResponse* resp, std::vector<Bytes>& v) {
  for (auto& b : v) resp->add_values(b.data(), b.size());
}

}  // namespace ops

// ---- parked store operations -------------------------------------------------------------

// A get, wait or multiGet whose keys are not all there yet, for a unary call or a Session
// stream alike. Exactly one of three things finishes it, decided by KvSpace::cancelWait/the
// ready callback: the keys arrive, its deadline passes (TimerQueue), or its caller goes away
// (cancel()). KvSpace's callback holds it until then; the timer holds only a weak reference,
// so that an answered operation does not wait in memory for its deadline.
class ParkedOp : public std::enable_shared_from_this<ParkedOp> {
 public:
  // Runs exactly once: OK with the values (in key order, when wanted), DEADLINE_EXCEEDED
  // naming the missing keys, or CANCELLED.
  using Done = std::function<void(const grpc::Status&, std::vector<Bytes>& values)>;

  ParkedOp(Core* core, ops::Park park, Duration timeout, Done done)
      : core_(core), park_(std::move(park)), timeout_(timeout), done_(std::move(done)) {}

  void start() {
    auto deadline = Clock::now() + timeout_;
    auto self = shared_from_this();
    ++core_->parked_store;
    auto st = core_->kv.waitFor(park_.keys, park_.want_values,
                                [self](std::vector<Bytes> v) { self->ready(std::move(v)); });
    if (st.ready) {
      --core_->parked_store;
      done_(grpc::Status::OK, st.values);
      return;
    }
    wait_id_.store(st.id);
    Core* core = core_;
    KvSpace::WaitId id = st.id;
    std::weak_ptr<ParkedOp> weak = self;
    auto timer = core_->timers.schedule(deadline, [core, id, weak] {
      if (auto op = weak.lock())
        if (core->kv.cancelWait(id)) op->timedOut();
    });
    TimerQueue::TimerId none = 0;
    // Already answered (a set on another thread got there first): drop the timer now.
    if (!timer_.compare_exchange_strong(none, timer)) core_->timers.cancel(timer);
  }

  // The caller went away. Safe at any time, also after the operation finished.
  void cancel() {
    auto id = wait_id_.load();
    if (id == 0 || !core_->kv.cancelWait(id)) return;
    finishing();
    std::vector<Bytes> none;
    done_(grpc::Status(grpc::CANCELLED, fmt::format("{} cancelled", park_.op)), none);
  }

 private:
  static constexpr TimerQueue::TimerId kFinished = ~TimerQueue::TimerId{0};

  void finishing() {
    --core_->parked_store;
    auto t = timer_.exchange(kFinished);
    if (t != 0 && t != kFinished) core_->timers.cancel(t);
  }

  void ready(std::vector<Bytes> values) {
    finishing();
    done_(grpc::Status::OK, values);
  }

  void timedOut() {
    finishing();
    const auto& keys = park_.keys;
    auto missing = core_->kv.missing(keys);
    std::string msg =
        keys.size() == 1
            ? fmt::format("{}: timed out after {} waiting for key '{}'", park_.op,
                          describe(timeout_), keys[0])
            : fmt::format("{}: timed out after {} waiting for {}/{} keys: {}", park_.op,
                          describe(timeout_), missing.size(), keys.size(), quoteKeys(missing));
    std::vector<Bytes> none;
    done_(grpc::Status(grpc::DEADLINE_EXCEEDED, msg), none);
  }

  Core* core_;
  ops::Park park_;
  Duration timeout_;
  Done done_;
  std::atomic<KvSpace::WaitId> wait_id_{0};
  std::atomic<TimerQueue::TimerId> timer_{0};
};

// A unary get, wait or multiGet that parked. Deleted when both gRPC is done with it and
// start() has returned.
class ParkedCall : public grpc::ServerUnaryReactor {
 public:
  template <typename Resp>
  ParkedCall(Core* core, grpc::CallbackServerContext* ctx, ops::Park park, Duration timeout,
             Resp* resp)
      : ctx_(ctx),
        op_(std::make_shared<ParkedOp>(
            core, std::move(park), timeout,
            [this, resp](const grpc::Status& s, std::vector<Bytes>& values) {
              if (s.ok()) ops::fill(resp, values);
              Finish(s);
            })) {}

  void start() {
    op_->start();
    if (ctx_->IsCancelled()) op_->cancel();
    unref();
  }

  void OnCancel() override { op_->cancel(); }
  void OnDone() override { unref(); }

 private:
  void unref() {
    if (--refs_ == 0) delete this;
  }

  grpc::CallbackServerContext* ctx_;
  std::shared_ptr<ParkedOp> op_;
  std::atomic<int> refs_{2};  // gRPC (until OnDone) and start()
};

// ---- the Session stream ------------------------------------------------------------------

// One client's stream of store operations. The token is checked once, here; each operation
// then runs through the same ops:: functions and ParkedOp as its unary call, and its answer
// (or its error status) is queued as one response, tagged with the request's id. Parked
// operations answer out of order. gRPC allows one write in flight, so responses wait in
// `queue_` behind it.
//
// Reference-counted: gRPC holds one reference until OnDone, each parked operation one until
// it has answered.
class StoreSession : public grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse> {
 public:
  StoreSession(Core* core, grpc::CallbackServerContext* ctx) : core_(core) {
    grpc::Status s = core_->authorize(ctx);
    if (!s.ok()) {
      finished_ = true;
      Finish(s);
      return;
    }
    StartRead(&req_);
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
    }
    StartRead(&req_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ok || finished_) {
      writing_ = false;
      return;  // the stream broke: OnCancel finishes it
    }
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      StartWrite(&current_);
      return;
    }
    writing_ = false;
    finishIfIdle(lock);
  }

  void OnCancel() override {
    std::vector<std::shared_ptr<ParkedOp>> parked;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      finished_ = true;
      queue_.clear();
      for (auto& [id, op] : parked_) parked.push_back(op);
    }
    for (auto& op : parked) op->cancel();  // their answers go nowhere: finished_
    Finish(grpc::Status(grpc::CANCELLED, "store session cancelled"));
  }

  void OnDone() override { unref(); }

 private:
  void handle(const pb::StoreRequest& req) {
    pb::StoreResponse resp;
    resp.set_id(req.id());
    grpc::Status s;
    Core& c = *core_;
    switch (req.op_case()) {
      case pb::StoreRequest::kPing:
        s = c.run([&] { ops::ping(c, resp.mutable_ping()); });
        break;
      case pb::StoreRequest::kSet:
        s = c.run([&] { ops::set(c, req.set(), resp.mutable_set()); });
        break;
      case pb::StoreRequest::kAdd:
        s = c.run([&] { ops::add(c, req.add(), resp.mutable_add()); });
        break;
      case pb::StoreRequest::kCompareSet:
        s = c.run([&] { ops::compareSet(c, req.compare_set(), resp.mutable_compare_set()); });
        break;
      case pb::StoreRequest::kCheck:
        s = c.run([&] { ops::check(c, req.check(), resp.mutable_check()); });
        break;
      case pb::StoreRequest::kDeleteKey:
        s = c.run([&] { ops::deleteKey(c, req.delete_key(), resp.mutable_delete_key()); });
        break;
      case pb::StoreRequest::kNumKeys:
        s = c.run([&] { ops::numKeys(c, req.num_keys(), resp.mutable_num_keys()); });
        break;
      case pb::StoreRequest::kMultiSet:
        s = c.run([&] { ops::multiSet(c, req.multi_set(), resp.mutable_multi_set()); });
        break;
      case pb::StoreRequest::kGet:
        park(req.id(), ops::park(req.get()), &pb::StoreResponse::mutable_get);
        return;
      case pb::StoreRequest::kWait:
        park(req.id(), ops::park(req.wait()), &pb::StoreResponse::mutable_wait);
        return;
      case pb::StoreRequest::kMultiGet:
        park(req.id(), ops::park(req.multi_get()), &pb::StoreResponse::mutable_multi_get);
        return;
      case pb::StoreRequest::OP_NOT_SET:
        s = grpc::Status(grpc::INVALID_ARGUMENT,
                         fmt::format("request {} names no operation", req.id()));
        break;
    }
    if (!s.ok()) setError(resp, s);
    respond(std::move(resp));
  }

  template <typename Resp>
  void park(uint64_t id, ops::Park p, Resp* (pb::StoreResponse::*field)()) {
    Duration timeout{};
    grpc::Status s = core_->run([&] { timeout = core_->waitTimeout(p.timeout_ms); });
    if (!s.ok()) {
      pb::StoreResponse resp;
      resp.set_id(id);
      setError(resp, s);
      respond(std::move(resp));
      return;
    }
    uint64_t slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot = next_slot_++;
    }
    ++refs_;
    auto op = std::make_shared<ParkedOp>(
        core_, std::move(p), timeout,
        [this, id, slot, field](const grpc::Status& st, std::vector<Bytes>& values) {
          pb::StoreResponse resp;
          resp.set_id(id);
          if (st.ok())
            ops::fill((resp.*field)(), values);
          else
            setError(resp, st);
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

  static void setError(pb::StoreResponse& resp, const grpc::Status& s) {
    auto* e = resp.mutable_error();
    e->set_code(static_cast<int32_t>(s.error_code()));
    e->set_message(s.error_message());
  }

  void respond(pb::StoreResponse resp) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_) return;
    if (writing_) {
      queue_.push_back(std::move(resp));
      return;
    }
    writing_ = true;
    current_ = std::move(resp);
    lock.unlock();
    // Never under mu_: gRPC may run OnWriteDone on this thread before StartWrite returns.
    StartWrite(&current_);
  }

  // Caller holds mu_ through `lock`; releases it.
  void finishIfIdle(std::unique_lock<std::mutex>& lock) {
    if (finished_ || !reads_done_ || writing_ || !parked_.empty()) return;
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
  bool writing_ = false;
  pb::StoreResponse current_;  // the write in flight
  std::deque<pb::StoreResponse> queue_;
  uint64_t next_slot_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<ParkedOp>> parked_;
  std::atomic<int> refs_{1};
};

class StoreService final : public pb::Store::CallbackService {
 public:
  explicit StoreService(Core* core) : core_(core) {}

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const pb::PingRequest*,
                                 pb::PingResponse* resp) override {
    return core_->unary(ctx, [&] { ops::ping(*core_, resp); });
  }

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const pb::SetRequest* req,
                                pb::SetResponse* resp) override {
    return core_->unary(ctx, [&] { ops::set(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetRequest* req,
                                pb::GetResponse* resp) override {
    return park(ctx, ops::park(*req), resp);
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    return core_->unary(ctx, [&] { ops::add(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const pb::CompareSetRequest* req,
                                       pb::CompareSetResponse* resp) override {
    return core_->unary(ctx, [&] { ops::compareSet(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const pb::CheckRequest* req,
                                  pb::CheckResponse* resp) override {
    return core_->unary(ctx, [&] { ops::check(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const pb::WaitRequest* req,
                                 pb::WaitResponse* resp) override {
    return park(ctx, ops::park(*req), resp);
  }

  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* ctx,
                                      const pb::DeleteKeyRequest* req,
                                      pb::DeleteKeyResponse* resp) override {
    return core_->unary(ctx, [&] { ops::deleteKey(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx, const pb::NumKeysRequest* req,
                                    pb::NumKeysResponse* resp) override {
    return core_->unary(ctx, [&] { ops::numKeys(*core_, *req, resp); });
  }

  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx,
                                     const pb::MultiGetRequest* req,
                                     pb::MultiGetResponse* resp) override {
    return park(ctx, ops::park(*req), resp);
  }

  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const pb::MultiSetRequest* req,
                                     pb::MultiSetResponse* resp) override {
    return core_->unary(ctx, [&] { ops::multiSet(*core_, *req, resp); });
  }

  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext* ctx) override {
    return new StoreSession(core_, ctx);
  }

 private:
  template <typename Resp>
  grpc::ServerUnaryReactor* park(grpc::CallbackServerContext* ctx, ops::Park p, Resp* resp) {
    Duration timeout{};
    grpc::Status s = core_->guard(ctx, [&] { timeout = core_->waitTimeout(p.timeout_ms); });
    if (!s.ok()) {
      auto* r = ctx->DefaultReactor();
      r->Finish(s);
      return r;
    }
    auto* call = new ParkedCall(core_, ctx, std::move(p), timeout, resp);
    call->start();
    return call;
  }

  Core* core_;
};

// ---- rendezvous calls --------------------------------------------------------------------

class JoinCall : public grpc::ServerUnaryReactor {
 public:
  JoinCall(Core* core, grpc::CallbackServerContext* ctx, const pb::JoinRequest* req,
           pb::JoinResponse* resp)
      : core_(core), ctx_(ctx), req_(req), resp_(resp) {}

  void start() {
    grpc::Status s = core_->authorize(ctx_);
    if (!s.ok()) {
      Finish(s);
      unref();
      return;
    }
    JoinSpec spec;
    spec.run_id = req_->run_id();
    spec.node = {req_->node_id(), req_->local_world_size(), req_->version(), req_->address()};
    spec.config = {req_->min_nodes(), req_->max_nodes(), Duration(req_->join_timeout_ms()),
                   Duration(req_->last_call_timeout_ms())};
    include_members_ = req_->include_members();
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
  void complete(const JoinOutcome& o) {
    if (!o.status.ok()) {
      Finish(toGrpc(o.status));
      return;
    }
    const RoundMembership& m = *o.round;
    resp_->set_round(m.round);
    resp_->set_group_rank(o.group_rank);
    resp_->set_group_world_size(static_cast<int32_t>(m.nodes.size()));
    resp_->set_world_size(m.world_size);
    resp_->mutable_local_world_sizes()->Reserve(static_cast<int>(m.nodes.size()));
    for (const auto& n : m.nodes) resp_->add_local_world_sizes(n.local_world_size);
    resp_->set_master_address(m.nodes.front().address);
    resp_->set_store_prefix(fmt::format("{}/{}/", m.run_id, m.round));
    resp_->set_heartbeat_interval_ms(
        std::max<int64_t>(core_->cfg.heartbeat_window.count() / 3, 100));
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
  JoinTicket ticket_ = 0;  // guarded by core_->mu
  std::atomic<int> refs_{2};
};

// The watch stream of one member for one round. Sends `watching` once registered and
// `invalidated` (then finishes) when the round ends; if the stream breaks first, the node is
// evicted. Reference-counted: gRPC holds one reference until OnDone, and Core::apply holds
// one while it notifies outside its lock.
class WatchCall : public grpc::ServerWriteReactor<pb::WatchEvent> {
 public:
  WatchCall(Core* core, grpc::CallbackServerContext* ctx, const pb::WatchRequest* req)
      : core_(core), ctx_(ctx), run_(req->run_id()), node_(req->node_id()), round_(req->round()) {}

  void start() {
    grpc::Status s = core_->authorize(ctx_);
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

  void ref() { ++refs_; }
  void unref() {
    if (--refs_ == 0) delete this;
  }

  void sendInvalidated(const Invalidation& inv) {
    pb::WatchEvent ev;
    auto* i = ev.mutable_invalidated();
    i->set_round(inv.round);
    i->set_reason(inv.reason);
    i->set_nodes_waiting(inv.nodes_waiting);
    send(std::move(ev), true);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok || finished_) return;  // the stream broke: OnCancel finishes it
    if (queued_) {
      current_ = std::move(*queued_);
      queued_.reset();
      writing_ = true;
      bool last = queued_last_;
      if (last) finished_ = true;
      lock.unlock();
      if (last)
        StartWriteAndFinish(&current_, grpc::WriteOptions(), grpc::Status::OK);
      else
        StartWrite(&current_);
    }
  }

  void OnCancel() override {
    bool registered = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      registered = unregisterLocked();
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
    if (finished_) return;
    if (writing_) {
      queued_ = std::move(ev);
      queued_last_ = last;
      return;
    }
    current_ = std::move(ev);
    writing_ = true;
    if (last) finished_ = true;
    lock.unlock();
    if (last)
      StartWriteAndFinish(&current_, grpc::WriteOptions(), grpc::Status::OK);
    else
      StartWrite(&current_);
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
  std::mutex mu_;  // guards the write state below; never held while calling into gRPC
  bool writing_ = false;
  bool finished_ = false;
  pb::WatchEvent current_;
  std::optional<pb::WatchEvent> queued_;
  bool queued_last_ = false;
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

  grpc::ServerWriteReactor<pb::WatchEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                  const pb::WatchRequest* req) override {
    auto* call = new WatchCall(core_, ctx, req);
    call->start();
    return call;
  }

 private:
  Core* core_;
};

// ---- Core --------------------------------------------------------------------------------

void Core::apply(Effects& fx) {
  for (const auto& e : fx.events) log::info("[{}] {}", cfg.log_name, e);
  std::vector<std::pair<JoinCall*, const JoinOutcome*>> done;
  std::vector<std::pair<WatchCall*, const Invalidation*>> notify;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& o : fx.joins) {
      auto it = joins.find(o.ticket);
      if (it == joins.end()) continue;
      done.emplace_back(it->second, &o);
      joins.erase(it);
    }
    for (const auto& inv : fx.invalidated) {
      auto it = watchers.find({inv.run_id, inv.round});
      if (it == watchers.end()) continue;
      for (WatchCall* w : it->second) {
        w->ref();
        notify.emplace_back(w, &inv);
      }
      watcher_count -= static_cast<int64_t>(it->second.size());
      watchers.erase(it);
    }
    rescheduleLocked();
  }
  for (auto& [call, o] : done) call->complete(*o);
  for (auto& [w, inv] : notify) {
    w->sendInvalidated(*inv);
    w->unref();
  }
}

void Core::rescheduleLocked() {
  auto next = state.nextDeadline();
  if (next == tick_at) return;
  if (tick_timer) timers.cancel(tick_timer);
  tick_timer = 0;
  tick_at = next;
  if (next) tick_timer = timers.schedule(*next, [this] { onTick(); });
}

void Core::onTick() {
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu);
    tick_timer = 0;
    tick_at.reset();
    state.tick(Clock::now(), fx);
  }
  apply(fx);  // re-arms the timer for the next deadline
}

// ---- Services ----------------------------------------------------------------------------

Services::Services(const ServiceConfig& config)
    : core_(std::make_unique<Core>(config)),
      store_(std::make_unique<StoreService>(core_.get())),
      rendezvous_(std::make_unique<RendezvousService>(core_.get())) {}

Services::~Services() = default;

grpc::Service* Services::store() { return store_.get(); }
grpc::Service* Services::rendezvous() { return rendezvous_.get(); }
void Services::beginShutdown() { core_->shutting_down = true; }

ServerStats Services::stats() const {
  ServerStats s;
  s.parked_store_calls = core_->parked_store.load();
  s.unauthenticated_calls = core_->unauthenticated.load();
  std::lock_guard<std::mutex> lock(core_->mu);
  s.parked_joins = static_cast<int64_t>(core_->joins.size());
  s.watchers = core_->watcher_count;
  return s;
}

}  // namespace ddpl::rdzv::grpc_detail
