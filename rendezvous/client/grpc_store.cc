#include "rendezvous/client/grpc_store.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "common/errors.h"
#include "common/log.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/session_link.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/store_ops.h"
#include "rendezvous/protocol/write_queue.h"

namespace ddpl::rdzv {
namespace {

namespace pb = ::ddpl::rendezvous::v1;
using namespace grpc_detail;

// Time on top of a blocking call's own timeout before the client stops waiting: the
// server answers DEADLINE_EXCEEDED with the key and the numbers first.
constexpr Duration kBlockingGrace{std::chrono::seconds(5)};
// How long the destructor waits for gRPC to finish a cancelled stream.
constexpr Duration kCloseWait{std::chrono::seconds(10)};

// How many StoreStreams of one GrpcStore still exist. The store may drop its channel only when
// none does: each holds the channel through its ClientContext, and the last reference must not
// go on a gRPC callback thread. (~Channel then releases gRPC's callback queue, whose release
// joins the callback threads, including the one it runs on, and frees the queue under the
// other: "assertion failed: prior > 0", then SIGSEGV at exit.)
struct StreamCount {
  std::mutex mu;
  std::condition_variable cv;
  int live = 0;
};

// One Store.Session stream: many threads send on it, gRPC's callback threads read from it
// and hand each response to the operation waiting for its id. Only one write may be in flight,
// so requests queue behind it (WriteQueue).
//
// Holds: the stream keeps one hold from StartCall until it is broken and no write is in
// flight, so that gRPC never calls OnDone while a thread is about to StartWrite. It keeps
// itself alive (self_) until OnDone, whoever else lets go of it first.
class StoreStream : public SessionLink,
                    public grpc::ClientBidiReactor<pb::StoreRequest, pb::StoreResponse> {
 public:
  static std::shared_ptr<StoreStream> start(pb::Store::Stub* stub, const std::string& token,
                                            std::shared_ptr<StreamCount> count,
                                            std::shared_ptr<DeferredError> deferred) {
    std::shared_ptr<StoreStream> s(new StoreStream(std::move(count), std::move(deferred)));
    s->self_ = s;
    if (!token.empty()) s->ctx_->AddMetadata(kTokenHeader, token);
    // Waits for the channel to connect instead of failing at once; open() bounds the wait.
    s->ctx_->set_wait_for_ready(true);
    stub->async()->Session(s->ctx_.get(), s.get());
    s->AddHold();
    s->StartRead(&s->resp_);
    s->StartCall();
    return s;
  }

  // What the operations waiting on a stream that ended are told. The server refusing the
  // token or not knowing Session says so; anything else is a broken connection.
  static grpc::Status brokenStatus(const grpc::Status& s) {
    switch (s.error_code()) {
      case grpc::UNAUTHENTICATED:
      case grpc::PERMISSION_DENIED:
      case grpc::UNIMPLEMENTED:
        return s;
      default:
        return grpc::Status(grpc::UNAVAILABLE,
                            fmt::format("the store stream broke ({}: {})", codeName(s.error_code()),
                                        s.error_message()));
    }
  }

  Sent send(pb::StoreRequest& req, const std::shared_ptr<PendingOp>& op,
            const std::string& quiet_what = {}) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return Sent::kBroken;
    if (registerLocked(req, op, quiet_what) == Sent::kNoRoom) return Sent::kNoRoom;
    auto start = writes_.push(std::move(req), 0);
    lock.unlock();
    // Never under mu_: gRPC may run OnWriteDone on this thread before StartWrite returns.
    if (start.msg) StartWrite(start.msg);
    return Sent::kYes;
  }

  bool await(PendingOp& op, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(op.mu);
    return op.cv.wait_until(lock, deadline, [&] { return op.done; });
  }

