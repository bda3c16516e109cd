#include "launcher/etcd_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "etcd/rpc.grpc.pb.h"
#include "rendezvous/grpc_common.h"

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
        throw AuthError(fmt::format(
            "etcd at {} refused {}: {}{}", eps[i].name, op, s.error_message(),
            o.user.empty() ? " (this etcd has auth enabled: give --rdzv-conf user= and "
                             "password_file=)"
                           : fmt::format(" (as user '{}')", o.user)));
      if (!retryable(s))
        throw StoreError(fmt::format("etcd at {}: {} failed: {} ({})", eps[i].name, op,
                                     s.error_message(), rdzv::grpc_detail::codeName(s.error_code())));
      last_error[i] = fmt::format("{}: {} ({})", eps[i].name, s.error_message(),
                                  rdzv::grpc_detail::codeName(s.error_code()));
    }
    std::string why;
    for (size_t i = 0; i < eps.size(); ++i)
      why += (why.empty() ? "" : "; ") +
             (last_error[i].empty() ? eps[i].name + ": not tried (no time left)" : last_error[i]);
    throw NetworkError(fmt::format("etcd {}: no endpoint answered within {} ({})", op,
                                   describe(timeout), why));
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
    invoke("Range", o.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.kv->Range(&ctx, req, &resp);
    });
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
  impl_->invoke("connect (Range)", options_.connect_timeout,
                [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Range(&ctx, req, &resp); });
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
      case EtcdCompare::Result::kEqual: pc->set_result(pb::Compare::EQUAL); break;
      case EtcdCompare::Result::kNotEqual: pc->set_result(pb::Compare::NOT_EQUAL); break;
      case EtcdCompare::Result::kLess: pc->set_result(pb::Compare::LESS); break;
      case EtcdCompare::Result::kGreater: pc->set_result(pb::Compare::GREATER); break;
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
    impl_->invoke("LeaseRevoke", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
      return ep.lease->LeaseRevoke(&ctx, req, &resp);
    });
  } catch (const StoreError& e) {
    // Already gone (expired): nothing left to revoke.
    if (std::string(e.what()).find("lease not found") == std::string::npos) throw;
  }
}

int64_t EtcdClient::keepAliveOnce(int64_t id) {
  int64_t ttl = 0;
  impl_->invoke("LeaseKeepAlive", options_.call_timeout, [&](Endpoint& ep, grpc::ClientContext& ctx) {
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

namespace {

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
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else if (thread_.joinable()) thread_.join();
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
        failed_(fmt::format("the watch on etcd broke and no endpoint took it over within {} "
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
                              int64_t start_revision, milliseconds timeout) {
  return waitForEvent({{key, range_end}}, start_revision, timeout);
}

bool EtcdClient::waitForEvent(const std::vector<std::pair<std::string, std::string>>& ranges,
                              int64_t start_revision, milliseconds timeout) {
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
    if (authFailure(s)) throw AuthError(fmt::format("etcd at {} refused Watch: {}", ep.name, s.error_message()));
    last_error = fmt::format("{}: {}", ep.name, s.error_message());
    ++i;
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(200),
                                                          std::max<Clock::duration>(deadline - Clock::now(), {})));
  }
  if (!last_error.empty())
    log::debug("etcd watch on '{}': {} (the caller reads again)", key, last_error);
  return false;
}

}  // namespace ddpl::launcher
