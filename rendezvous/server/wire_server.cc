#include "rendezvous/server/wire_server.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/log.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/wire_format.h"
#include "rendezvous/server/service_core.h"
#include "rendezvous/server/wire_conn.h"

namespace ddpl::rdzv::grpc_detail {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr size_t kReadChunk = 64 << 10;
// Reads per wake-up of one connection before the loop serves the others.
constexpr int kReadsPerWake = 4;
// Small answers are appended to one buffer up to this size, then a new one is started.
constexpr size_t kChunkBytes = 64 << 10;
// sendmsg's iovec entries per call.
constexpr int kMaxIov = 64;

void appendVarint(std::string& out, uint64_t v) {
  uint8_t buf[10];
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

int64_t varintSize(uint64_t v) {
  return static_cast<int64_t>(google::protobuf::io::CodedOutputStream::VarintSize64(v));
}

}  // namespace

WireServer::WireServer(Core* core, WireOptions options)
    : core_(core), options_(std::move(options)), read_buf_(kReadChunk) {
  max_frame_bytes_ = static_cast<uint32_t>(
      std::min<int64_t>(core_->cfg.max_value_bytes + kMessageOverheadBytes, UINT32_MAX));
  torch_limits_.max_value_bytes = static_cast<uint64_t>(core_->cfg.max_value_bytes);
  torch_limits_.max_query_bytes =
      static_cast<uint64_t>(core_->cfg.max_value_bytes + kMessageOverheadBytes);
  if (loop_.error())
    throw NetworkError(std::string("rendezvous server: cannot create the store socket loop: ") +
                       std::strerror(loop_.error()));
  thread_ = std::thread([this] { loop(); });
}

WireServer::~WireServer() { stop(); }

bool WireServer::adopt(int fd, const std::string& peer) {
  // The connection cap and the eviction of connections without their token are the gate's,
  // for both transports at once (ConnectionGate::track): nothing to count here.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto c = std::make_shared<Conn>();
  c->fd = fd;
  c->peer = peer;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || stopping_) return false;
  c->id = next_id_++;
  conns_.emplace(c->id, c);
  hellos_.emplace_back(SteadyClock::now() + options_.hello_timeout, c->id);
  ++stats_.accepted;
  loop_.add(fd, EPOLLIN | EPOLLRDHUP, c->id);
  return true;
}

void WireServer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_ = true;
  loop_.wake();
  if (thread_.joinable()) thread_.join();
  std::vector<ConnPtr> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : conns_) all.push_back(c);
  }
  for (auto& c : all) close(c);
  // A parked operation decided on another thread just before its cancel may still be
  // answering into its (closed) connection; it removes itself from `parked` last.
  auto until = SteadyClock::now() + std::chrono::seconds(10);
  for (auto& c : all) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(c->mu);
        if (c->parked.empty()) break;
      }
      if (SteadyClock::now() > until) {
        log::warn("[{}] store socket {}: parked operations still answering at shutdown",
                  core_->cfg.log_name, c->peer);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

WireStats WireServer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  WireStats s = stats_;
  s.open = static_cast<int64_t>(conns_.size());
  for (const auto& [id, c] : conns_) s.torch_open += c->torch ? 1 : 0;
  return s;
}

WireServer::ConnPtr WireServer::find(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second;
}

void WireServer::loop() {
  epoll_event events[128];
  while (!stopping_) {
    int n = loop_.wait(events, 128, nextTimeoutMs(SteadyClock::now()));
    if (n < 0) {
      log::error("[{}] store socket loop: epoll_wait: {}", core_->cfg.log_name,
                 std::strerror(errno));
      return;
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      uint64_t tag = events[i].data.u64;
      ConnPtr c = find(tag);
      if (!c) continue;
      uint32_t ev = events[i].events;
      if (ev & EPOLLOUT) {
        std::lock_guard<std::mutex> lock(c->mu);
        if (!c->closed) flushLocked(*c);
      }
      if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) onReadable(c, ev);
    }
    runResumes();
    expire(SteadyClock::now());
  }
}

int WireServer::nextTimeoutMs(SteadyClock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resumes_.empty()) return 0;  // connections with requests left from the last turn
  SteadyClock::time_point next = SteadyClock::time_point::max();
  if (!hellos_.empty()) next = hellos_.front().first;
  if (!lingers_.empty()) next = std::min(next, lingers_.front().first);
  if (next == SteadyClock::time_point::max()) return -1;
  if (next <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
}

