#include "launcher/membership/etcd/etcd_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "etcd/rpc.grpc.pb.h"
#include "rendezvous/protocol/grpc_common.h"

namespace ddpl::launcher {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
namespace pb = etcdserverpb;

std::string etcdPrefixEnd(const std::string& prefix) {
  // etcd's rule (clientv3.GetPrefixRangeEnd): the prefix with its last byte below 0xff
  // incremented and the rest dropped; "\0" (every key) when there is none.
  std::string end = prefix;
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

namespace {

struct Endpoint {
  std::string name;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Auth::Stub> auth;
};

// Errors worth another endpoint (or another try on the same one): the member is down or
// unreachable, or it has no leader for the moment (etcd answers UNAVAILABLE: "etcdserver: no
// leader", "leader changed", "request timed out").
bool retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// etcd's answers that mean the credentials are missing or wrong.
bool authFailure(const grpc::Status& s) {
  const std::string& m = s.error_message();
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         m.find("authentication failed") != std::string::npos ||
         m.find("user name is empty") != std::string::npos ||
         m.find("invalid auth token") != std::string::npos ||
         m.find("permission denied") != std::string::npos;
}

EtcdKv fromPb(const mvccpb::KeyValue& kv) {
  EtcdKv out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

void toPb(const EtcdOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case EtcdOp::Kind::kPut: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      p->set_value(op.value);
      p->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::kDelete:
      out->mutable_request_delete_range()->set_key(op.key);
      break;
    case EtcdOp::Kind::kDeletePrefix: {
      auto* d = out->mutable_request_delete_range();
      d->set_key(op.key);
      d->set_range_end(etcdPrefixEnd(op.key));
      break;
    }
  }
}

// gRPC takes deadlines on the system clock only; ours are steady.
std::chrono::system_clock::time_point wallDeadline(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

std::string describe(milliseconds d) { return fmt::format("{:.1f}s", d.count() / 1000.0); }

}  // namespace

struct EtcdClient::Impl {
  EtcdOptions o;
  std::vector<Endpoint> eps;
  std::atomic<size_t> current{0};  // the endpoint that answered last: tried first
  std::mutex token_mu;
  std::string token;

  // Runs `fn` on one endpoint after another until one answers, for at most `timeout`.
  // Throws with every endpoint's last error when none does.
  grpc::Status invoke(const std::string& op, milliseconds timeout,
                      const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& fn,
                      bool with_token = true) {
    auto start = Clock::now();
    auto deadline = start + timeout;
    std::vector<std::string> last_error(eps.size());
    size_t first = current.load();
    bool reauthenticated = false;
    milliseconds backoff{50};
    // A dead member must not eat the whole budget: each try gets a share of it (at least
    // 2s, the time a healthy member needs to answer through a leader election).
    milliseconds per_try = std::max(milliseconds(2000), timeout / static_cast<int>(eps.size()));
    for (size_t attempt = 0;; ++attempt) {
      size_t i = (first + attempt) % eps.size();
      auto now = Clock::now();
      if (now >= deadline) break;
      if (attempt > 0 && attempt % eps.size() == 0) {
        // Every endpoint failed once: give the cluster a moment (an election) before the next turn.
        std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
        backoff = std::min(backoff * 2, milliseconds(1000));
        now = Clock::now();
        if (now >= deadline) break;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(wallDeadline(std::min<Clock::time_point>(deadline, now + per_try)));
      if (with_token) {
        std::lock_guard<std::mutex> lock(token_mu);
        if (!token.empty()) ctx.AddMetadata("token", token);
      }
      grpc::Status s = fn(eps[i], ctx);
      if (s.ok()) {
        current = i;
        return s;
      }
      if (with_token && !o.user.empty() && !reauthenticated &&
          s.error_message().find("invalid auth token") != std::string::npos) {
        // Simple tokens expire (etcd's --auth-token-ttl, 300s by default): get a new one.
        reauthenticated = true;
        authenticate(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
        --attempt;
        continue;
      }
      if (authFailure(s))
        throw AuthError(
            fmt::format("etcd at {} refused {}: {}{}", eps[i].name, op, s.error_message(),
                        o.user.empty() ? " (this etcd has auth enabled: give --rdzv-conf user= and "
                                         "password_file=)"
                                       : fmt::format(" (as user '{}')", o.user)));
      if (!retryable(s))
        throw StoreError(fmt::format("etcd at {}: {} failed: {} ({})", eps[i].name, op,
                                     s.error_message(),
                                     rdzv::grpc_detail::codeName(s.error_code())));
      last_error[i] = fmt::format("{}: {} ({})", eps[i].name, s.error_message(),
                                  rdzv::grpc_detail::codeName(s.error_code()));
    }
    std::string why;
    for (size_t i = 0; i < eps.size(); ++i)
      why += (why.empty() ? "" : "; ") +
             (last_error[i].empty() ? eps[i].name + ": not tried (no time left)" : last_error[i]);
    throw NetworkError(
        fmt::format("etcd {}: no endpoint answered within {} ({})", op, describe(timeout), why));
  }

  void authenticate(milliseconds timeout) {
    pb::AuthenticateRequest req;
    req.set_name(o.user);
    req.set_password(o.password);
    pb::AuthenticateResponse resp;
    invoke(
        "Authenticate", timeout,
        [&](Endpoint& ep, grpc::ClientContext& ctx) {
          return ep.auth->Authenticate(&ctx, req, &resp);
        },
        false);
    std::lock_guard<std::mutex> lock(token_mu);
    token = resp.token();
  }

  std::string tokenNow() {
    std::lock_guard<std::mutex> lock(token_mu);
    return token;
  }

  pb::RangeResponse range(const std::string& key, const std::string& range_end) {
    pb::RangeRequest req;
    req.set_key(key);
    req.set_range_end(range_end);
    pb::RangeResponse resp;
    invoke("Range", o.call_timeout,
           [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Range(&ctx, req, &resp); });
    return resp;
  }
};

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)), impl_(new Impl) {
  if (options_.endpoints.empty()) throw InvalidArgument("etcd: no endpoint given");
  impl_->o = options_;
  for (const auto& name : options_.endpoints) {
    rdzv::grpc_detail::ChannelSpec spec;
    spec.endpoint = name;
    spec.tls_ca_file = options_.ca_file;
    spec.tls_cert_file = options_.cert_file;
    spec.tls_key_file = options_.key_file;
    Endpoint ep;
    ep.name = name;
    ep.channel = rdzv::grpc_detail::makeChannel(spec);
    ep.kv = pb::KV::NewStub(ep.channel);
    ep.watch = pb::Watch::NewStub(ep.channel);
    ep.lease = pb::Lease::NewStub(ep.channel);
    ep.auth = pb::Auth::NewStub(ep.channel);
    impl_->eps.push_back(std::move(ep));
  }
  // Proves the whole chain (reachable, TLS, credentials) before any rendezvous starts: one
  // linearizable read of nothing in particular.
  if (!options_.user.empty()) impl_->authenticate(options_.connect_timeout);
  pb::RangeRequest req;
  req.set_key("/");
  req.set_count_only(true);
  pb::RangeResponse resp;
  auto check = [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Range(&ctx, req, &resp);
  };
  try {
    impl_->invoke("connect (Range)", options_.connect_timeout, check);
  } catch (const NetworkError& e) {
    // A member this client is connected to (TCP and HTTP/2 up) that has not answered yet is
    // reachable, only slow: 1024 agents starting at once beside one etcd member on 2 cores
    // had 15-446 of them fail here (issue 14). It gets the call timeout to answer; what
    // cannot be reached still fails within the connect timeout.
    std::string connected;
    for (auto& ep : impl_->eps)
      if (ep.channel->GetState(false) == GRPC_CHANNEL_READY)
        connected += (connected.empty() ? "" : ", ") + ep.name;
    if (connected.empty() || options_.call_timeout <= options_.connect_timeout) throw;
    log::warn("{}; connected to {}: waiting up to {} for an answer", e.what(), connected,
              describe(options_.call_timeout));
    impl_->invoke("connect (Range)", options_.call_timeout, check);
  }
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoints() const {
  std::string out;
  for (const auto& e : options_.endpoints) out += (out.empty() ? "" : ", ") + e;
  return out;
}

std::optional<EtcdKv> EtcdClient::get(const std::string& key, int64_t* revision) {
  auto resp = impl_->range(key, "");
  if (revision) *revision = resp.header().revision();
  if (resp.kvs_size() == 0) return std::nullopt;
  return fromPb(resp.kvs(0));
}

std::vector<EtcdKv> EtcdClient::getPrefix(const std::string& prefix, int64_t* revision) {
  auto resp = impl_->range(prefix, etcdPrefixEnd(prefix));
  if (revision) *revision = resp.header().revision();
  std::vector<EtcdKv> out;
  for (const auto& kv : resp.kvs()) out.push_back(fromPb(kv));
  return out;
}

EtcdRangeResult EtcdClient::range(const EtcdRange& r) {
  pb::RangeRequest req;
  req.set_key(r.key);
  req.set_range_end(r.range_end);
  req.set_limit(r.limit);
  req.set_count_only(r.count_only);
  req.set_keys_only(r.keys_only);
  if (r.oldest_first) {
    req.set_sort_order(pb::RangeRequest::ASCEND);
    req.set_sort_target(pb::RangeRequest::CREATE);
  }
  req.set_min_mod_revision(r.min_mod_revision);
  pb::RangeResponse resp;
  impl_->invoke("Range", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Range(&ctx, req, &resp);
  });
  EtcdRangeResult out;
  out.count = resp.count();
  out.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) out.kvs.push_back(fromPb(kv));
  return out;
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  impl_->invoke("Put", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Put(&ctx, req, &resp);
  });
  return resp.header().revision();
}

int64_t EtcdClient::deletePrefix(const std::string& prefix) {
  pb::DeleteRangeRequest req;
  req.set_key(prefix);
  req.set_range_end(etcdPrefixEnd(prefix));
  pb::DeleteRangeResponse resp;
  impl_->invoke("DeleteRange", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->DeleteRange(&ctx, req, &resp);
  });
  return resp.deleted();
}

