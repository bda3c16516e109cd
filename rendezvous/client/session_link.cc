#include "rendezvous/client/session_link.h"

#include <fmt/format.h>

#include "rendezvous/client/grpc_store.h"
#include "rendezvous/protocol/grpc_common.h"

namespace ddpl::rdzv::grpc_detail {

namespace {
// How long a handshake that timed out waits for its link to close.
constexpr Duration kHandshakeCloseWait{std::chrono::seconds(10)};
}  // namespace

void DeferredError::record(grpc::Status s, std::string w) {
  std::lock_guard<std::mutex> lock(mu);
  if (any.load()) return;  // the first one is the one to report
  status = std::move(s);
  what = std::move(w);
  any = true;
}

bool DeferredError::take(grpc::Status* s, std::string* w) {
  std::lock_guard<std::mutex> lock(mu);
  if (!any.load()) return false;
  *s = std::move(status);
  *w = std::move(what);
  any = false;
  return true;
}

void PendingOp::complete(grpc::Status s, pb::StoreResponse* r) {
  {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    if (r) resp.Swap(r);
    done = true;
  }
  cv.notify_one();
}

bool PendingOp::isDone() {
  std::lock_guard<std::mutex> lock(mu);
  return done;
}

grpc::Status SessionLink::handshake(Duration timeout, int64_t* max_value_bytes,
                                    const std::string& token) {
  auto op = std::make_shared<PendingOp>();
  pb::StoreRequest ping;
  ping.set_id(0);
  ping.mutable_ping();
  if (!token.empty()) ping.set_token(token);
  if (send(ping, op) != Sent::kYes) return whyBroken();
  if (!await(*op, Clock::now() + timeout)) {
    close(kHandshakeCloseWait);
    return grpc::Status(grpc::DEADLINE_EXCEEDED,
                        fmt::format("the store stream did not open within {}", describe(timeout)));
  }
  std::lock_guard<std::mutex> lock(op->mu);
  if (!op->status.ok()) return op->status;
  if (op->resp.has_error())
    return grpc::Status(static_cast<grpc::StatusCode>(op->resp.error().code()),
                        op->resp.error().message());
  if (op->resp.ping().max_value_bytes() > 0) *max_value_bytes = op->resp.ping().max_value_bytes();
  return grpc::Status::OK;
}

bool SessionLink::hasUnconfirmed() {
  std::lock_guard<std::mutex> lock(mu_);
  return !quiet_.empty();
}

void SessionLink::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
}

bool SessionLink::broken() {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

SessionLink::Sent SessionLink::registerLocked(pb::StoreRequest& req,
                                              const std::shared_ptr<PendingOp>& op,
                                              const std::string& quiet_what) {
  if (!op && quiet_.size() >= static_cast<size_t>(kMaxQuietSets)) return Sent::kNoRoom;
  uint64_t seq = ++sent_seq_;
  if (op) {
    pending_.emplace(req.id(), Pending{op, seq});
  } else {
    quiet_.push_back({seq, req.id(), quiet_what});
    req.set_quiet(true);
  }
  return Sent::kYes;
}

void SessionLink::onResponse(pb::StoreResponse& resp) {
  std::shared_ptr<PendingOp> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(resp.id());
    if (it != pending_.end()) {
      op = std::move(it->second.op);
      confirmLocked(it->second.seq);
      pending_.erase(it);
    } else if (resp.has_error()) {
      // A quiet set the server refused (or a late answer to an operation that stopped
      // waiting: not found among the quiet ones, dropped).
      for (const auto& q : quiet_)
        if (q.id == resp.id()) {
          deferred_->record(grpc::Status(static_cast<grpc::StatusCode>(resp.error().code()),
                                         resp.error().message()),
                            q.what);
          confirmLocked(q.seq);
          break;
        }
    }
  }
  if (op) op->complete(grpc::Status::OK, &resp);
}

void SessionLink::onBroken(const grpc::Status& why) {
  std::unordered_map<uint64_t, Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    pending.swap(pending_);
    if (!quiet_.empty())
      deferred_->record(
          grpc::Status(why.error_code(),
                       fmt::format("{}; the server had not confirmed it nor {} more set(s) "
                                   "sent before it broke, which may not have been applied",
                                   why.error_message(), quiet_.size() - 1)),
          quiet_.front().what);
    quiet_.clear();
  }
  for (auto& [id, p] : pending) p.op->complete(why, nullptr);
}

void SessionLink::confirmLocked(uint64_t seq) {
  while (!quiet_.empty() && quiet_.front().seq <= seq) quiet_.pop_front();
}

}  // namespace ddpl::rdzv::grpc_detail
