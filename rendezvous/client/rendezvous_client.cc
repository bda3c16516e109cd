#include "rendezvous/client/rendezvous_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "ddpl/config.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/state/round_rules.h"

namespace ddpl::rdzv {

namespace pb = ::ddpl::rendezvous::v1;
using namespace grpc_detail;

namespace {

// On top of the server-side timeouts, so that the server's own message wins the race.
constexpr Duration kJoinGrace{std::chrono::seconds(5)};
// A watch lives as long as its round; keepalive, not this deadline, finds a dead server.
constexpr Duration kWatchDeadline{std::chrono::hours(24 * 30)};
// How long a heartbeat that finds its round over waits for the watch stream to bring the
// server's reason before reporting the stale round itself.
constexpr Duration kStreamReasonGrace{std::chrono::milliseconds(500)};

pb::JoinRequest toRequest(const JoinOptions& o) {
  pb::JoinRequest r;
  r.set_run_id(o.run_id);
  r.set_node_id(o.node_id);
  r.set_local_world_size(o.local_world_size);
  r.set_version(o.version.empty() ? DDPL_VERSION : o.version);
  r.set_address(o.address);
  r.set_min_nodes(o.min_nodes);
  r.set_max_nodes(o.max_nodes);
  r.set_join_timeout_ms(o.join_timeout.count());
  r.set_last_call_timeout_ms(o.last_call_timeout.count());
  r.set_include_members(o.include_members);
  r.set_own_place_only(true);
  return r;
}

RoundAssignment toAssignment(const JoinOptions& o, const pb::JoinResponse& r) {
  RoundAssignment a;
  a.run_id = o.run_id;
  a.node_id = o.node_id;
  a.round = r.round();
  a.group_rank = r.group_rank();
  a.group_world_size = r.group_world_size();
  a.world_size = r.world_size();
  auto inconsistent = [&](const std::string& what) {
    return StoreError(fmt::format(
        "join run '{}': the server's reply is inconsistent ({}: group rank {} of {} nodes, "
        "rank offset {}, {} local workers, world size {})",
        o.run_id, what, a.group_rank, a.group_world_size, r.rank_offset(), r.local_world_size(),
        a.world_size));
  };
  if (a.group_world_size <= 0 || a.group_rank < 0 || a.group_rank >= a.group_world_size)
    throw inconsistent("group rank out of range");
  if (r.local_world_sizes_size() > 0) {
    // The whole list (include_members, or a server that predates own_place_only).
    a.local_world_sizes.assign(r.local_world_sizes().begin(), r.local_world_sizes().end());
    for (int32_t lws : a.local_world_sizes)
      if (lws <= 0) throw inconsistent("a node with no workers");
    round_rules::RankLayout layout = round_rules::rankLayout(
        std::vector<int>(a.local_world_sizes.begin(), a.local_world_sizes.end()));
    for (int64_t offset : layout.offsets)
      a.rank_offsets.push_back(static_cast<int32_t>(std::min<int64_t>(offset, INT32_MAX)));
    if (static_cast<int64_t>(a.local_world_sizes.size()) != a.group_world_size ||
        layout.world_size != a.world_size)
      throw inconsistent("the nodes' local world sizes do not add up");
    a.rank_offset = a.rank_offsets[static_cast<size_t>(a.group_rank)];
    a.local_world_size = a.local_world_sizes[static_cast<size_t>(a.group_rank)];
  } else {
    a.rank_offset = r.rank_offset();
    a.local_world_size = r.local_world_size();
    if (a.rank_offset < 0 || a.local_world_size <= 0 ||
        static_cast<int64_t>(a.rank_offset) + a.local_world_size > a.world_size)
      throw inconsistent("this node's ranks fall outside the world");
  }
  a.master_address = r.master_address();
  a.agent_store = r.agent_store();
  a.store_prefix = r.store_prefix();
  a.heartbeat_interval = Duration(r.heartbeat_interval_ms());
  for (const auto& m : r.members()) a.members.push_back({m.node_id(), m.address()});
  return a;
}

Duration joinDeadline(const JoinOptions& o) {
  return saturatingAdd(saturatingAdd(o.join_timeout, o.last_call_timeout), kJoinGrace);
}

}  // namespace

// Async joins still running, so that the client outlives their hold on the channel.
struct AsyncJoins {
  std::mutex mu;
  std::condition_variable idle;
  int running = 0;
};

// How long ~RendezvousClient waits for async joins it did not see finish.
constexpr Duration kAsyncCloseWait{std::chrono::seconds(10)};

struct RendezvousClient::Impl {
  RendezvousClientOptions options;
  std::shared_ptr<AsyncJoins> async = std::make_shared<AsyncJoins>();
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Rendezvous::Stub> stub;

  [[noreturn]] void fail(const grpc::Status& s, const std::string& op) const {
    throwStatus(s, options.endpoint, op);
  }