EtcdTxnResult EtcdClient::txn(const std::vector<EtcdCompare>& compare,
                              const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure) {
  pb::TxnRequest req;
  for (const auto& c : compare) {
    auto* pc = req.add_compare();
    pc->set_key(c.key);
    switch (c.result) {
      case EtcdCompare::Result::kEqual:
        pc->set_result(pb::Compare::EQUAL);
        break;
      case EtcdCompare::Result::kNotEqual:
        pc->set_result(pb::Compare::NOT_EQUAL);
        break;
      case EtcdCompare::Result::kLess:
        pc->set_result(pb::Compare::LESS);
        break;
      case EtcdCompare::Result::kGreater:
        pc->set_result(pb::Compare::GREATER);
        break;
    }
    if (!c.range_end.empty()) pc->set_range_end(c.range_end);
    switch (c.target) {
      case EtcdCompare::Target::kMod:
        pc->set_target(pb::Compare::MOD);
        pc->set_mod_revision(c.number);
        break;
      case EtcdCompare::Target::kCreate:
        pc->set_target(pb::Compare::CREATE);
        pc->set_create_revision(c.number);
        break;
      case EtcdCompare::Target::kVersion:
        pc->set_target(pb::Compare::VERSION);
        pc->set_version(c.number);
        break;
      case EtcdCompare::Target::kValue:
        pc->set_target(pb::Compare::VALUE);
        pc->set_value(c.value);
        break;
    }
  }
  for (const auto& op : success) toPb(op, req.add_success());
  for (const auto& op : failure) toPb(op, req.add_failure());
  pb::TxnResponse resp;
  impl_->invoke("Txn", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.kv->Txn(&ctx, req, &resp);
  });
  return {resp.succeeded(), resp.header().revision()};
}