  // Returns once gRPC is done with the stream, or after `limit`.
  void close(Duration limit) override {
    ctx_->TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [&] { return done_; });
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mu_);
      broken_ = true;
      releaseHold(lock);
      return;
    }
    onResponse(resp_);
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (ok && !broken_) {
      auto next = writes_.next();
      if (next.msg) {
        lock.unlock();
        StartWrite(next.msg);
        return;
      }
    } else {
      writes_.abandon();
    }
    if (!ok) broken_ = true;  // the read fails too, and OnDone tells the waiting operations
    releaseHold(lock);
  }

  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      final_ = s;
      writes_.abandon();
    }
    onBroken(brokenStatus(s));
    cv_.notify_all();
    auto keep = std::move(self_);  // may delete this: nothing below touches members
  }

 private:
  StoreStream(std::shared_ptr<StreamCount> count, std::shared_ptr<DeferredError> deferred)
      : SessionLink(std::move(deferred)), count_(std::move(count)) {
    std::lock_guard<std::mutex> lock(count_->mu);
    ++count_->live;
  }

 public:
  ~StoreStream() override {
    ctx_.reset();  // and with it this stream's reference to the channel, before we count out
    std::lock_guard<std::mutex> lock(count_->mu);
    if (--count_->live == 0) count_->cv.notify_all();
  }

 private:
  // A send that found the stream broken: wait for gRPC's verdict on it.
  grpc::Status whyBroken() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return brokenStatus(final_);
  }

  // Caller holds mu_ through `lock`; releases it.
  void releaseHold(std::unique_lock<std::mutex>& lock) {
    if (!broken_ || writes_.writing() || hold_released_) return;
    hold_released_ = true;
    lock.unlock();
    RemoveHold();
  }

  std::shared_ptr<StreamCount> count_;
  std::unique_ptr<grpc::ClientContext> ctx_ = std::make_unique<grpc::ClientContext>();
  pb::StoreResponse resp_;  // the read in flight; used only by the read loop
  // Under mu_ (SessionLink's), never held while calling into gRPC:
  std::condition_variable cv_;
  bool hold_released_ = false;
  bool done_ = false;
  grpc::Status final_;
  WriteQueue<pb::StoreRequest> writes_;
  std::shared_ptr<StoreStream> self_;
};

class GrpcStore : public Store {
 public:
  explicit GrpcStore(const GrpcStoreOptions& o)
      : o_(o),
        use_session_(o.use_session),
        use_socket_(o.use_session && o.socket && o.tls_ca_file.empty()) {
    // Bad options fail here, as when the channel was made here, also for a store that never
    // needs the channel.
    checkChannelSpec(channelSpec());
    auto start = Clock::now();
    // The stream's handshake is the connect check (token, limits): one round trip where a
    // unary Ping first cost another, and a unary call's set-up (issue 17: a rank's bootstrap).
    if (use_session_) open(o.connect_timeout);
    if (use_session_) return;
    auto left = std::chrono::ceil<Duration>(start + o.connect_timeout - Clock::now());
    retryConnect(o.endpoint, std::max(left, Duration(std::chrono::seconds(1))),
                 [&](Duration attempt_timeout) {
                   grpc::ClientContext ctx;
                   prepare(ctx, o_.token, attempt_timeout);
                   ctx.set_wait_for_ready(true);
                   pb::PingResponse resp;
                   auto s = stub()->Ping(&ctx, pb::PingRequest{}, &resp);
                   if (s.ok()) max_value_bytes_ = resp.max_value_bytes();
                   return s;
                 });
  }

