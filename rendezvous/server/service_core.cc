#include "rendezvous/server/service_core.h"

#include <google/protobuf/io/coded_stream.h>
#include <malloc.h>

#include "common/log.h"
#include "ddpl/config.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/store_ops.h"
#include "rendezvous/server/wire_server.h"
#include "rendezvous/store/token.h"

namespace ddpl::rdzv::grpc_detail {

namespace {

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Given back this much, the heap is worth trimming (glibc keeps large freed blocks otherwise);
// the trim runs this long after the first release, so that a burst of streams ending is one.
constexpr int64_t kTrimAfterBytes = int64_t{8} << 20;
constexpr Duration kTrimDelay{200};

// The bytes a length-delimited field of `len` bytes takes with its tag (field numbers < 16).
int64_t delimited(int64_t len) {
  return 1 + google::protobuf::io::CodedOutputStream::VarintSize64(static_cast<uint64_t>(len)) +
         len;
}

}  // namespace

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

std::vector<std::string> runKeyPrefixes(const std::string& run_id) {
  return {run_id + "/", "ddpl-agents/" + run_id + "/"};
}

// ---- Core --------------------------------------------------------------------------------

Core::Core(const ServiceConfig& c)
    : cfg(c), state(RendezvousStateOptions{c.heartbeat_window, c.run_retention}) {
  if (cfg.stats_interval.count() > 0) armStats();
}

void Core::armStats() {
  // Re-arms itself on the timer thread; ~Core stops that thread first.
  timers.schedule(Clock::now() + cfg.stats_interval, [this] {
    logStats();
    armStats();
  });
}

Core::~Core() { timers.stop(); }

grpc::Status Core::authorize(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenHeader);
  if (it == md.end()) return authorizeToken(ctx->peer(), nullptr);
  std::string token(it->second.data(), it->second.size());
  return authorizeToken(ctx->peer(), &token);
}

grpc::Status Core::authorizeToken(const std::string& peer, const std::string* token) {
  bool ok = cfg.token.empty() || (token && constantTimeEquals(*token, cfg.token));
  if (cfg.on_token_checked) cfg.on_token_checked(peer, ok);
  if (ok) return grpc::Status::OK;
  ++unauthenticated;
  const char* why = token ? "wrong" : "missing";
  // One line per interval at most: a flood of bad calls must not flood the log. The first
  // refusal is logged at once; the ones after it within the interval are counted and logged
  // together when it ends.
  bool first = false, arm = false;
  Clock::time_point flush_at;
  {
    std::lock_guard<std::mutex> lock(refusal_mu_);
    auto now = Clock::now();
    if (refusal_logged_at_ == Clock::time_point{} ||
        now - refusal_logged_at_ >= kRefusalLogInterval) {
      if (refusals_unlogged_ == 0) {
        first = true;
        refusal_logged_at_ = now;
      }
    }
    if (!first) {
      ++refusals_unlogged_;
      last_refusal_ = fmt::format("latest from {}: {} token", peer, why);
      if (!refusal_flush_armed_) {
        refusal_flush_armed_ = arm = true;
        flush_at = std::max(now, refusal_logged_at_ + kRefusalLogInterval);
      }
    }
  }
  if (first) log::warn("[{}] refused a call from {}: {} token", cfg.log_name, peer, why);
  if (arm) timers.schedule(flush_at, [this] { flushRefusals(); });
  return grpc::Status(grpc::UNAUTHENTICATED,
                      token ? "the call's token does not match the server's"
                            : "this server requires a token and the call had none");
}

void Core::flushRefusals() {
  int64_t n;
  std::string latest;
  {
    std::lock_guard<std::mutex> lock(refusal_mu_);
    refusal_flush_armed_ = false;
    n = refusals_unlogged_;
    refusals_unlogged_ = 0;
    latest = last_refusal_;
    refusal_logged_at_ = Clock::now();
  }
  if (n > 0)
    log::warn(
        "[{}] refused {} calls without a valid token in the last {} ({}; {} refused since "
        "start)",
        cfg.log_name, n, describe(kRefusalLogInterval), latest, unauthenticated.load());
}

grpc::Status Core::internalError(const std::exception& e) {
  log::error("[{}] internal error: {}", cfg.log_name, e.what());
  return grpc::Status(grpc::INTERNAL, e.what());
}