int64_t EtcdClient::add(const std::string& key, int64_t delta) {
  for (int i = 0; i < 1000; ++i) {
    auto kv = get(key);
    int64_t value = 0;
    if (kv) {
      try {
        value = std::stoll(kv->value);
      } catch (const std::exception&) {
        throw StoreError(fmt::format("etcd key '{}' holds '{}', not a counter", key, kv->value));
      }
    }
    if (delta == 0) return value;
    // Unchanged since we read it (mod revision; 0 for a key that does not exist yet).
    auto r = txn({{key, EtcdCompare::Target::kMod, kv ? kv->mod_revision : 0}},
                 {{EtcdOp::Kind::kPut, key, std::to_string(value + delta)}});
    if (r.succeeded) return value + delta;
    // Lost to another writer: a short random pause, growing with the conflicts, so that
    // writers racing for one counter do not retry in lockstep.
    thread_local std::minstd_rand rng(std::random_device{}());
    int cap = std::min(50, 2 * (i + 1));
    std::this_thread::sleep_for(milliseconds(std::uniform_int_distribution<int>(0, cap)(rng)));
  }
  throw StoreError(fmt::format("etcd counter '{}': 1000 compare-and-swap conflicts in a row", key));
}

int64_t EtcdClient::grantLease(std::chrono::seconds ttl) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  pb::LeaseGrantResponse resp;
  impl_->invoke("LeaseGrant", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
    return ep.lease->LeaseGrant(&ctx, req, &resp);
  });
  if (!resp.error().empty()) throw StoreError("etcd LeaseGrant: " + resp.error());
  return resp.id();
}

