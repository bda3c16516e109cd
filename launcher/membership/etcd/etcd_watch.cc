// EtcdClient's watches: a long-lived one on a thread of its own, and a wait for one event.
#include <fmt/format.h>

#include <mutex>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/etcd/etcd_client_impl.h"

namespace ddpl::launcher {

using etcd_detail::authFailure;
using etcd_detail::Clock;
using etcd_detail::describe;
using etcd_detail::Endpoint;
using etcd_detail::fromPb;
using etcd_detail::wallDeadline;
using std::chrono::milliseconds;
namespace pb = etcdserverpb;

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
      etcd_detail::requireLeader(ctx);
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
      last_error = fmt::format("{}: {}", ep.name, s.ok() ? "stream closed" : s.error_message());
      // The other endpoints get the connect timeout from when a working watch broke, however
      // long it had worked (counted from its creation, a watch of an hour failed at once).
      if (created) broken_since = Clock::now();
      if (Clock::now() - broken_since > impl_->o.connect_timeout) {
        failed_(
            fmt::format("the watch on etcd broke and no endpoint took it over within {} "
                        "(last: {})",
                        describe(impl_->o.connect_timeout), last_error));
        return;
      }
      // Once per break of a working watch; the retries that follow are the debug lines.
      if (created)
        log::info("etcd watch on '{}' broke ({}): resuming from revision {} on the next endpoint",
                  ranges_.front().first, last_error, next_.front());
      else
        log::debug("etcd watch on '{}' not taken ({}): trying the next endpoint",
                   ranges_.front().first, last_error);
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
    etcd_detail::requireLeader(ctx);
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