void WireServer::expire(SteadyClock::time_point now) {
  std::vector<ConnPtr> late, done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!hellos_.empty() && hellos_.front().first <= now) {
      auto it = conns_.find(hellos_.front().second);
      if (it != conns_.end() && !it->second->authed && !it->second->lingering) {
        late.push_back(it->second);
        ++stats_.hello_timeouts;
      }
      hellos_.pop_front();
    }
    while (!lingers_.empty() && lingers_.front().first <= now) {
      auto it = conns_.find(lingers_.front().second);
      if (it != conns_.end()) done.push_back(it->second);
      lingers_.pop_front();
    }
  }
  for (auto& c : late) {
    log::debug("[{}] store socket {}: no token within {}", core_->cfg.log_name, c->peer,
               describe(options_.hello_timeout));
    fail(c, grpc::UNAUTHENTICATED,
         fmt::format("no token within {} of connecting", describe(options_.hello_timeout)));
  }
  for (auto& c : done) close(c);
}

void WireServer::runResumes() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ids.swap(resumes_);
  }
  for (uint64_t id : ids)
    if (ConnPtr c = find(id)) processFrames(c);
}

std::atomic<int64_t>& WireServer::inputCounter(const Conn& c) {
  return c.authed ? input_bytes_ : hello_bytes_;
}

void WireServer::onReadable(const ConnPtr& c, uint32_t events) {
  bool reading;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    reading = c->reading && !c->backlog;
  }
  if (!reading) {
    // Held back (back-pressure, or requests already read wait for the next turn): its input
    // stays in the kernel, which stops the client. Only its end is acted on; a client of this
    // protocol never half-closes.
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) close(c);
    return;
  }
  for (int i = 0; i < kReadsPerWake; ++i) {
    ssize_t n = recv(c->fd, read_buf_.data(), read_buf_.size(), 0);
    if (n > 0) {
      if (c->lingering) continue;  // an ended connection: its input is dropped
      auto& counter = inputCounter(*c);
      int64_t total = counter.fetch_add(n) + n;
      if (total > core_->cfg.limits.max_queued_bytes) {
        counter -= n;
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.input_refused;
        }
        fail(c, grpc::RESOURCE_EXHAUSTED,
             c->authed
                 ? fmt::format("the server already holds {} bytes of requests not yet handled, "
                               "all connections together (limit {} bytes); try again",
                               total - n, core_->cfg.limits.max_queued_bytes)
                 : fmt::format("the server already holds {} bytes of first requests not yet "
                               "complete, all connections without a token together (limit {} "
                               "bytes); try again",
                               total - n, core_->cfg.limits.max_queued_bytes));
        return;
      }
      c->in.append(read_buf_.data(), static_cast<size_t>(n));
      if (static_cast<size_t>(n) < read_buf_.size()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close(c);  // the client went away (n == 0) or the connection broke
    return;
  }
  if (!c->lingering) processFrames(c);
}

void WireServer::processFrames(const ConnPtr& c) {
  if (c->lingering) return;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->closed || !c->reading) return;
    c->batching = true;
  }
  if (c->torch) {
    processTorch(c);
    return;
  }
  size_t off = 0;
  bool ended = false;
  int handled = 0;
  while (!ended && handled < kRequestsPerTurn) {
    if (c->magic_seen < kWireMagicBytes) {
      size_t n = std::min(kWireMagicBytes - c->magic_seen, c->in.size() - off);
      if (n == 0) break;
      if (std::memcmp(c->in.data() + off, kWireMagic + c->magic_seen, n) != 0) {
        // The gate saw the magic; anything else here is a bug, not a client to answer.
        close(c);
        return;
      }
      c->magic_seen += n;
      off += n;
      continue;
    }
    if (c->in.size() - off < kFrameHeaderBytes) break;
    uint32_t len = readFrameHeader(c->in.data() + off);
    uint32_t limit = c->authed ? max_frame_bytes_ : kMaxHelloFrameBytes;
    if (len > limit) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.protocol_errors;
      }
      fail(c, c->authed ? grpc::RESOURCE_EXHAUSTED : grpc::INVALID_ARGUMENT,
           c->authed ? fmt::format("request of {} bytes: this server takes at most {} bytes "
                                   "(its max value size plus {} bytes)",
                                   len, limit, kMessageOverheadBytes)
                     : fmt::format("first request of {} bytes: it must be a ping with the "
                                   "token, at most {} bytes",
                                   len, limit));
      ended = true;
      break;
    }
    // Not reserved ahead from the header: memory follows the bytes that came, not the ones a
    // client announces.
    if (c->in.size() - off - kFrameHeaderBytes < len) break;
    pb::StoreRequest req;
    bool parsed = req.ParseFromArray(c->in.data() + off + kFrameHeaderBytes, static_cast<int>(len));
    off += kFrameHeaderBytes + len;
    if (!parsed) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.protocol_errors;
      }
      fail(c, grpc::INVALID_ARGUMENT,
           fmt::format("a frame of {} bytes is not a StoreRequest", len));
      ended = true;
      break;
    }
    if (!c->authed) {
      if (!hello(c, req)) {
        ended = true;
        break;
      }
      continue;
    }
    handle(c, req);
    ++handled;
    Next next = afterRequest(c);
    if (next == Next::kClosed) return;
    if (next == Next::kPaused) break;
  }
  bool more = false;
  if (!ended) {
    consumed(c, off);
    more = c->magic_seen == kWireMagicBytes && c->in.size() >= kFrameHeaderBytes &&
           c->in.size() - kFrameHeaderBytes >= readFrameHeader(c->in.data());
  }
  endTurn(c, ended, more);
}