void EtcdClient::revokeLease(int64_t id) {
  pb::LeaseRevokeRequest req;
  req.set_id(id);
  pb::LeaseRevokeResponse resp;
  try {
    impl_->invoke("LeaseRevoke", options_.call_timeout,
                  [&](Endpoint& ep, grpc::ClientContext& ctx) {
                    return ep.lease->LeaseRevoke(&ctx, req, &resp);
                  });
  } catch (const StoreError& e) {
    // Already gone (expired): nothing left to revoke.
    if (std::string(e.what()).find("lease not found") == std::string::npos) throw;
  }
}

int64_t EtcdClient::keepAliveOnce(int64_t id) {
  int64_t ttl = 0;
  impl_->invoke(
      "LeaseKeepAlive", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
        auto stream = ep.lease->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(id);
        pb::LeaseKeepAliveResponse resp;
        if (!stream->Write(req) || !stream->Read(&resp)) return stream->Finish();
        ttl = resp.ttl();
        ctx.TryCancel();  // one keep-alive per stream: bounded, and free to use another member next
        stream->Finish();
        return grpc::Status::OK;
      });
  return ttl;
}

void EtcdCancel::cancel() {
  std::function<void()> abort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    abort = abort_;
  }
  if (abort) abort();
}

bool EtcdCancel::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

namespace {

// What a keeper and its streams share: the streams poke it when an answer arrives or they end,
// and count themselves out when gRPC is done with them (the keeper waits for that before its
// client may go: each stream holds the client's channel).
struct KeeperSignal {
  std::mutex mu;
  std::condition_variable cv;
  bool poked = false;
  bool stop = false;
  int live = 0;  // streams gRPC is not done with

  void poke() {
    {
      std::lock_guard<std::mutex> lock(mu);
      poked = true;
    }
    cv.notify_all();
  }
};

// One LeaseKeepAlive stream, on gRPC's callback API: nothing here blocks. etcd handles a
// stream's requests one at a time, in order, so each answer belongs to the oldest unanswered
// request: etcd renewed the lease after that request was sent, which bounds when it expires.
class LeaseStream
    : public grpc::ClientBidiReactor<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> {
 public:
  struct Answer {
    int64_t id = 0, ttl = 0;
    Clock::time_point sent;
  };

  static std::shared_ptr<LeaseStream> start(Endpoint& ep, const std::string& token,
                                            std::shared_ptr<KeeperSignal> signal) {
    std::shared_ptr<LeaseStream> s(new LeaseStream(std::move(signal), ep.name));
    s->self_ = s;
    if (!token.empty()) s->ctx_.AddMetadata("token", token);
    ep.lease->async()->LeaseKeepAlive(&s->ctx_, s.get());
    s->AddHold();  // released once broken with no write in flight: OnDone cannot race a write
    s->StartRead(&s->resp_);
    s->StartCall();
    return s;
  }

  // Sends a keep-alive of `id`; false when the stream is broken or a write is still in flight
  // (nothing sent).
  bool send(int64_t id) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_ || writing_) return false;
    writing_ = true;
    req_.set_id(id);
    sent_.push_back({id, 0, Clock::now()});
    lock.unlock();
    StartWrite(&req_);  // never under mu_: gRPC may run OnWriteDone before it returns
    return true;
  }

  std::vector<Answer> takeAnswers() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Answer> out(answers_.begin(), answers_.end());
    answers_.clear();
    return out;
  }

  // When the oldest request still unanswered was sent; none: every one was answered.
  std::optional<Clock::time_point> oldestUnanswered() {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent_.empty()) return std::nullopt;
    return sent_.front().sent;
  }

  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

  std::string why() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) return endpoint_ + ": the stream broke";
    return fmt::format("{}: {} ({})", endpoint_,
                       final_.ok() ? "etcd closed the stream" : final_.error_message(),
                       rdzv::grpc_detail::codeName(final_.error_code()));
  }

  void cancel() { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mu_);
      broken_ = true;
      releaseHold(lock);
      signal_->poke();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      Answer a{resp_.id(), resp_.ttl(), Clock::now()};
      if (!sent_.empty()) {
        a.sent = sent_.front().sent;
        sent_.pop_front();
      }
      // Bounded whatever the server sends: the keeper takes them at every wake-up.
      if (answers_.size() >= 64) answers_.pop_front();
      answers_.push_back(a);
    }
    signal_->poke();
    resp_.Clear();
    StartRead(&resp_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) broken_ = true;
    releaseHold(lock);
    if (!ok) signal_->poke();
  }

  void OnDone(const grpc::Status& s) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      broken_ = true;
      final_ = s;
    }
    auto signal = signal_;
    auto keep = std::move(self_);  // may delete this: nothing below touches members
    keep.reset();
    {
      std::lock_guard<std::mutex> lock(signal->mu);
      --signal->live;
      signal->poked = true;
    }
    signal->cv.notify_all();
  }

 private:
  LeaseStream(std::shared_ptr<KeeperSignal> signal, std::string endpoint)
      : signal_(std::move(signal)), endpoint_(std::move(endpoint)) {
    std::lock_guard<std::mutex> lock(signal_->mu);
    ++signal_->live;
  }

  // Caller holds mu_ through `lock`; releases it.
  void releaseHold(std::unique_lock<std::mutex>& lock) {
    if (!broken_ || writing_ || hold_released_) return;
    hold_released_ = true;
    lock.unlock();
    RemoveHold();
  }

  std::shared_ptr<KeeperSignal> signal_;
  std::string endpoint_;
  grpc::ClientContext ctx_;
  pb::LeaseKeepAliveRequest req_;    // the write in flight's
  pb::LeaseKeepAliveResponse resp_;  // the read in flight's
  std::mutex mu_;                    // guards what follows; never held while calling into gRPC
  bool broken_ = false, writing_ = false, hold_released_ = false, done_ = false;
  grpc::Status final_;
  std::deque<Answer> sent_;  // unanswered, oldest first (ttl unused); at most one per second
  std::deque<Answer> answers_;
  std::shared_ptr<LeaseStream> self_;
};