  // Operations still waiting (a get parked on the server, on another thread) fail with a
  // NetworkError; the destructor returns once they have left.
  ~GrpcStore() override {
    flushQuiet();
    std::shared_ptr<SessionLink> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      s = std::move(stream_);
    }
    if (s) s->close(kCloseWait);
    std::unique_lock<std::mutex> lock(mu_);
    if (!idle_cv_.wait_for(lock, kCloseWait, [&] { return active_ == 0; }))
      log::warn("store client for {}: {} operations still running at destruction", o_.endpoint,
                active_);
    s = std::move(stream_);  // opened by an operation that raced with the destructor
    lock.unlock();
    if (s) s->close(kCloseWait);
    s.reset();
    std::unique_lock<std::mutex> counted(streams_->mu);
    if (!streams_->cv.wait_for(counted, kCloseWait, [&] { return streams_->live == 0; })) {
      log::warn("store client for {}: {} streams not finished at destruction", o_.endpoint,
                streams_->live);
      // Their callback threads would drop the channel's last reference: keep it for good.
      new std::shared_ptr<grpc::Channel>(channel_);  // NOLINT: deliberately never freed
    }
  }

  void set(const std::string& key, const Bytes& value) override {
    checkSize(key, value);
    pb::StoreRequest r;
    auto* req = r.mutable_set();
    req->set_key(k(key));
    req->set_value(value.data(), value.size());
    if (sendQuiet("set", key, r)) return;
    exec("set", key, o_.default_timeout, r);
  }

  Bytes get(const std::string& key, Duration timeout) override {
    pb::StoreRequest r;
    auto* req = r.mutable_get();
    req->set_key(k(key));
    req->set_timeout_ms(timeout.count());
    return bytes(exec("get", key, saturatingAdd(timeout, kBlockingGrace), r).get().value());
  }

  int64_t add(const std::string& key, int64_t delta) override {
    pb::StoreRequest r;
    auto* req = r.mutable_add();
    req->set_key(k(key));
    req->set_delta(delta);
    return exec("add", key, o_.default_timeout, r).add().value();
  }

  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    checkSize(key, desired);
    pb::StoreRequest r;
    auto* req = r.mutable_compare_set();
    req->set_key(k(key));
    req->set_expected(expected.data(), expected.size());
    req->set_desired(desired.data(), desired.size());
    return bytes(exec("compareSet", key, o_.default_timeout, r).compare_set().value());
  }

  bool check(const std::vector<std::string>& keys) override {
    pb::StoreRequest r;
    auto* req = r.mutable_check();
    for (const auto& key : keys) req->add_keys(k(key));
    return exec("check", keys, o_.default_timeout, r).check().all_present();
  }

  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    pb::StoreRequest r;
    auto* req = r.mutable_wait();
    for (const auto& key : keys) req->add_keys(k(key));
    req->set_timeout_ms(timeout.count());
    exec("wait", keys, saturatingAdd(timeout, kBlockingGrace), r);
  }

  bool deleteKey(const std::string& key) override {
    pb::StoreRequest r;
    r.mutable_delete_key()->set_key(k(key));
    return exec("deleteKey", key, o_.default_timeout, r).delete_key().existed();
  }

  int64_t numKeys() override {
    pb::StoreRequest r;
    r.mutable_num_keys()->set_prefix(o_.prefix);
    return exec("numKeys", std::string(), o_.default_timeout, r).num_keys().count();
  }

  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Duration timeout) override {
    pb::StoreRequest r;
    auto* req = r.mutable_multi_get();
    for (const auto& key : keys) req->add_keys(k(key));
    req->set_timeout_ms(timeout.count());
    auto resp = exec("multiGet", keys, saturatingAdd(timeout, kBlockingGrace), r);
    std::vector<Bytes> out;
    out.reserve(resp.multi_get().values_size());
    for (const auto& v : resp.multi_get().values()) out.push_back(bytes(v));
    return out;
  }

  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    if (keys.size() != values.size())
      throw InvalidArgument(
          fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
    pb::StoreRequest r;
    auto* req = r.mutable_multi_set();
    for (size_t i = 0; i < keys.size(); ++i) {
      checkSize(keys[i], values[i]);
      req->add_keys(k(keys[i]));
      req->add_values(values[i].data(), values[i].size());
    }
    if (sendQuiet("multiSet", keys, r)) return;
    exec("multiSet", keys, o_.default_timeout, r);
  }

 private:
  std::string k(const std::string& key) const { return o_.prefix + key; }
  static Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

  void checkSize(const std::string& key, const Bytes& value) const {
    if (static_cast<int64_t>(value.size()) > max_value_bytes_)
      throw StoreError(fmt::format(
          "RESOURCE_EXHAUSTED: value for key '{}' is {} bytes; the server at {} accepts at most "
          "{} bytes",
          key, value.size(), o_.endpoint, max_value_bytes_.load()));
  }

  // What an error message calls the operation: "get 'nccl_id/0'", "wait 'a', 'b'".
  static std::string what(const char* op, const std::string& key) {
    return key.empty() ? std::string(op) : fmt::format("{} '{}'", op, key);
  }
  static std::string what(const char* op, const std::vector<std::string>& keys) {
    return keys.empty() ? std::string(op) : fmt::format("{} {}", op, quoteKeys(keys));
  }

  // Counts the operations running, so that the destructor can wait for them to leave.
  class Active {
   public:
    explicit Active(GrpcStore* s) : s_(s) {
      std::lock_guard<std::mutex> lock(s_->mu_);
      ++s_->active_;
    }
    ~Active() {
      std::lock_guard<std::mutex> lock(s_->mu_);
      if (--s_->active_ == 0) s_->idle_cv_.notify_all();
    }

   private:
    GrpcStore* s_;
  };

  template <typename Keys>
  pb::StoreResponse exec(const char* op, const Keys& keys, Duration timeout,
                         pb::StoreRequest& req) {
    Active active(this);
    std::string w = what(op, keys);
    raiseDeferred(w);
    if (!use_session_) return unary(w, timeout, req);
    return session(w, timeout, req);
  }

  // ---- quiet sets (GrpcStoreOptions::quiet_sets) ----

  // True when `req` went out quiet; false when it must be sent the ordinary way (quiet sets
  // off, no Session stream, or kMaxQuietSets unconfirmed already).
  template <typename Keys>
  bool sendQuiet(const char* op, const Keys& keys, pb::StoreRequest& req) {
    if (!o_.quiet_sets || !use_session_) return false;
    Active active(this);
    std::string w = what(op, keys);
    raiseDeferred(w);
    auto deadline = Clock::now() + saturatingAdd(o_.default_timeout, Duration::zero());
    req.set_id(next_id_.fetch_add(1, std::memory_order_relaxed));
    for (;;) {
      auto stream = liveStream(w, deadline);
      if (!stream) return false;  // the server lost Session (downgraded)
      switch (stream->send(req, nullptr, w)) {
        case SessionLink::Sent::kYes:
          return true;
        case SessionLink::Sent::kNoRoom:
          return false;
        case SessionLink::Sent::kBroken:
          break;  // nothing was sent: try a new stream
      }
    }
  }

  // Throws the failure of an earlier quiet set, once.
  void raiseDeferred(const std::string& op) {
    if (!deferred_->any.load()) return;
    grpc::Status s;
    std::string earlier;
    if (deferred_->take(&s, &earlier))
      throwStatus(s, o_.endpoint,
                  fmt::format("{} (sent earlier without waiting; reported by {})", earlier, op));
  }

  // Before the store goes: the quiet sets still unconfirmed must reach the server, so that a
  // rank that sets its key and exits does not lose it. A ping's answer confirms them all.
  void flushQuiet() {
    std::shared_ptr<SessionLink> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = stream_;
    }
    if (s && s->hasUnconfirmed()) {
      auto op = std::make_shared<PendingOp>();
      pb::StoreRequest ping;
      ping.set_id(next_id_.fetch_add(1, std::memory_order_relaxed));
      ping.mutable_ping();
      if (s->send(ping, op) == SessionLink::Sent::kYes) {
        if (!s->await(*op, Clock::now() + kCloseWait))
          log::warn("store client for {}: sets not confirmed by the server within {}", o_.endpoint,
                    describe(kCloseWait));
      }
    }
    grpc::Status st;
    std::string earlier;
    if (deferred_->take(&st, &earlier))
      log::warn("store client for {}: {} failed and no later operation reported it: {}: {}",
                o_.endpoint, earlier, codeName(st.error_code()), st.error_message());
  }

  // ---- the Session stream (default) ----

  pb::StoreResponse session(const std::string& op, Duration timeout, pb::StoreRequest& req) {
    auto deadline = Clock::now() + saturatingAdd(timeout, Duration::zero());
    std::shared_ptr<PendingOp> pending = std::make_shared<PendingOp>();
    uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    req.set_id(id);
    std::shared_ptr<SessionLink> stream;
    for (;;) {
      stream = liveStream(op, deadline);
      if (!stream) return unary(op, timeout, req);  // the server lost Session (downgraded)
      // A stream that broke before the request went out: nothing was sent, so it is safe to
      // send it again on a new one.
      if (stream->send(req, pending) == SessionLink::Sent::kYes) break;
    }
    if (!stream->await(*pending, deadline)) {
      stream->forget(id);
      throwStatus(grpc::Status(grpc::DEADLINE_EXCEEDED,
                               fmt::format("no answer within {}", describe(timeout))),
                  o_.endpoint, op);
    }
    if (!pending->status.ok()) throwStatus(pending->status, o_.endpoint, op);
    if (pending->resp.has_error()) {
      const auto& e = pending->resp.error();
      throwStatus(grpc::Status(static_cast<grpc::StatusCode>(e.code()), e.message()), o_.endpoint,
                  op);
    }
    return std::move(pending->resp);
  }

  // The open stream, or a new one when the last one broke (a restarted server, a dropped
  // connection). Throws NetworkError naming the endpoint when none opens in time.
  std::shared_ptr<SessionLink> liveStream(const std::string& op, Clock::time_point deadline) {
    auto current = [&]() -> std::shared_ptr<SessionLink> {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_)
        throwStatus(grpc::Status(grpc::UNAVAILABLE, "the store client is being destroyed"),
                    o_.endpoint, op);
      return stream_ && !stream_->broken() ? stream_ : nullptr;
    };
    if (auto s = current()) return s;
    std::lock_guard<std::mutex> reopening(open_mu_);  // one thread reopens, the others wait
    if (auto s = current()) return s;
    auto left = std::chrono::ceil<Duration>(deadline - Clock::now());
    if (left.count() <= 0)
      throwStatus(grpc::Status(grpc::DEADLINE_EXCEEDED, "no time left to reopen the store stream"),
                  o_.endpoint, op);
    log::debug("store stream to {} broke; reopening for {}", o_.endpoint, op);
    // The connect timeout (the launcher's read timeout) covers reconnecting too: a restarted
    // server has that long to come back.
    return open(std::min(left, o_.connect_timeout));
  }

  std::shared_ptr<SessionLink> open(Duration timeout) {
    std::shared_ptr<SessionLink> opened;
    retryConnect(o_.endpoint, timeout, [&](Duration attempt_timeout) {
      int64_t limit = max_value_bytes_;
      if (use_socket_) {
        grpc::Status st =
            openWireLink(o_.endpoint, o_.token, attempt_timeout, deferred_, &opened, &limit);
        if (st.ok()) max_value_bytes_ = limit;
        if (st.error_code() != grpc::UNIMPLEMENTED) return st;
        log::info("rendezvous server {} does not serve the store socket ({}); using gRPC",
                  o_.endpoint, st.error_message());
        use_socket_ = false;
      }
      auto s = StoreStream::start(stub(), o_.token, streams_, deferred_);
      grpc::Status st = s->handshake(attempt_timeout, &limit, {});
      if (st.ok()) max_value_bytes_ = limit;
      if (st.ok()) opened = std::move(s);
      if (st.error_code() == grpc::UNIMPLEMENTED) return grpc::Status::OK;
      return st;
    });
    if (!opened) {
      // A server from before Session: one unary call per operation, as before.
      log::info("rendezvous server {} has no store Session stream; using unary calls", o_.endpoint);
      use_session_ = false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = opened;
    return opened;
  }

  // ---- one unary call per operation (use_session = false) ----

  pb::StoreResponse unary(const std::string& op, Duration timeout, const pb::StoreRequest& r) {
    pb::StoreResponse out;
    bool known = visitStoreOp(r.op_case(), [&](auto o) {
      using Op = decltype(o);
      call(op, timeout, Op::kStubMethod, Op::request(r), *Op::response(out));
    });
    if (!known) throw InvalidArgument(fmt::format("{}: no operation", op));
    return out;
  }

  template <typename Req, typename Resp>
  void call(const std::string& op, Duration timeout,
            grpc::Status (pb::Store::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
            const Req& req, Resp& resp) {
    grpc::ClientContext ctx;
    prepare(ctx, o_.token, timeout);
    grpc::Status s = ((*stub()).*method)(&ctx, req, &resp);
    if (!s.ok()) throwStatus(s, o_.endpoint, op);
  }

  GrpcStoreOptions o_;
  // The gRPC channel, made when first needed: a store on the socket never needs it, and
  // making one costs more than the whole socket connect (1,024 ranks connecting at once).
  ChannelSpec channelSpec() const {
    return {o_.endpoint, o_.tls_ca_file, o_.tls_cert_file, o_.tls_key_file, kDefaultMaxValueBytes};
  }
  pb::Store::Stub* stub() {
    std::call_once(channel_made_, [&] {
      channel_ = makeChannel(channelSpec());
      stub_ = pb::Store::NewStub(channel_);
    });
    return stub_.get();
  }

  std::once_flag channel_made_;
  std::shared_ptr<grpc::Channel> channel_;  // set once by stub()
  std::unique_ptr<pb::Store::Stub> stub_;
  std::atomic<int64_t> max_value_bytes_{kDefaultMaxValueBytes};  // the server's, from connecting
  std::atomic<bool> use_session_{true};
  // Try the store socket first (GrpcStoreOptions::socket); off once the server showed it has
  // none.
  std::atomic<bool> use_socket_{false};
  std::atomic<uint64_t> next_id_{1};
  std::shared_ptr<DeferredError> deferred_ = std::make_shared<DeferredError>();
  std::mutex open_mu_;  // held while reopening the stream
  std::mutex mu_;       // guards the four below
  std::shared_ptr<SessionLink> stream_;
  std::shared_ptr<StreamCount> streams_ = std::make_shared<StreamCount>();
  bool closing_ = false;
  int active_ = 0;
  std::condition_variable idle_cv_;
};

}  // namespace

std::unique_ptr<Store> connectGrpcStore(const GrpcStoreOptions& options) {
  return std::make_unique<GrpcStore>(options);
}

}  // namespace ddpl::rdzv
