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
// A watch lives as long as its round; heartbeats, not this deadline, find a lost server.
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
  a.heartbeat_window = Duration(std::max<int64_t>(r.heartbeat_window_ms(), 0));
  a.epoch_ms = r.epoch_ms();
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
  grpc::Status heartbeat(const RoundAssignment& a, pb::HeartbeatResponse* resp,
                         Duration timeout) const {
    grpc::ClientContext ctx;
    prepare(ctx, options.token, timeout);
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
    interval_ = a_.heartbeat_interval.count() > 0 ? a_.heartbeat_interval
                                                  : Duration(std::chrono::seconds(5));
    // A server that predates heartbeat_window_ms sends its interval as a third of its window.
    window_ = a_.heartbeat_window.count() > 0 ? a_.heartbeat_window : interval_ * 3;
    lease_ = fenceAfter(window_);
    // More often than the server asks, so that a silence must last lease_ less one interval
    // before it fences: W/2, not the W/3 that the server's own interval would leave.
    interval_ = std::max<Duration>(std::min(interval_, heartbeatEvery(window_)), Duration(50));
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
      if (ctx_) ctx_->TryCancel();
    }
    cv_.notify_all();
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
  using Clock = std::chrono::steady_clock;

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  void fire(RoundChange c) {
    if (fired_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      if (ctx_) ctx_->TryCancel();  // the round is over for this node: no stream to keep
    }
    cv_.notify_all();
    cb_(c);
  }

  // One Watch stream; returns its status (OK when the server ended it after an event).
  grpc::Status watchOnce() {
    pb::WatchRequest req;
    req.set_run_id(a_.run_id);
    req.set_node_id(a_.node_id);
    req.set_round(a_.round);
    grpc::ClientContext* ctx = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || fired_.load()) return grpc::Status::CANCELLED;
      ctx_ = std::make_unique<grpc::ClientContext>();
      prepare(*ctx_, impl_->options.token, kWatchDeadline);
      ctx = ctx_.get();
    }
    auto reader = impl_->stub->Watch(ctx, req);
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
    return reader->Finish();
  }

  // The stream lasts the round. When the connection breaks, the node is not out of its round:
  // the server decides that (its heartbeat window), and heartbeatLoop stops the workers when the
  // server has been unreachable too long. So a broken stream is opened again, unless nothing
  // listens any more at the server's address (the process is gone: no reason to wait).
  void readLoop() {
    Duration backoff{std::chrono::milliseconds(200)};
    for (int attempt = 0;; ++attempt) {
      grpc::Status s = watchOnce();
      if (stopping() || fired_.load()) return;
      bool transport = s.error_code() == grpc::UNAVAILABLE ||
                       s.error_code() == grpc::DEADLINE_EXCEEDED ||
                       (s.error_code() == grpc::CANCELLED && attempt > 0);
      std::string why =
          fmt::format("watch of round {} on {} ended: {}: {}", a_.round, impl_->options.endpoint,
                      codeName(s.error_code()), s.error_message());
      if (!transport || refused(s)) {
        fire({a_.run_id, a_.round, why, 0, transport});
        return;
      }
      if (attempt == 0)
        log::warn(
            "{}; watching again while heartbeats decide (the workers stop if no heartbeat "
            "is answered for {:.1f}s)",
            why, seconds(lease_));
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, backoff, [&] { return stopping_ || fired_.load(); });
      if (stopping_ || fired_.load()) return;
      backoff = std::min<Duration>(backoff * 2, std::max<Duration>(interval_, backoff));
    }
  }

  static bool refused(const grpc::Status& s) {
    std::string m = s.error_message();
    std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
    return m.find("connection refused") != std::string::npos;
  }

  static double seconds(Duration d) { return static_cast<double>(d.count()) / 1000.0; }

  // Heartbeats every interval. While the server does not answer, they are retried more often, and
  // once none has been answered for lease_ (half the server's window, counted from the send of
  // the last answered one, which the server received no earlier), this node fences itself: its
  // workers must be gone before the server could evict it and form a round without it
  // (docs/network-faults.md: the timings and the clock drift they allow).
  void heartbeatLoop() {
    Clock::time_point last_ok = Clock::now();  // the round's reply has just come
    Clock::time_point next = last_ok + interval_;
    Clock::time_point failing_since{};
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      Clock::time_point fence = last_ok + lease_;
      cv_.wait_until(lock, std::min(next, fence), [&] { return stopping_ || fired_.load(); });
      if (stopping_ || fired_.load()) return;
      Clock::time_point now = Clock::now();
      // Only after a heartbeat failed: an agent that slept past the fence (SIGSTOP, a stalled
      // machine) first asks, and the server's answer (evicted, or still a member) decides.
      if (now >= fence && failing_since != Clock::time_point{}) {
        lock.unlock();
        Duration silent = std::chrono::duration_cast<Duration>(now - last_ok);
        RoundChange c{a_.run_id, a_.round,
                      fmt::format("fencing: no heartbeat answered by {} for {:.1f}s (limit "
                                  "{:.1f}s, 2/3 of the server's {:.1f}s heartbeat window): the "
                                  "workers of round {} stop within {:.1f}s, before the server "
                                  "can form a round without this node",
                                  impl_->options.endpoint, seconds(silent), seconds(lease_),
                                  seconds(window_), a_.round, seconds(stopGrace(window_))),
                      0, true};
        c.fenced = true;
        c.stop_within = stopGrace(window_);
        fire(c);
        return;
      }
      if (now < next && now < fence) continue;
      lock.unlock();
      pb::HeartbeatResponse resp;
      // Bounded by the fence too: a call that hangs on a cut link must not hold the check.
      Duration limit =
          std::max<Duration>(std::min({impl_->options.call_timeout, interval_,
                                       std::chrono::duration_cast<Duration>(fence - now)}),
                             std::min<Duration>(interval_ / 3, Duration(std::chrono::seconds(1))));
      grpc::Status s = impl_->heartbeat(a_, &resp, limit);
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
      if (s.ok()) {
        if (failing_since != Clock::time_point{})
          log::warn("rendezvous service at {} answers heartbeats of round {} again after {:.1f}s",
                    impl_->options.endpoint, a_.round,
                    seconds(std::chrono::duration_cast<Duration>(Clock::now() - failing_since)));
        failing_since = {};
        last_ok = now;
        next = now + interval_;
      } else {
        if (failing_since == Clock::time_point{}) {
          failing_since = now;
          log::warn(
              "heartbeat for round {} of run '{}' to {} failed: {}: {} (the workers stop "
              "if none is answered for {:.1f}s)",
              a_.round, a_.run_id, impl_->options.endpoint, codeName(s.error_code()),
              s.error_message(), seconds(lease_));
        }
        next = Clock::now() + std::max<Duration>(interval_ / 4, Duration(100));
      }
      lock.lock();
    }
  }

  std::shared_ptr<RendezvousClient::Impl> impl_;
  RoundAssignment a_;
  std::function<void(const RoundChange&)> cb_;
  Duration interval_{}, window_{}, lease_{};
  std::unique_ptr<grpc::ClientContext> ctx_;  // the current Watch stream's, under mu_
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
  grpc::Status s = impl_->heartbeat(a, &resp, impl_->options.call_timeout);
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