class LeaseKeeperImpl : public EtcdLeaseKeeper {
 public:
  LeaseKeeperImpl(EtcdClient::Impl* impl, int64_t id, std::chrono::seconds ttl,
                  std::function<int64_t(int64_t)> expired)
      : impl_(impl), expired_(std::move(expired)), signal_(std::make_shared<KeeperSignal>()) {
    setLease(id, ttl);
    thread_ = std::thread([this] { run(); });
  }

  ~LeaseKeeperImpl() override {
    {
      std::lock_guard<std::mutex> lock(signal_->mu);
      signal_->stop = true;
    }
    signal_->cv.notify_all();
    if (thread_.get_id() == std::this_thread::get_id()) {
      // Destroyed from its own `expired` callback: run() returns once it does, touching
      // nothing of ours after it sees stop.
      thread_.detach();
    } else if (thread_.joinable()) {
      thread_.join();
    }
  }

  void keep(int64_t id, std::chrono::seconds ttl) override {
    {
      std::lock_guard<std::mutex> lock(signal_->mu);
      setLease(id, ttl);
      signal_->poked = true;
    }
    signal_->cv.notify_all();
  }

 private:
  // Caller holds signal_->mu (or is the constructor).
  void setLease(int64_t id, std::chrono::seconds ttl) {
    auto now = Clock::now();
    next_.id = id;
    next_.ttl = std::max<std::chrono::seconds>(ttl, std::chrono::seconds(1));
    next_.alive_until = now + next_.ttl;  // granted just before: its TTL runs from then
    next_.send_at = now + std::chrono::duration_cast<milliseconds>(next_.ttl) / 3;
    changed_ = true;
  }

  struct Lease {
    int64_t id = 0;
    std::chrono::seconds ttl{1};
    Clock::time_point alive_until, send_at;
  };