WireServer::Next WireServer::afterRequest(const ConnPtr& c) {
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->closed) return Next::kClosed;
  // Over a bound while holding answers: what the socket takes now may be enough to go on.
  if (overLimitLocked(*c) && c->outBytes() > 0) flushLocked(*c);
  if (overLimitLocked(*c)) {
    // Resumed by maybeResumeLocked once answers are written or parked operations answer;
    // the requests already read wait in `in`.
    c->reading = false;
    armLocked(*c);
    ++core_->paused_reads;
    return Next::kPaused;
  }
  return Next::kGoOn;
}

void WireServer::consumed(const ConnPtr& c, size_t bytes) {
  c->in.erase(0, bytes);
  inputCounter(*c) -= static_cast<int64_t>(bytes);
}

void WireServer::endTurn(const ConnPtr& c, bool ended, bool more) {
  // A whole request left unhandled (the turn's budget is spent, or back-pressure stopped it):
  // nothing more is read from the socket until it is handled, so that what waits in `in` is
  // at most one read's worth.
  std::lock_guard<std::mutex> lock(c->mu);
  c->batching = false;
  if (c->closed) return;
  if (!ended && more != c->backlog) {
    c->backlog = more;
    armLocked(*c);
  }
  if (more && c->reading) {
    std::lock_guard<std::mutex> g(mu_);
    resumes_.push_back(c->id);  // the next turn, after the others
  }
  flushLocked(*c);
}

bool WireServer::hello(const ConnPtr& c, const pb::StoreRequest& req) {
  if (req.op_case() != pb::StoreRequest::kPing || req.id() != 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.protocol_errors;
    }
    fail(c, grpc::INVALID_ARGUMENT,
         "the first request on a store socket must be a ping with id 0 carrying the token");
    return false;
  }
  grpc::Status s = core_->authorizeToken(c->peer, req.token().empty() ? nullptr : &req.token());
  if (!s.ok()) {
    fail(c, s.error_code(), s.error_message());
    return false;
  }
  // What it has sent so far, this request included, now counts with the authorized ones.
  hello_bytes_ -= static_cast<int64_t>(c->in.size());
  input_bytes_ += static_cast<int64_t>(c->in.size());
  c->authed = true;
  ++core_->sessions;
  pb::StoreResponse resp;
  resp.set_id(0);
  ops::apply(*core_, req.ping(), resp.mutable_ping());
  respond(c, answerOf(std::move(resp)));
  return true;
}

void WireServer::handle(const ConnPtr& c, const pb::StoreRequest& req) {
  SessionStep step = runSessionRequest(*core_, req);
  if (step.what == SessionStep::kQuiet) return;
  if (step.what == SessionStep::kAnswer) {
    respond(c, answerOf(std::move(step.resp)));
    return;
  }
  uint64_t slot;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    slot = c->next_slot++;
  }
  // The callback holds the connection; the connection holds the operation until it has
  // answered: the cycle ends when the callback removes it, after its answer.
  auto op = std::make_shared<ParkedOp>(core_, std::move(step.park), step.timeout,
                                       [this, c, id = req.id(), oc = req.op_case(), slot](
                                           const grpc::Status& st, KvSpace::Values& values) {
                                         respond(c, parkedAnswer(id, oc, st, values));
                                         std::lock_guard<std::mutex> lock(c->mu);
                                         c->parked.erase(slot);
                                         maybeResumeLocked(*c);
                                       });
  startParked(c, slot, std::move(op));
}