  // One heartbeat for `a`'s round, bounded by call_timeout; the caller decides what a failure
  // means (an error for heartbeat(), the round's end or a warning for the watch).
  grpc::Status heartbeat(const RoundAssignment& a, pb::HeartbeatResponse* resp) const {
    grpc::ClientContext ctx;
    prepare(ctx, options.token, options.call_timeout);
    pb::HeartbeatRequest req;
    req.set_run_id(a.run_id);
    req.set_node_id(a.node_id);
    req.set_round(a.round);
    return stub->Heartbeat(&ctx, req, resp);
  }
};

class RoundWatchImpl : public RoundWatch {
 public:
  RoundWatchImpl(std::shared_ptr<RendezvousClient::Impl> impl, RoundAssignment a,
                 std::function<void(const RoundChange&)> cb)
      : impl_(std::move(impl)), a_(std::move(a)), cb_(std::move(cb)) {
    prepare(ctx_, impl_->options.token, kWatchDeadline);
    reader_ = std::thread([this] { readLoop(); });
    heartbeats_ = std::thread([this] { heartbeatLoop(); });
    // Return once the server has registered the stream, so that any change after watch()
    // returns is reported with its reason (a change before it shows as a stale round).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, impl_->options.call_timeout, [&] { return registered_ || fired_.load(); });
  }

  ~RoundWatchImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    ctx_.TryCancel();
    for (auto* t : {&reader_, &heartbeats_}) {
      if (!t->joinable()) continue;
      if (t->get_id() == std::this_thread::get_id())
        t->detach();  // destroyed from inside its own callback
      else
        t->join();
    }
  }

  bool changed() const override { return fired_.load(); }

 private:
  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  void fire(RoundChange c) {
    if (fired_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    cv_.notify_all();
    cb_(c);
  }

  void readLoop() {
    pb::WatchRequest req;
    req.set_run_id(a_.run_id);
    req.set_node_id(a_.node_id);
    req.set_round(a_.round);
    auto reader = impl_->stub->Watch(&ctx_, req);
    pb::WatchEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_watching()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          registered_ = true;
        }
        cv_.notify_all();
      }
      if (ev.has_invalidated()) {
        const auto& i = ev.invalidated();
        fire({a_.run_id, i.round(), i.reason(), i.nodes_waiting(), false});
      }
    }
    grpc::Status s = reader->Finish();
    if (stopping() || fired_.load()) return;
    fire({a_.run_id, a_.round,
          fmt::format("watch of round {} on {} ended: {}: {}", a_.round, impl_->options.endpoint,
                      codeName(s.error_code()), s.error_message()),
          0, s.error_code() == grpc::UNAVAILABLE || s.error_code() == grpc::DEADLINE_EXCEEDED});
  }

  void heartbeatLoop() {
    Duration interval = a_.heartbeat_interval.count() > 0 ? a_.heartbeat_interval
                                                          : Duration(std::chrono::seconds(5));
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait_for(lock, interval, [&] { return stopping_ || fired_.load(); });
      if (stopping_ || fired_.load()) return;
      lock.unlock();
      pb::HeartbeatResponse resp;
      grpc::Status s = impl_->heartbeat(a_, &resp);
      if (s.error_code() == grpc::FAILED_PRECONDITION || s.error_code() == grpc::NOT_FOUND) {
        // The round ended. The server sends the reason ("node 'b' evicted: ...") down the
        // watch stream at the same moment, and this reply may merely have overtaken it: give
        // a registered stream a moment to deliver it before reporting the bare stale round.
        lock.lock();
        if (registered_)
          cv_.wait_for(lock, kStreamReasonGrace, [&] { return stopping_ || fired_.load(); });
        lock.unlock();
        fire({a_.run_id, a_.round, s.error_message(), 0, false});
        return;
      }
      if (!s.ok())  // transport trouble: the watch stream reports a lost server
        log::warn("heartbeat for round {} of run '{}' to {} failed: {}: {}", a_.round, a_.run_id,
                  impl_->options.endpoint, codeName(s.error_code()), s.error_message());
      lock.lock();
    }
  }

  std::shared_ptr<RendezvousClient::Impl> impl_;
  RoundAssignment a_;
  std::function<void(const RoundChange&)> cb_;
  grpc::ClientContext ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool registered_ = false;
  std::atomic<bool> fired_{false};
  std::thread reader_, heartbeats_;
};

RendezvousClient::RendezvousClient(const RendezvousClientOptions& options)
    : impl_(std::make_shared<Impl>()) {
  impl_->options = options;
  impl_->channel = makeChannel({options.endpoint, options.tls_ca_file, options.tls_cert_file,
                                options.tls_key_file, kDefaultMaxValueBytes});
  impl_->stub = pb::Rendezvous::NewStub(impl_->channel);
  auto store = pb::Store::NewStub(impl_->channel);
  retryConnect(options.endpoint, options.connect_timeout, [&](Duration attempt_timeout) {
    grpc::ClientContext ctx;
    prepare(ctx, options.token, attempt_timeout);
    ctx.set_wait_for_ready(true);
    pb::PingResponse resp;
    return store->Ping(&ctx, pb::PingRequest{}, &resp);
  });
}