  void run() {
    std::shared_ptr<KeeperSignal> signal = signal_;  // outlives us when detached
    Lease l;
    std::shared_ptr<LeaseStream> stream;
    size_t ep = impl_->current.load();
    const size_t n = impl_->eps.size();
    milliseconds backoff{100};    // between reopenings of streams that broke, up to 1 s
    Clock::time_point reopen_at;  // no stream opened before it
    bool due = false;             // a keep-alive is due and not answered yet
    bool warned = false;          // that the lease may have expired, once per outage
    std::string last_error = "no answer yet";
    bool stopped = false;
    while (!stopped) {
      auto now = Clock::now();
      // When something is next to do: send, give up a silent stream, reopen one, warn.
      Clock::time_point wake = due ? now + std::chrono::seconds(1) : l.send_at;
      if (due && stream) {
        if (auto oldest = stream->oldestUnanswered())
          wake = std::min(wake, *oldest + stuckAfter(l));
      }
      if (due && !stream) wake = std::min(wake, reopen_at);
      if (!warned) wake = std::min(wake, l.alive_until);
      {
        std::unique_lock<std::mutex> lock(signal->mu);
        signal->cv.wait_until(lock, std::max(wake, now),
                              [&] { return signal->stop || signal->poked; });
        if (signal->stop) break;
        signal->poked = false;
        if (changed_) {
          l = next_;
          changed_ = false;
          due = false;
          warned = false;
        }
      }
      now = Clock::now();
      if (stream) {
        for (const auto& a : stream->takeAnswers()) {
          if (a.id != l.id) continue;  // for the lease before the last keep()
          if (a.ttl <= 0) {
            due = false;
            int64_t fresh = expire(l.id);
            // Stopped meanwhile (perhaps destroyed by the callback): touch no member.
            std::lock_guard<std::mutex> lock(signal->mu);
            stopped = signal->stop;
            if (stopped || changed_) break;  // keep() came meanwhile: the loop takes it
            if (fresh != 0 && fresh != l.id) {
              setLease(fresh, l.ttl);
              l = next_;
              changed_ = false;
              warned = false;
            } else {
              // Not replaced (etcd refused a new one): ask again in a second.
              l.send_at = Clock::now() + std::chrono::seconds(1);
            }
            break;
          }
          l.ttl = std::chrono::seconds(a.ttl);
          l.alive_until = std::max(l.alive_until, a.sent + l.ttl);
          l.send_at = now + std::chrono::duration_cast<milliseconds>(l.ttl) / 3;
          due = false;
          backoff = milliseconds(100);
          if (warned)
            log::info("etcd keep-alive: lease {:x} renewed again ({}s left)", l.id, a.ttl);
          warned = false;
        }
        if (stopped) break;
        if (stream->broken()) {
          last_error = stream->why();
          log::debug("etcd keep-alive stream broke ({}): reopening on the next endpoint",
                     last_error);
          stream.reset();
          ++ep;
          reopen_at = now + backoff;
          backoff = std::min(backoff * 2, milliseconds(1000));
        }
      }
      if (!due && now >= l.send_at) due = true;
      if (due && stream) {
        auto oldest = stream->oldestUnanswered();
        if (oldest && now - *oldest >= stuckAfter(l)) {
          last_error =
              fmt::format("{}: no answer for {}", impl_->eps[ep % n].name,
                          describe(std::chrono::duration_cast<milliseconds>(now - *oldest)));
          log::debug("etcd keep-alive: {}; moving on to the next endpoint", last_error);
          stream->cancel();
          stream.reset();
          ++ep;
          reopen_at = now;
        }
      }
      if (due && !stream && now >= reopen_at)
        stream = LeaseStream::start(impl_->eps[ep % n], impl_->tokenNow(), signal);
      // One request in flight per stream: a later one would be answered after it anyway.
      if (due && stream && !stream->oldestUnanswered()) stream->send(l.id);
      if (!warned && now >= l.alive_until) {
        warned = true;
        log::warn(
            "etcd keep-alive: lease {:x} not renewed within its TTL of {}s (last: {}); it "
            "may have expired, still trying",
            l.id, l.ttl.count(), last_error);
      }
    }
    if (stream) stream->cancel();
    stream.reset();
    // Every stream holds the client's channel: gRPC must be done with them before the client
    // may go. Cancelled, they end within milliseconds.
    std::unique_lock<std::mutex> lock(signal->mu);
    if (!signal->cv.wait_for(lock, std::chrono::seconds(10), [&] { return signal->live == 0; }))
      log::warn("etcd keep-alive: {} stream(s) not finished 10s after cancelling", signal->live);
  }

