#include "launcher/membership/etcd/etcd_client.h"

#include <fmt/format.h>

#include <random>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/etcd/etcd_client_impl.h"
#include "rendezvous/protocol/grpc_common.h"

namespace ddpl::launcher {

using etcd_detail::authFailure;
using etcd_detail::Clock;
using etcd_detail::describe;
using etcd_detail::Endpoint;
using etcd_detail::fromPb;
using etcd_detail::retryable;
using etcd_detail::wallDeadline;
using std::chrono::milliseconds;
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

namespace etcd_detail {

bool retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

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

std::chrono::system_clock::time_point wallDeadline(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

std::string describe(milliseconds d) { return fmt::format("{:.1f}s", d.count() / 1000.0); }

}  // namespace etcd_detail

namespace {

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

}  // namespace

grpc::Status EtcdClient::Impl::invoke(
    const std::string& op, milliseconds timeout,
    const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& fn, bool with_token) {
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
      throw AuthError(fmt::format("etcd at {} refused {}: {}{}", eps[i].name, op, s.error_message(),
                                  o.user.empty()
                                      ? " (this etcd has auth enabled: give --rdzv-conf user= and "
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
  throw NetworkError(
      fmt::format("etcd {}: no endpoint answered within {} ({})", op, describe(timeout), why));
}

void EtcdClient::Impl::authenticate(milliseconds timeout) {
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

std::string EtcdClient::Impl::tokenNow() {
  std::lock_guard<std::mutex> lock(token_mu);
  return token;
}

pb::RangeResponse EtcdClient::Impl::range(const std::string& key, const std::string& range_end) {
  pb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  pb::RangeResponse resp;
  invoke("Range", o.call_timeout,
         [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Range(&ctx, req, &resp); });
  return resp;
}

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

}  // namespace ddpl::launcher