RendezvousClient::~RendezvousClient() {
  std::unique_lock<std::mutex> lock(impl_->async->mu);
  if (!impl_->async->idle.wait_for(lock, kAsyncCloseWait,
                                   [&] { return impl_->async->running == 0; })) {
    log::warn("rendezvous client for {}: {} async joins still running at destruction",
              impl_->options.endpoint, impl_->async->running);
    // Their callbacks would drop the channel's last reference on a gRPC thread: keep it.
    new std::shared_ptr<grpc::Channel>(impl_->channel);  // NOLINT: deliberately never freed
  }
}

const std::string& RendezvousClient::endpoint() const { return impl_->options.endpoint; }

RoundAssignment RendezvousClient::join(const JoinOptions& o) {
  pb::JoinRequest req = toRequest(o);
  pb::JoinResponse resp;
  // A server that went away (restarted, moved) gets connect_timeout to come back: the join
  // is sent again to the new one.
  grpc::Status s = retryWhileUnavailable(impl_->options.connect_timeout, [&] {
    grpc::ClientContext ctx;
    prepare(ctx, impl_->options.token, joinDeadline(o));
    resp.Clear();
    return impl_->stub->Join(&ctx, req, &resp);
  });
  if (!s.ok()) impl_->fail(s, fmt::format("join run '{}' as node '{}'", o.run_id, o.node_id));
  return toAssignment(o, resp);
}

void RendezvousClient::joinAsync(const JoinOptions& o,
                                 std::function<void(RoundAssignment, std::exception_ptr)> done) {
  struct Call {
    grpc::ClientContext ctx;
    pb::JoinRequest req;
    pb::JoinResponse resp;
  };
  auto call = std::make_shared<Call>();
  prepare(call->ctx, impl_->options.token, joinDeadline(o));
  call->req = toRequest(o);
  // The callback runs on a gRPC thread. It must not hold the last reference to the channel
  // (a ClientContext holds one): ~Channel there joins gRPC's callback threads from one of them
  // ("assertion failed: prior > 0" at exit). So it holds neither Impl nor, once it has read
  // the reply, the call; and ~RendezvousClient waits until every async join has let go.
  auto async = impl_->async;
  {
    std::lock_guard<std::mutex> lock(async->mu);
    ++async->running;
  }
  std::string endpoint = impl_->options.endpoint;
  impl_->stub->async()->Join(
      &call->ctx, &call->req, &call->resp,
      [call, async, endpoint, o, done = std::move(done)](grpc::Status s) mutable {
        RoundAssignment a;
        std::exception_ptr e;
        try {
          if (!s.ok())
            throwStatus(s, endpoint,
                        fmt::format("join run '{}' as node '{}'", o.run_id, o.node_id));
          a = toAssignment(o, call->resp);
        } catch (...) {
          e = std::current_exception();
        }
        call.reset();
        done(std::move(a), e);
        std::lock_guard<std::mutex> lock(async->mu);
        if (--async->running == 0) async->idle.notify_all();
      });
}

int32_t RendezvousClient::heartbeat(const RoundAssignment& a) {
  pb::HeartbeatResponse resp;
  grpc::Status s = impl_->heartbeat(a, &resp);
  if (!s.ok()) impl_->fail(s, fmt::format("heartbeat for round {} of run '{}'", a.round, a.run_id));
  return resp.nodes_waiting();
}

void RendezvousClient::leave(const std::string& run_id, const std::string& node_id) {
  pb::LeaveRequest req;
  req.set_run_id(run_id);
  req.set_node_id(node_id);
  pb::LeaveResponse resp;
  grpc::Status s = retryWhileUnavailable(impl_->options.connect_timeout, [&] {
    grpc::ClientContext ctx;
    prepare(ctx, impl_->options.token, impl_->options.call_timeout);
    return impl_->stub->Leave(&ctx, req, &resp);
  });
  if (!s.ok()) impl_->fail(s, fmt::format("leave run '{}' as node '{}'", run_id, node_id));
}

RendezvousClient::Withdrawal RendezvousClient::withdraw(const JoinOptions& o,
                                                        const std::string& reason) {
  pb::WithdrawRequest req;
  req.set_run_id(o.run_id);
  req.set_node_id(o.node_id);
  req.set_reason(reason);
  req.set_min_nodes(o.min_nodes);
  req.set_max_nodes(o.max_nodes);
  req.set_join_timeout_ms(
      std::clamp<int64_t>(o.join_timeout.count(), 1, kMaxClientTimeout.count()));
  pb::WithdrawResponse resp;
  grpc::Status s = retryWhileUnavailable(impl_->options.connect_timeout, [&] {
    grpc::ClientContext ctx;
    prepare(ctx, impl_->options.token, impl_->options.call_timeout);
    return impl_->stub->Withdraw(&ctx, req, &resp);
  });
  if (!s.ok()) impl_->fail(s, fmt::format("withdraw node '{}' from run '{}'", o.node_id, o.run_id));
  return {resp.stopped_nodes(), resp.can_come(), resp.failed()};
}

std::unique_ptr<RoundWatch> RendezvousClient::watch(
    const RoundAssignment& assignment, std::function<void(const RoundChange&)> on_change) {
  return std::make_unique<RoundWatchImpl>(impl_, assignment, std::move(on_change));
}

}  // namespace ddpl::rdzv