  // How long an unanswered keep-alive waits on a stream that has not broken before the keeper
  // tries another. A live stream delivers in order, so only another member can answer sooner:
  // 2 s with several endpoints (a member answers through an election within it), the TTL
  // with one (a stream wedged for good is reopened once per TTL at most).
  milliseconds stuckAfter(const Lease& l) const {
    return impl_->eps.size() > 1 ? milliseconds(2000)
                                 : std::chrono::duration_cast<milliseconds>(l.ttl);
  }

  int64_t expire(int64_t id) {
    try {
      return expired_(id);
    } catch (const std::exception& e) {
      log::warn("etcd keep-alive: after lease {:x} expired: {}", id, e.what());
      return 0;
    }
  }

  EtcdClient::Impl* impl_;
  std::function<int64_t(int64_t)> expired_;
  std::shared_ptr<KeeperSignal> signal_;
  Lease next_;            // guarded by signal_->mu: set by keep(), taken by run()
  bool changed_ = false;  // guarded by signal_->mu
  std::thread thread_;
};

class WatchImpl : public EtcdWatch {
 public:
  WatchImpl(EtcdClient::Impl* impl, std::vector<std::pair<std::string, std::string>> ranges,
            int64_t start, std::function<void(const std::vector<EtcdEvent>&)> events,
            std::function<void(const std::string&)> failed)
      : impl_(impl),
        ranges_(std::move(ranges)),
        next_(ranges_.size(), start),
        events_(std::move(events)),
        failed_(std::move(failed)) {
    thread_ = std::thread([this] { run(); });
  }