void WireServer::startParked(const ConnPtr& c, uint64_t slot, std::shared_ptr<ParkedOp> op) {
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->parked.emplace(slot, op);
    cancelled = c->closed;
  }
  op->start();
  if (cancelled) op->cancel();  // close() ran while it was being parked and could not see it
}

void WireServer::respond(const ConnPtr& c, Answer a) {
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->closed || c->ending) return;  // nothing follows the error that ended it
  admitAnswer(*core_, a, c->outBytes());
  int64_t before = c->outBytes();
  appendAnswerLocked(*c, a);
  accountOutLocked(*c, before);
  if (!c->batching && !c->want_write) flushLocked(*c);
}

std::string& WireServer::tailLocked(Conn& c) {
  if (c.out.empty() || c.out.back().value || c.out.back().bytes.size() >= kChunkBytes)
    c.out.emplace_back();
  return c.out.back().bytes;
}

void WireServer::appendMessageLocked(Conn& c, const pb::StoreResponse& resp) {
  std::string& tail = tailLocked(c);
  size_t at = tail.size();
  appendFrame(tail, resp);
  c.out_bytes += static_cast<int64_t>(tail.size() - at);
}

void WireServer::appendAnswerLocked(Conn& c, const Answer& a) {
  bool get = a.resp.has_get();
  if (a.values.empty() || !(get || a.resp.has_multi_get())) {
    appendMessageLocked(c, a.resp);
    return;
  }
  // The frame by hand, so that the values go out from where the store keeps them: the id
  // (field 1), then the get (field 5) or multiGet (field 12) holding each value as field 1.
  int64_t sub = 0;
  for (const auto& v : a.values)
    if (!get || !v->empty()) sub += 1 + varintSize(v->size()) + static_cast<int64_t>(v->size());
  int64_t len = (a.resp.id() ? 1 + varintSize(a.resp.id()) : 0) + 1 + varintSize(sub) + sub;
  std::string* tail = &tailLocked(c);
  size_t at = tail->size();
  appendFrameHeader(*tail, static_cast<uint32_t>(len));
  if (a.resp.id()) {
    tail->push_back('\x08');
    appendVarint(*tail, a.resp.id());
  }
  tail->push_back(get ? '\x2a' : '\x62');
  appendVarint(*tail, static_cast<uint64_t>(sub));
  for (const auto& v : a.values) {
    if (get && v->empty()) continue;  // proto3 leaves an empty value out
    if (!tail) {  // the last chunk ends with a value: the next field starts a new one
      tail = &tailLocked(c);
      at = tail->size();
    }
    tail->push_back('\x0a');
    appendVarint(*tail, v->size());
    if (v->empty()) continue;
    c.out_bytes += static_cast<int64_t>(tail->size() - at) + static_cast<int64_t>(v->size());
    c.out.back().value = v;
    tail = nullptr;
  }
  if (tail) c.out_bytes += static_cast<int64_t>(tail->size() - at);
}

void WireServer::accountOutLocked(Conn& c, int64_t before) {
  int64_t now = c.outBytes();
  core_->queued_bytes += now - before;
  c.peak_out = std::max(c.peak_out, now);
}

void WireServer::dropOutLocked(Conn& c) {
  c.out.clear();
  c.out_off = 0;
  c.out_bytes = 0;
}

