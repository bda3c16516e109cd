// EtcdClient::keepAlive: one lease kept alive over one long-lived LeaseKeepAlive stream.
#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/etcd/etcd_client_impl.h"
#include "rendezvous/protocol/grpc_common.h"

namespace ddpl::launcher {

using etcd_detail::Clock;
using etcd_detail::describe;
using etcd_detail::Endpoint;
using std::chrono::milliseconds;
namespace pb = etcdserverpb;

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
    etcd_detail::requireLeader(s->ctx_);
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
                  std::function<int64_t(int64_t)> expired, std::function<void(milliseconds)> fence)
      : impl_(impl),
        expired_(std::move(expired)),
        fence_(std::move(fence)),
        signal_(std::make_shared<KeeperSignal>()) {
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
    next_.send_at = now + interval(next_);
    changed_ = true;
  }

  struct Lease {
    int64_t id = 0;
    std::chrono::seconds ttl{1};
    Clock::time_point alive_until, send_at;
  };

  // What run() carries from one wake-up to the next (its thread's own).
  struct KeepState {
    Lease l;
    std::shared_ptr<LeaseStream> stream;
    size_t ep = 0;                // the endpoint the next stream opens on (modulo their number)
    milliseconds backoff{100};    // between reopenings of streams that broke, up to 1 s
    Clock::time_point reopen_at;  // no stream opened before it
    bool due = false;             // a keep-alive is due and not answered yet
    bool warned = false;          // that the lease may have expired, once per outage
    bool fenced = false;          // fence_ ran, once per outage
    std::string last_error = "no answer yet";
  };

  void run() {
    std::shared_ptr<KeeperSignal> signal = signal_;  // outlives us when detached
    KeepState st;
    st.ep = impl_->current.load();
    const size_t n = impl_->eps.size();
    while (true) {
      if (!sleepUntilDue(st, *signal)) break;
      auto now = Clock::now();
      // Stopped meanwhile (perhaps destroyed by the `expired` callback): touch no member.
      if (st.stream && !takeAnswers(st, *signal, now)) break;
      if (!st.due && now >= st.l.send_at) st.due = true;
      if (st.due && st.stream) {
        auto oldest = st.stream->oldestUnanswered();
        if (oldest && now - *oldest >= stuckAfter(st.l)) {
          st.last_error =
              fmt::format("{}: no answer for {}", impl_->eps[st.ep % n].name,
                          describe(std::chrono::duration_cast<milliseconds>(now - *oldest)));
          log::debug("etcd keep-alive: {}; moving on to the next endpoint", st.last_error);
          st.stream->cancel();
          st.stream.reset();
          ++st.ep;
          st.reopen_at = now;
        }
      }
      if (st.due && !st.stream && now >= st.reopen_at)
        st.stream = LeaseStream::start(impl_->eps[st.ep % n], impl_->tokenNow(), signal);
      // One request in flight per stream: a later one would be answered after it anyway.
      if (st.due && st.stream && !st.stream->oldestUnanswered()) st.stream->send(st.l.id);
      if (!st.fenced && fence_ && now >= fenceAt(st.l)) {
        st.fenced = true;
        // The lease was renewed after the send of the last answered keep-alive, at
        // alive_until - TTL: the silence counts from there.
        fence_(std::chrono::duration_cast<milliseconds>(now - (st.l.alive_until - st.l.ttl)));
        std::lock_guard<std::mutex> lock(signal->mu);
        if (signal->stop) break;  // destroyed meanwhile (as after expire())
      }
      if (!st.warned && now >= st.l.alive_until) {
        st.warned = true;
        log::warn(
            "etcd keep-alive: lease {:x} not renewed within its TTL of {}s (last: {}); it "
            "may have expired, still trying",
            st.l.id, st.l.ttl.count(), st.last_error);
      }
    }
    closeStreams(st.stream, *signal);
  }

  // Waits until something is next to do (send, give up a silent stream, reopen one, warn,
  // fence) or keep() or stop pokes; takes a new lease from keep(). False when stopped.
  bool sleepUntilDue(KeepState& st, KeeperSignal& signal) {
    auto now = Clock::now();
    Clock::time_point wake = st.due ? now + std::chrono::seconds(1) : st.l.send_at;
    if (st.due && st.stream) {
      if (auto oldest = st.stream->oldestUnanswered())
        wake = std::min(wake, *oldest + stuckAfter(st.l));
    }
    if (st.due && !st.stream) wake = std::min(wake, st.reopen_at);
    if (!st.warned) wake = std::min(wake, st.l.alive_until);
    if (!st.fenced && fence_) wake = std::min(wake, fenceAt(st.l));
    std::unique_lock<std::mutex> lock(signal.mu);
    signal.cv.wait_until(lock, std::max(wake, now), [&] { return signal.stop || signal.poked; });
    if (signal.stop) return false;
    signal.poked = false;
    if (changed_) {
      st.l = next_;
      changed_ = false;
      st.due = false;
      st.warned = false;
      st.fenced = false;
    }
    return true;
  }

  // The answers to the keep-alives sent on the stream, and the stream given up when it broke.
  // An answer that the lease expired calls `expired` for a new one. False when the keeper was
  // stopped meanwhile: perhaps destroyed by that callback, when nothing of ours may be touched.
  bool takeAnswers(KeepState& st, KeeperSignal& signal, Clock::time_point now) {
    bool stopped = false;
    for (const auto& a : st.stream->takeAnswers()) {
      if (a.id != st.l.id) continue;  // for the lease before the last keep()
      if (a.ttl <= 0) {
        st.due = false;
        int64_t fresh = expire(st.l.id);
        std::lock_guard<std::mutex> lock(signal.mu);
        stopped = signal.stop;
        if (stopped || changed_) break;  // keep() came meanwhile: the loop takes it
        if (fresh != 0 && fresh != st.l.id) {
          setLease(fresh, st.l.ttl);
          st.l = next_;
          changed_ = false;
          st.warned = false;
          st.fenced = false;
        } else {
          // Not replaced (etcd refused a new one): ask again in a second.
          st.l.send_at = Clock::now() + std::chrono::seconds(1);
        }
        break;
      }
      st.l.ttl = std::chrono::seconds(a.ttl);
      st.l.alive_until = std::max(st.l.alive_until, a.sent + st.l.ttl);
      st.l.send_at = now + interval(st.l);
      st.due = false;
      st.backoff = milliseconds(100);
      if (st.warned || st.fenced)
        log::info("etcd keep-alive: lease {:x} renewed again ({}s left)", st.l.id, a.ttl);
      st.warned = false;
      st.fenced = false;
    }
    if (stopped) return false;
    if (st.stream->broken()) {
      st.last_error = st.stream->why();
      log::debug("etcd keep-alive stream broke ({}): reopening on the next endpoint",
                 st.last_error);
      st.stream.reset();
      ++st.ep;
      st.reopen_at = now + st.backoff;
      st.backoff = std::min(st.backoff * 2, milliseconds(1000));
    }
    return true;
  }

  // Every stream holds the client's channel: gRPC must be done with them before the client
  // may go. Cancelled, they end within milliseconds. Static: the keeper may be gone by now.
  static void closeStreams(std::shared_ptr<LeaseStream>& stream, KeeperSignal& signal) {
    if (stream) stream->cancel();
    stream.reset();
    std::unique_lock<std::mutex> lock(signal.mu);
    if (!signal.cv.wait_for(lock, std::chrono::seconds(10), [&] { return signal.live == 0; }))
      log::warn("etcd keep-alive: {} stream(s) not finished 10s after cancelling", signal.live);
  }

  // How long an unanswered keep-alive waits on a stream that has not broken before the keeper
  // tries another. A live stream delivers in order, so only another member can answer sooner:
  // 2 s with several endpoints (a member answers through an election within it), the TTL
  // with one (a stream wedged for good is reopened once per TTL at most).
  milliseconds stuckAfter(const Lease& l) const {
    return impl_->eps.size() > 1 ? milliseconds(2000)
                                 : std::chrono::duration_cast<milliseconds>(l.ttl);
  }

  // Between an answer and the next keep-alive: TTL/3, as etcd's own clients; TTL/6 for a
  // fencing keeper, so that a silence of TTL/2 (2/3 less one interval) never fences: the
  // silence counts from the last answered send, which may be one interval old when it starts.
  milliseconds interval(const Lease& l) const {
    return std::chrono::duration_cast<milliseconds>(l.ttl) / (fence_ ? 6 : 3);
  }

  // 2/3 of the TTL after the send of the last answered keep-alive.
  static Clock::time_point fenceAt(const Lease& l) {
    return l.alive_until - std::chrono::duration_cast<milliseconds>(l.ttl) / 3;
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
  std::function<void(milliseconds)> fence_;
  std::shared_ptr<KeeperSignal> signal_;
  Lease next_;            // guarded by signal_->mu: set by keep(), taken by run()
  bool changed_ = false;  // guarded by signal_->mu
  std::thread thread_;
};

}  // namespace

std::unique_ptr<EtcdLeaseKeeper> EtcdClient::keepAlive(int64_t id, std::chrono::seconds ttl,
                                                       std::function<int64_t(int64_t)> expired,
                                                       std::function<void(milliseconds)> fence) {
  return std::make_unique<LeaseKeeperImpl>(impl_.get(), id, ttl, std::move(expired),
                                           std::move(fence));
}

}  // namespace ddpl::launcher