void Core::checkValue(const std::string& key, size_t size) const {
  if (static_cast<int64_t>(size) > cfg.max_value_bytes)
    throw RpcError{grpc::RESOURCE_EXHAUSTED,
                   fmt::format("value for key '{}' is {} bytes; this server's limit is {} bytes",
                               key, size, cfg.max_value_bytes)};
}

Duration Core::waitTimeout(int64_t timeout_ms) const {
  if (timeout_ms < 0)
    throw RpcError{grpc::INVALID_ARGUMENT, fmt::format("negative timeout {}ms", timeout_ms)};
  // Compared as integers: any int64 means "at most max_wait", never a wrapped deadline.
  return timeout_ms > cfg.max_wait.count() ? cfg.max_wait : Duration(timeout_ms);
}

void Core::admitPark() {
  int64_t n = ++parked_store;
  if (n <= cfg.limits.max_parked) return;
  --parked_store;
  throw RpcError{grpc::RESOURCE_EXHAUSTED,
                 fmt::format("this server already holds {} parked gets and waits (limit {})", n - 1,
                             cfg.limits.max_parked)};
}

void Core::apply(Effects& fx) {
  for (const auto& e : fx.events) log::info("[{}] {}", cfg.log_name, e);
  for (const auto& run : fx.removed_runs) {
    int64_t keys = 0;
    for (const auto& prefix : runKeyPrefixes(run)) keys += kv.deletePrefix(prefix);
    if (keys > 0) log::info("[{}] run '{}': deleted its {} keys", cfg.log_name, run, keys);
  }
  if (cfg.on_round_formed) {
    // Before any member hears of the round: its workers' store must be open when they come.
    std::lock_guard<std::mutex> lock(round_formed_mu);
    for (const auto& o : fx.joins) {
      if (!o.status.ok() || !o.round || o.round->run_id != cfg.tcpstore_run_id ||
          o.round->round <= round_formed)
        continue;
      round_formed = o.round->round;
      cfg.on_round_formed(*o.round);
    }
  }
  std::vector<std::pair<JoinWaiter*, const JoinOutcome*>> done;
  std::vector<std::pair<RoundWatcher*, const Invalidation*>> notify;
  {
    std::lock_guard<std::mutex> lock(mu);
    runs_forgotten += static_cast<int64_t>(fx.removed_runs.size());
    for (const auto& o : fx.joins) {
      auto it = joins.find(o.ticket);
      if (it == joins.end()) continue;
      done.emplace_back(it->second, &o);
      joins.erase(it);
    }
    for (const auto& inv : fx.invalidated) {
      auto it = watchers.find({inv.run_id, inv.round});
      if (it == watchers.end()) continue;
      for (RoundWatcher* w : it->second) {
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

std::shared_ptr<Core::ConnectionUse> Core::openSession(const std::string& peer) {
  std::lock_guard<std::mutex> lock(connections_mu_);
  auto& use = connections_[peer];
  if (!use) use = std::make_shared<ConnectionUse>();
  if (use->sessions >= cfg.max_sessions_per_connection) return nullptr;
  ++use->sessions;
  return use;
}

std::shared_ptr<Core::ConnectionUse> Core::admitLongCall(const std::string& peer, const char* what,
                                                         grpc::Status* refused) {
  auto use = openSession(peer);
  if (use) return use;
  // Past the stream limit its SETTINGS announced: only a client that ignores them gets here,
  // and its connection is ended (gRPC ends one that acknowledged them).
  *refused = grpc::Status(grpc::RESOURCE_EXHAUSTED,
                          fmt::format("this connection already holds {} long-lived calls (store "
                                      "sessions, watches, parked calls), the server's limit per "
                                      "connection; it is closed",
                                      cfg.max_sessions_per_connection));
  log::debug(
      "[{}] {} opened more than {} long-lived calls on one connection ({} the last): "
      "closing it",
      cfg.log_name, peer, cfg.max_sessions_per_connection, what);
  if (cfg.on_too_many_streams) cfg.on_too_many_streams(peer);
  return nullptr;
}

void Core::closeSession(const std::string& peer, const std::shared_ptr<ConnectionUse>& use) {
  std::lock_guard<std::mutex> lock(connections_mu_);
  if (--use->sessions > 0) return;
  auto it = connections_.find(peer);
  if (it != connections_.end() && it->second == use) connections_.erase(it);
}

void Core::released(int64_t bytes) {
  if (released_bytes_.fetch_add(bytes) + bytes < kTrimAfterBytes) return;
  if (trim_armed_.exchange(true)) return;
  timers.schedule(Clock::now() + kTrimDelay, [this] {
    released_bytes_ = 0;
    trim_armed_ = false;
    malloc_trim(0);
  });
}

ServerStats Core::stats() {
  ServerStats s;
  s.parked_store_calls = parked_store.load();
  s.unauthenticated_calls = unauthenticated.load();
  s.keys = kv.numKeys("");
  s.sessions = sessions.load();
  s.queued_bytes = queued_bytes.load();
  s.refused_for_memory = refused_for_memory.load();
  s.paused_reads = paused_reads.load();
  std::lock_guard<std::mutex> lock(mu);
  s.parked_joins = static_cast<int64_t>(joins.size());
  s.watchers = watcher_count;
  s.runs = static_cast<int64_t>(state.runCount());
  s.runs_forgotten = runs_forgotten;
  s.runs_visited = state.runsVisited();
  return s;
}

void Core::logStats() {
  ServerStats s = stats();
  std::string line = fmt::format(
      "{} runs ({} forgotten), {} keys, {} parked gets/waits, {} parked joins, {} watch "
      "streams, {} store sessions ({} bytes queued), {} calls refused for their token",
      s.runs, s.runs_forgotten, s.keys, s.parked_store_calls, s.parked_joins, s.watchers,
      s.sessions, s.queued_bytes, s.unauthenticated_calls);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (line == last_stats_line_) return;  // an idle server stays quiet
    last_stats_line_ = line;
  }
  log::info("[{}] stats: {}", cfg.log_name, line);
}

// ---- store operations --------------------------------------------------------------------

namespace ops {

void apply(Core& c, const pb::PingRequest&, pb::PingResponse* resp) {
  resp->set_server_version(DDPL_VERSION);
  resp->set_max_value_bytes(c.cfg.max_value_bytes);
}

void apply(Core& c, const pb::SetRequest& req, pb::SetResponse*) {
  c.checkValue(req.key(), req.value().size());
  c.kv.set(req.key(), bytes(req.value()));
}

void apply(Core& c, const pb::AddRequest& req, pb::AddResponse* resp) {
  resp->set_value(c.kv.add(req.key(), req.delta()));
}

void apply(Core& c, const pb::CompareSetRequest& req, pb::CompareSetResponse* resp) {
  c.checkValue(req.key(), req.desired().size());
  Bytes v = c.kv.compareSet(req.key(), bytes(req.expected()), bytes(req.desired()));
  resp->set_value(v.data(), v.size());
}

void apply(Core& c, const pb::CheckRequest& req, pb::CheckResponse* resp) {
  resp->set_all_present(c.kv.check({req.keys().begin(), req.keys().end()}));
}

void apply(Core& c, const pb::DeleteKeyRequest& req, pb::DeleteKeyResponse* resp) {
  resp->set_existed(c.kv.deleteKey(req.key()));
}

void apply(Core& c, const pb::NumKeysRequest& req, pb::NumKeysResponse* resp) {
  resp->set_count(c.kv.numKeys(req.prefix()));
}

void apply(Core& c, const pb::MultiSetRequest& req, pb::MultiSetResponse*) {
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
void fill(pb::GetResponse* resp, const KvSpace::Values& v) {
  resp->set_value(v[0]->data(), v[0]->size());
}
void fill(pb::WaitResponse*, const KvSpace::Values&) {}
void fill(pb::MultiGetResponse* resp, const KvSpace::Values& v) {
  for (auto& b : v) resp->add_values(b->data(), b->size());
}

}  // namespace ops

// ---- one request of a store session ------------------------------------------------------

SessionStep runSessionRequest(Core& c, const pb::StoreRequest& req) {
  SessionStep step;
  step.resp.set_id(req.id());
  grpc::Status s;
  bool known = visitStoreOp(req.op_case(), [&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::kKind == OpKind::kImmediate) {
      s = c.run([&] { ops::apply(c, Op::request(req), Op::response(step.resp)); });
    } else {
      s = c.run([&] {
        step.park = ops::park(Op::request(req));
        step.timeout = c.waitTimeout(step.park.timeout_ms);
        c.admitPark();
      });
      if (s.ok()) step.what = SessionStep::kPark;
    }
  });
  if (step.what == SessionStep::kPark) return step;
  // A quiet set is answered only when it fails: the client counts it confirmed by the answer
  // to any later request of this stream (they are handled in order).
  if (s.ok() && req.quiet() &&
      (req.op_case() == pb::StoreRequest::kSet || req.op_case() == pb::StoreRequest::kMultiSet)) {
    step.what = SessionStep::kQuiet;
    return step;
  }
  if (!known)
    s = grpc::Status(grpc::INVALID_ARGUMENT,
                     fmt::format("request {} names no operation this server knows", req.id()));
  if (!s.ok()) setOpError(step.resp, s);
  return step;
}

Answer answerOf(pb::StoreResponse resp) {
  Answer a;
  a.wire_bytes = static_cast<int64_t>(resp.ByteSizeLong());
  a.resp = std::move(resp);
  return a;
}

Answer parkedAnswer(uint64_t id, pb::StoreRequest::OpCase c, const grpc::Status& s,
                    KvSpace::Values& values) {
  Answer a;
  a.resp.set_id(id);
  if (!s.ok()) {
    setOpError(a.resp, s);
    a.wire_bytes = static_cast<int64_t>(a.resp.ByteSizeLong());
    return a;
  }
  // The values' share of the wire size, computed as protobuf would: each value a bytes field of
  // the sub-message, the sub-message a field of StoreResponse.
  int64_t sub = 0;
  if (c == pb::StoreRequest::kGet) {
    a.resp.mutable_get();
    if (!values.empty() && !values[0]->empty()) sub = delimited(values[0]->size());
  } else if (c == pb::StoreRequest::kMultiGet) {
    a.resp.mutable_multi_get();
    for (const auto& v : values) sub += delimited(static_cast<int64_t>(v->size()));
  } else {
    visitStoreOp(c, [&](auto op) {
      using Op = decltype(op);
      if constexpr (Op::kKind == OpKind::kParked) ops::fill(Op::response(a.resp), values);
    });
    a.wire_bytes = static_cast<int64_t>(a.resp.ByteSizeLong());
    return a;
  }
  a.values = std::move(values);
  // resp holds the id and an empty sub-message (its tag and a zero length); the values make
  // the sub-message `sub` bytes long instead.
  a.wire_bytes = static_cast<int64_t>(a.resp.ByteSizeLong()) - 2 + delimited(sub);
  return a;
}

void intoMessage(Answer&& a, pb::StoreResponse* out) {
  *out = std::move(a.resp);
  if (a.values.empty()) return;
  if (out->has_get()) {
    ops::fill(out->mutable_get(), a.values);
  } else if (out->has_multi_get()) {
    ops::fill(out->mutable_multi_get(), a.values);
  }
}

void setOpError(Answer& a, const grpc::Status& s) {
  a.values.clear();
  setOpError(a.resp, s);
  a.wire_bytes = static_cast<int64_t>(a.resp.ByteSizeLong());
}

pb::StoreResponse parkedAnswer(uint64_t id, pb::StoreRequest::OpCase c, const grpc::Status& s,
                               std::vector<Bytes>& values) {
  pb::StoreResponse resp;
  resp.set_id(id);
  if (!s.ok()) {
    setOpError(resp, s);
    return resp;
  }
  visitStoreOp(c, [&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::kKind == OpKind::kParked) ops::fill(Op::response(resp), values);
  });
  return resp;
}

void setOpError(pb::StoreResponse& resp, const grpc::Status& s) {
  uint64_t id = resp.id();
  resp.Clear();
  resp.set_id(id);
  auto* e = resp.mutable_error();
  e->set_code(static_cast<int32_t>(s.error_code()));
  e->set_message(s.error_message());
}

void admitAnswer(Core& c, Answer& a, int64_t own_bytes) {
  const auto& limits = c.cfg.limits;
  int64_t queued = c.queued_bytes.load();
  if (queued + a.cost() <= limits.max_queued_bytes) return;
  if (own_bytes == 0 && a.cost() <= kSmallAnswerBytes) return;
  ++c.refused_for_memory;
  setOpError(a, grpc::Status(grpc::RESOURCE_EXHAUSTED,
                             fmt::format("answer of {} bytes refused: the server already queues "
                                         "{} bytes of answers (limit {} bytes)",
                                         a.wire_bytes, queued, limits.max_queued_bytes)));
}

bool overLimit(const Core& c, int64_t unanswered, int64_t own_bytes, int64_t connection_bytes) {
  const auto& limits = c.cfg.limits;
  if (unanswered >= limits.max_stream_pending || own_bytes >= limits.max_stream_queued_bytes)
    return true;
  return own_bytes > 0 && (connection_bytes >= limits.max_stream_queued_bytes ||
                           c.queued_bytes.load() >= limits.max_queued_bytes);
}

// ---- ParkedOp ----------------------------------------------------------------------------

void ParkedOp::start() {
  auto deadline = Clock::now() + timeout_;  // timeout_ <= max_wait: no overflow
  auto self = shared_from_this();
  auto st = core_->kv.waitForShared(park_.keys, park_.want_values,
                                    [self](KvSpace::Values v) { self->ready(std::move(v)); });
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

void ParkedOp::cancel() {
  auto id = wait_id_.load();
  if (id == 0 || !core_->kv.cancelWait(id)) return;
  finishing();
  KvSpace::Values none;
  done_(grpc::Status(grpc::CANCELLED, fmt::format("{} cancelled", park_.op)), none);
}

void ParkedOp::finishing() {
  --core_->parked_store;
  auto t = timer_.exchange(kFinished);
  if (t != 0 && t != kFinished) core_->timers.cancel(t);
}

void ParkedOp::ready(KvSpace::Values values) {
  finishing();
  done_(grpc::Status::OK, values);
}

void ParkedOp::timedOut() {
  finishing();
  const auto& keys = park_.keys;
  auto missing = core_->kv.missing(keys);
  std::string msg =
      keys.size() == 1
          ? fmt::format("{}: timed out after {} waiting for key '{}'", park_.op, describe(timeout_),
                        keys[0])
          : fmt::format("{}: timed out after {} waiting for {}/{} keys: {}", park_.op,
                        describe(timeout_), missing.size(), keys.size(), quoteKeys(missing));
  KvSpace::Values none;
  done_(grpc::Status(grpc::DEADLINE_EXCEEDED, msg), none);
}

// ---- Services ----------------------------------------------------------------------------

Services::Services(const ServiceConfig& config)
    : core_(std::make_unique<Core>(config)),
      store_(makeStoreService(core_.get())),
      rendezvous_(makeRendezvousService(core_.get())) {}

Services::~Services() = default;

WireServer* Services::startWire(const WireOptions& options) {
  wire_ = std::make_unique<WireServer>(core_.get(), options);
  return wire_.get();
}

grpc::Service* Services::store() { return store_.get(); }
grpc::Service* Services::rendezvous() { return rendezvous_.get(); }
void Services::beginShutdown() { core_->shutting_down = true; }
ServerStats Services::stats() const { return core_->stats(); }

std::vector<RendezvousServer::RunValues> Services::nodeValues(const std::string& key,
                                                              size_t max_runs) const {
  std::vector<RendezvousServer::RunValues> out;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    for (const auto& id : core_->state.runIds(max_runs)) {
      auto st = core_->state.status(id);
      if (!st) continue;
      RendezvousServer::RunValues r;
      r.run_id = id;
      r.round = st->round;
      r.complete = st->phase == RendezvousState::Phase::kComplete;
      r.values.resize(static_cast<size_t>(r.complete ? st->members : 0));
      out.push_back(std::move(r));
    }
  }
  // The agents' job-wide namespace (runKeyPrefixes), as MultiNodeRendezvous writes it.
  for (auto& r : out)
    for (size_t n = 0; n < r.values.size(); ++n)
      if (auto v = core_->kv.getShared(
              fmt::format("ddpl-agents/{}/value/{}/{}/{}", r.run_id, key, r.round, n)))
        r.values[n] = std::string(v->begin(), v->end());
  return out;
}
void Services::logStats() { core_->logStats(); }

}  // namespace ddpl::rdzv::grpc_detail