void WireServer::flushLocked(Conn& c) {
  int64_t before = c.outBytes();
  bool broke = false;
  while (!c.out.empty()) {
    iovec iov[kMaxIov];
    int n_iov = 0;
    size_t skip = c.out_off;
    for (auto it = c.out.begin(); it != c.out.end() && n_iov + 2 <= kMaxIov; ++it) {
      const OutChunk& k = *it;
      if (skip < k.bytes.size()) {
        iov[n_iov++] = {const_cast<char*>(k.bytes.data()) + skip, k.bytes.size() - skip};
        skip = 0;
      } else {
        skip -= k.bytes.size();
      }
      if (k.value && skip < k.value->size()) {
        iov[n_iov++] = {const_cast<uint8_t*>(k.value->data()) + skip, k.value->size() - skip};
      }
      skip = 0;
    }
    if (n_iov == 0) {  // only empty chunks left
      dropOutLocked(c);
      break;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    ssize_t n = sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      auto left = static_cast<size_t>(n);
      c.out_bytes -= n;
      while (!c.out.empty()) {
        size_t rest = c.out.front().size() - c.out_off;
        if (left < rest) {
          c.out_off += left;
          break;
        }
        left -= rest;  // written to its end: its value is let go
        c.out.pop_front();
        c.out_off = 0;
      }
      if (c.out_bytes == 0) dropOutLocked(c);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    broke = true;  // the loop sees the connection end and closes it
    dropOutLocked(c);
    shutdown(c.fd, SHUT_RDWR);
    break;
  }
  accountOutLocked(c, before);
  if (c.ending && c.out_bytes == 0 && !c.shut_wr) {
    c.shut_wr = true;
    shutdown(c.fd, SHUT_WR);  // the error was the last frame: the client reads EOF after it
  }
  bool want = c.out_bytes > 0 && !broke;
  if (want != c.want_write) {
    c.want_write = want;
    armLocked(c);
  }
  maybeResumeLocked(c);
}

void WireServer::armLocked(Conn& c) {
  if (c.closed) return;
  loop_.modify(
      c.fd, EPOLLRDHUP | (c.reading && !c.backlog ? EPOLLIN : 0u) | (c.want_write ? EPOLLOUT : 0u),
      c.id);
}

bool WireServer::overLimitLocked(const Conn& c) const {
  // One stream per connection: the connection's bound is the stream's.
  return overLimit(*core_, static_cast<int64_t>(c.parked.size()), c.outBytes(), c.outBytes());
}

void WireServer::maybeResumeLocked(Conn& c) {
  if (c.reading || c.closed || overLimitLocked(c)) return;
  c.reading = true;
  armLocked(c);
  {
    std::lock_guard<std::mutex> lock(mu_);
    resumes_.push_back(c.id);  // the frames already read are the loop's to handle
  }
  loop_.wake();
}

void WireServer::fail(const ConnPtr& c, int code, const std::string& message) {
  pb::StoreResponse resp;
  resp.set_id(0);
  setOpError(resp, grpc::Status(static_cast<grpc::StatusCode>(code), message));
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->closed || c->ending) return;
    int64_t before = c->outBytes();
    appendMessageLocked(*c, resp);
    accountOutLocked(*c, before);
    c->ending = true;
    c->reading = true;  // its input is read and dropped until the client closes
    c->backlog = false;
    armLocked(*c);
    // Writes what the socket takes now, answers owed first; the write side is shut once all
    // of it is written (here or on EPOLLOUT), or the connection closed when the linger ends.
    flushLocked(*c);
  }
  inputCounter(*c) -= static_cast<int64_t>(c->in.size());
  std::string().swap(c->in);
  c->lingering = true;
  std::lock_guard<std::mutex> lock(mu_);
  lingers_.emplace_back(SteadyClock::now() + options_.linger, c->id);
}

void WireServer::close(const ConnPtr& c) {
  std::vector<std::shared_ptr<ParkedOp>> parked;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->closed) return;
    loop_.remove(c->fd);
    // The gate forgets the descriptor first: once closed, its number may be a new
    // connection's. Nothing else holds the socket, so the close ends it for the peer.
    if (options_.before_close) options_.before_close(c->fd);
    ::close(c->fd);
    c->closed = true;
    int64_t before = c->outBytes();
    dropOutLocked(*c);
    accountOutLocked(*c, before);
    core_->released(c->peak_out + static_cast<int64_t>(c->in.capacity()));
    for (auto& [slot, op] : c->parked) parked.push_back(op);
  }
  for (auto& op : parked) op->cancel();  // their answers go nowhere: closed
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.erase(c->id);
  }
  if (!c->lingering) {
    inputCounter(*c) -= static_cast<int64_t>(c->in.size());
    std::string().swap(c->in);
  }
  if (c->authed) --core_->sessions;
  // A torch client of an attempt since replaced may have written after the attempt's keys
  // were deleted: its last use is over now.
  if (c->torch && c->scope != torch_serial_.load()) deleteTorchKeys(c->scope);
}

}  // namespace ddpl::rdzv::grpc_detail