  ~WatchImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (ctx_) ctx_->TryCancel();
    }
    // Destroyed from its own callback (the round ended and the owner moves on): the thread
    // returns on its own once the callback does, and touches nothing of ours after `stop_`.
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else if (thread_.joinable())
      thread_.join();
  }

 private:
  void run() {
    auto broken_since = Clock::now();
    std::string last_error;
    size_t i = impl_->current.load();
    milliseconds backoff{50};
    while (true) {
      Endpoint& ep = impl_->eps[i % impl_->eps.size()];
      grpc::ClientContext ctx;
      std::string token = impl_->tokenNow();
      if (!token.empty()) ctx.AddMetadata("token", token);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        ctx_ = &ctx;
      }
      auto stream = ep.watch->Watch(&ctx);
      // One watcher per range on the one stream, numbered by us (etcd 3.4's watch_id) so that
      // each resumes from its own next revision: their events need not interleave in order.
      bool written = true;
      for (size_t w = 0; w < ranges_.size(); ++w) {
        pb::WatchRequest req;
        auto* c = req.mutable_create_request();
        c->set_key(ranges_[w].first);
        c->set_range_end(ranges_[w].second);
        c->set_start_revision(next_[w]);
        c->set_watch_id(static_cast<int64_t>(w));
        written = written && stream->Write(req);
      }
      pb::WatchResponse resp;
      std::string canceled;
      bool created = false;
      if (written) {
        while (stream->Read(&resp)) {
          if (resp.created()) {
            created = true;
            broken_since = Clock::now();
            backoff = milliseconds(50);
          }
          if (resp.canceled()) {
            canceled = resp.compact_revision() > 0
                           ? fmt::format("revisions before {} were compacted away",
                                         resp.compact_revision())
                           : "etcd cancelled the watch: " + resp.cancel_reason();
            break;
          }
          if (resp.events_size() == 0) continue;
          std::vector<EtcdEvent> out;
          for (const auto& e : resp.events()) {
            EtcdEvent ev;
            ev.type = e.type() == mvccpb::Event::DELETE ? EtcdEvent::Type::kDelete
                                                        : EtcdEvent::Type::kPut;
            ev.kv = fromPb(e.kv());
            auto w = static_cast<size_t>(resp.watch_id());
            if (w < next_.size()) next_[w] = std::max(next_[w], e.kv().mod_revision() + 1);
            out.push_back(std::move(ev));
          }
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) break;
          }
          events_(out);
        }
      }
      if (!canceled.empty()) ctx.TryCancel();
      grpc::Status s = stream->Finish();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ctx_ = nullptr;
        if (stop_) return;
      }
      if (!canceled.empty()) {
        failed_(canceled);
        return;
      }
      (void)created;
      last_error = fmt::format("{}: {}", ep.name, s.ok() ? "stream closed" : s.error_message());
      if (Clock::now() - broken_since > impl_->o.connect_timeout) {
        failed_(
            fmt::format("the watch on etcd broke and no endpoint took it over within {} "
                        "(last: {})",
                        describe(impl_->o.connect_timeout), last_error));
        return;
      }
      log::debug("etcd watch on '{}' broke ({}): resuming from revision {} on the next endpoint",
                 ranges_.front().first, last_error, next_.front());
      ++i;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }

  EtcdClient::Impl* impl_;
  std::vector<std::pair<std::string, std::string>> ranges_;
  std::vector<int64_t> next_;  // per range
  std::function<void(const std::vector<EtcdEvent>&)> events_;
  std::function<void(const std::string&)> failed_;
  std::mutex mu_;
  bool stop_ = false;
  grpc::ClientContext* ctx_ = nullptr;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<EtcdLeaseKeeper> EtcdClient::keepAlive(int64_t id, std::chrono::seconds ttl,
                                                       std::function<int64_t(int64_t)> expired) {
  return std::make_unique<LeaseKeeperImpl>(impl_.get(), id, ttl, std::move(expired));
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(
    const std::string& key, const std::string& range_end, int64_t start_revision,
    std::function<void(const std::vector<EtcdEvent>&)> events,
    std::function<void(const std::string&)> failed) {
  return watch({{key, range_end}}, start_revision, std::move(events), std::move(failed));
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(
    const std::vector<std::pair<std::string, std::string>>& ranges, int64_t start_revision,
    std::function<void(const std::vector<EtcdEvent>&)> events,
    std::function<void(const std::string&)> failed) {
  return std::make_unique<WatchImpl>(impl_.get(), ranges, start_revision, std::move(events),
                                     std::move(failed));
}

bool EtcdClient::waitForEvent(const std::string& key, const std::string& range_end,
                              int64_t start_revision, milliseconds timeout, EtcdCancel* cancel) {
  return waitForEvent({{key, range_end}}, start_revision, timeout, cancel);
}

bool EtcdClient::waitForEvent(const std::vector<std::pair<std::string, std::string>>& ranges,
                              int64_t start_revision, milliseconds timeout, EtcdCancel* cancel) {
  const std::string& key = ranges.front().first;
  auto deadline = Clock::now() + timeout;
  size_t i = impl_->current.load();
  std::string last_error;
  while (Clock::now() < deadline) {
    Endpoint& ep = impl_->eps[i % impl_->eps.size()];
    grpc::ClientContext ctx;
    ctx.set_deadline(wallDeadline(deadline));
    std::string token = impl_->tokenNow();
    if (!token.empty()) ctx.AddMetadata("token", token);
    // While it lives, `cancel` ends this wait (no later than the stream starts).
    struct Armed {
      EtcdCancel* c;
      ~Armed() {
        if (!c) return;
        std::lock_guard<std::mutex> lock(c->mu_);
        c->abort_ = nullptr;
      }
    } armed{nullptr};
    if (cancel) {
      std::lock_guard<std::mutex> lock(cancel->mu_);
      if (cancel->cancelled_) return false;
      cancel->abort_ = [&ctx] { ctx.TryCancel(); };
      armed.c = cancel;
    }
    auto stream = ep.watch->Watch(&ctx);
    bool written = true;
    for (const auto& [k, end] : ranges) {
      pb::WatchRequest req;
      auto* c = req.mutable_create_request();
      c->set_key(k);
      c->set_range_end(end);
      c->set_start_revision(start_revision);
      written = written && stream->Write(req);
    }
    pb::WatchResponse resp;
    bool got = false;
    if (written) {
      while (stream->Read(&resp)) {
        // Compacted or cancelled: the caller re-reads the state, which is all it wants.
        if (resp.events_size() > 0 || resp.canceled()) {
          got = true;
          break;
        }
      }
    }
    if (got) {
      ctx.TryCancel();
      stream->Finish();
      return true;
    }
    grpc::Status s = stream->Finish();
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return false;
    if (cancel && cancel->cancelled()) return false;
    if (authFailure(s))
      throw AuthError(fmt::format("etcd at {} refused Watch: {}", ep.name, s.error_message()));
    last_error = fmt::format("{}: {}", ep.name, s.error_message());
    ++i;
    std::this_thread::sleep_for(std::min<Clock::duration>(
        milliseconds(200), std::max<Clock::duration>(deadline - Clock::now(), {})));
  }
  if (!last_error.empty())
    log::debug("etcd watch on '{}': {} (the caller reads again)", key, last_error);
  return false;
}

}  // namespace ddpl::launcher
