// The store's socket transport, client side: a SessionLink over a plain TCP socket that the
// calling threads write and read themselves (wire_format.h has the protocol).
//
// No thread of its own: whichever thread waits for an answer reads the socket (one at a time,
// `reading_`), hands every answer it finds to its operation, and stops when its own has come
// or its deadline passed; the other waiters sleep on cv_ and one of them takes over. With one
// caller a round trip is one send and one recv, where the gRPC stream costs several thread
// hand-offs (docs/bench-rendezvous.md §7). Writes go out whole, one thread at a time
// (write_mu_), in the order the requests were registered.
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "rendezvous/client/session_link.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/wire_format.h"

namespace ddpl::rdzv::grpc_detail {
namespace {

// The socket's own send/recv timeout: a blocked call returns this often to look at its
// deadline, so that a deadline is overshot by at most this much.
constexpr std::chrono::milliseconds kSlice{50};
// How long a write may block (the server not reading) before the link is given up.
constexpr Duration kWriteTimeout{std::chrono::seconds(30)};
// What one recv asks for: answers are small, and a frame announced larger gets room for all
// of it at once (ensureRoom). 64 KiB here cost 1,024 ranks 64 MiB of zeroed pages.
constexpr size_t kReadChunk = 4 << 10;
// An operation that follows the last sign of life by more than this looks at the socket
// first (peerStillThere).
constexpr std::chrono::milliseconds kIdleProbeAfter{2};
// Longest single recv wait: a deadline further away is checked again after this.
constexpr std::chrono::milliseconds kMaxRecvWait{std::chrono::seconds(60)};
// A receive timeout at least this long is kept for longer waits too (armRecvTimeout).
constexpr std::chrono::milliseconds kKeepRecvTimeoutFrom{std::chrono::seconds(1)};
// Largest answer accepted: a value of the largest size a server may be configured with
// (1 GiB, server.cc) and the rest of the message.
constexpr uint32_t kMaxAnswerBytes = (uint32_t{1} << 30) + (uint32_t{1} << 20);

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

bool splitEndpoint(const std::string& endpoint, std::string* host, std::string* port) {
  if (endpoint.empty()) return false;
  if (endpoint.front() == '[') {
    auto close = endpoint.find("]:");
    if (close == std::string::npos) return false;
    *host = endpoint.substr(1, close - 1);
    *port = endpoint.substr(close + 2);
  } else {
    auto colon = endpoint.rfind(':');
    if (colon == std::string::npos || endpoint.find(':') != colon) return false;
    *host = endpoint.substr(0, colon);
    *port = endpoint.substr(colon + 1);
  }
  if (host->empty() || port->empty()) return false;
  for (char ch : *port)
    if (ch < '0' || ch > '9') return false;
  return true;
}

// Connects within `timeout`; returns the blocking socket, or -1 with `why` set.
int connectTo(const std::string& host, const std::string& port, Duration timeout,
              std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *why = fmt::format("cannot resolve '{}': {}", host, gai_strerror(rc));
    return -1;
  }
  auto deadline = Clock::now() + timeout;
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
      *why = std::strerror(errno);
      continue;
    }
    // A blocking connect bounded by SO_SNDTIMEO (Linux applies it to connect): two system
    // calls where a non-blocking connect costs five (1,024 ranks connect at once).
    auto left = std::chrono::ceil<std::chrono::microseconds>(deadline - Clock::now()).count();
    left = std::max<int64_t>(left, 1000);
    timeval limit{static_cast<time_t>(left / 1000000), static_cast<suseconds_t>(left % 1000000)};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    int rc;
    do {
      rc = connect(s, ai->ai_addr, ai->ai_addrlen);
    } while (rc != 0 && errno == EINTR && Clock::now() < deadline);
    if (rc != 0) {
      *why = errno == EINPROGRESS || errno == EAGAIN ? "connect timed out" : std::strerror(errno);
      ::close(s);
      continue;
    }
    fd = s;
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A server whose host vanished without closing the connection is found within about 20 s,
  // as gRPC's keepalive pings would (a parked get may otherwise wait for its whole timeout).
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 10, interval = 5, count = 2;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  // Sends block at most a slice at a time, to look at their deadline; the receive timeout is
  // set by the first reader (armRecvTimeout).
  timeval tv{0, static_cast<suseconds_t>(
                    std::chrono::duration_cast<std::chrono::microseconds>(kSlice).count())};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

class WireLink : public SessionLink {
 public:
  WireLink(int fd, std::string endpoint, std::shared_ptr<DeferredError> deferred)
      : SessionLink(std::move(deferred)), fd_(fd), endpoint_(std::move(endpoint)) {}

  ~WireLink() override { ::close(fd_); }

  Sent send(pb::StoreRequest& req, const std::shared_ptr<PendingOp>& op,
            const std::string& quiet_what = {}) override {
    std::lock_guard<std::mutex> writing(write_mu_);
    if (!peerStillThere()) return Sent::kBroken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) return Sent::kBroken;
      if (registerLocked(req, op, quiet_what) == Sent::kNoRoom) return Sent::kNoRoom;
    }
    frame_.clear();
    if (!greeted_) {
      frame_.append(kWireMagic, kWireMagicBytes);
      greeted_ = true;
    }
    appendFrame(frame_, req);
    std::string why;
    // Registered already: if the write fails, breaking the link fails the operation.
    if (!writeAll(frame_, &why))
      breakLink(
          grpc::Status(grpc::UNAVAILABLE,
                       fmt::format("the store stream broke (socket: writing failed: {})", why)));
    if (frame_.capacity() > (1 << 20)) std::string().swap(frame_);
    return Sent::kYes;
  }

  bool await(PendingOp& op, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(read_mu_);
    for (;;) {
      if (op.isDone()) return true;
      if (Clock::now() >= deadline) return false;
      if (reading_) {
        // The reader wakes us when it stops (its answer came, or its deadline passed).
        read_cv_.wait_until(lock, deadline);
        continue;
      }
      reading_ = true;
      lock.unlock();
      armRecvTimeout(deadline);
      readOnce();
      lock.lock();
      reading_ = false;
      read_cv_.notify_all();  // the answer read may be another waiter's; one of them reads next
    }
  }

  void close(Duration) override {
    breakLink(
        grpc::Status(grpc::UNAVAILABLE, "the store stream broke (socket: closed by the client)"));
  }

 private:
  grpc::Status whyBroken() override {
    std::lock_guard<std::mutex> lock(why_mu_);
    return why_.ok() ? grpc::Status(grpc::UNAVAILABLE, "the store stream broke (socket)") : why_;
  }

  void breakLink(const grpc::Status& why) {
    {
      std::lock_guard<std::mutex> lock(why_mu_);
      if (why_.ok()) why_ = why;
    }
    // Wakes a reader blocked in recv at once; the descriptor stays ours until destruction.
    shutdown(fd_, SHUT_RDWR);
    onBroken(whyBroken());
    std::lock_guard<std::mutex> lock(read_mu_);
    read_cv_.notify_all();
  }

  // Nobody reads the socket between operations, so a server that went away is seen only
  // when the next operation reads. A request sent into a closed connection would then fail
  // although nothing was done; after a pause, a look at the socket (one non-blocking peek)
  // finds the close first, and the request goes on a new connection instead (kBroken:
  // nothing sent). Back-to-back operations skip it.
  bool peerStillThere() {
    int64_t now = nowNs();
    if (now - last_alive_.load(std::memory_order_relaxed) <
        std::chrono::nanoseconds(kIdleProbeAfter).count())
      return true;
    char b;
    ssize_t n = recv(fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
      last_alive_.store(now, std::memory_order_relaxed);
      return true;
    }
    if (!answered_.load()) return true;  // the greeting: its answer tells
    breakLink(grpc::Status(grpc::UNAVAILABLE,
                           fmt::format("the store stream broke (socket: {})",
                                       n == 0 ? "the server closed it" : std::strerror(errno))));
    return false;
  }

  bool writeAll(const std::string& data, std::string* why) {
    auto deadline = Clock::now() + kWriteTimeout;
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (Clock::now() < deadline) continue;
        *why = fmt::format("the server took nothing for {}", describe(kWriteTimeout));
        return false;
      }
      *why = n == 0 ? "connection closed" : std::strerror(errno);
      return false;
    }
    return true;
  }

  // The reading thread's: one recv (at most one slice), then every whole answer in the buffer.
  void readOnce() {
    ensureRoom();
    ssize_t n = recv(fd_, in_.data() + in_end_, in_.size() - in_end_, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      // Before the first answer, a server that closes on our greeting does not know it (a
      // gRPC-only server rejects the bytes as a bad HTTP/2 preface, a TLS one as a bad record).
      breakLink(answered_ ? grpc::Status(
                                grpc::UNAVAILABLE,
                                fmt::format("the store stream broke (socket: {})",
                                            n == 0 ? "the server closed it" : std::strerror(errno)))
                          : notServed(n == 0 ? "it closed the connection" : std::strerror(errno)));
      return;
    }
    in_end_ += static_cast<size_t>(n);
    last_alive_.store(nowNs(), std::memory_order_relaxed);
    for (;;) {
      size_t avail = in_end_ - in_off_;
      if (avail < kFrameHeaderBytes) break;
      uint32_t len = readFrameHeader(in_.data() + in_off_);
      if (len > kMaxAnswerBytes) {
        breakLink(answered_ ? grpc::Status(grpc::INTERNAL,
                                           fmt::format("the store socket sent a frame of {} "
                                                       "bytes, more than any answer",
                                                       len))
                            : notServed("its answer is not a store frame"));
        return;
      }
      if (avail - kFrameHeaderBytes < len) break;
      pb::StoreResponse resp;
      bool ok =
          resp.ParseFromArray(in_.data() + in_off_ + kFrameHeaderBytes, static_cast<int>(len));
      in_off_ += kFrameHeaderBytes + len;
      if (!ok || (!answered_ && resp.id() != 0)) {
        breakLink(answered_
                      ? grpc::Status(grpc::INTERNAL, "the store socket sent a malformed answer")
                      : notServed("its answer is not a store frame"));
        return;
      }
      answered_ = true;
      onResponse(resp);
    }
    if (in_off_ == in_end_) {
      in_off_ = in_end_ = 0;
      if (in_.size() > (4u << 20)) std::vector<char>(kReadChunk).swap(in_);
    }
  }

  // The reading thread's: lets recv block until about `deadline`. A waiting thread then
  // sleeps in one recv instead of waking every slice (1,024 ranks waiting on a barrier would
  // otherwise wake 20,000 times a second); the option is changed only when the deadline
  // would be overshot by more than a slice, or when it is far too short.
  void armRecvTimeout(Clock::time_point deadline) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    left = std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(kMaxRecvWait));
    // Kept while it does not overshoot the deadline by more than a slice and is either half
    // of what is left or long enough that waking once per period costs nothing
    // (kKeepRecvTimeoutFrom). A shorter one only means the recv returns early and the wait
    // goes on in the next; without this rule each connection set the option twice (the
    // greeting's connect timeout, then an operation's 60 s).
    if (recv_timeout_ <= left + kSlice &&
        (recv_timeout_ * 2 >= left || recv_timeout_ >= kKeepRecvTimeoutFrom))
      return;
    timeval tv{static_cast<time_t>(left.count() / 1000),
               static_cast<suseconds_t>((left.count() % 1000) * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    recv_timeout_ = left;
  }

  // Room for one more chunk, and for the whole of a frame whose header has come.
  void ensureRoom() {
    size_t held = in_end_ - in_off_;
    if (in_off_ > 0 && in_.size() - in_end_ < kReadChunk) {
      std::memmove(in_.data(), in_.data() + in_off_, held);
      in_off_ = 0;
      in_end_ = held;
    }
    size_t want = in_end_ + kReadChunk;
    if (held >= kFrameHeaderBytes)
      want = std::max(want, in_off_ + kFrameHeaderBytes + readFrameHeader(in_.data() + in_off_));
    if (in_.size() < want) in_.resize(std::max(want, in_.size() * 2));
  }

  grpc::Status notServed(const std::string& what) const {
    return grpc::Status(
        grpc::UNIMPLEMENTED,
        fmt::format("{} did not answer the store socket's greeting: {}", endpoint_, what));
  }

  int fd_;
  std::string endpoint_;
  std::mutex write_mu_;   // one writer at a time; taken before mu_
  std::string frame_;     // under write_mu_
  bool greeted_ = false;  // under write_mu_: the magic went out
  std::mutex read_mu_;    // guards reading_; read_cv_ wakes waiters when a reader is done
  std::condition_variable read_cv_;
  bool reading_ = false;
  // The reader's alone (one reader at a time):
  std::vector<char> in_;
  size_t in_off_ = 0, in_end_ = 0;
  std::atomic<bool> answered_{false};  // the server answered: set by readers, read by writers
  std::chrono::milliseconds recv_timeout_{0};  // SO_RCVTIMEO as set now (0: none yet)
  // nowNs() when the socket last showed life; a connect that has just succeeded is one, so
  // the greeting is not preceded by a peek.
  std::atomic<int64_t> last_alive_{nowNs()};
  std::mutex why_mu_;
  grpc::Status why_;  // why the link broke (OK while it works)
};

}  // namespace

grpc::Status openWireLink(const std::string& endpoint, const std::string& token, Duration timeout,
                          std::shared_ptr<DeferredError> deferred,
                          std::shared_ptr<SessionLink>* link, int64_t* max_value_bytes) {
  std::string host, port, why;
  if (!splitEndpoint(endpoint, &host, &port))
    return grpc::Status(grpc::UNIMPLEMENTED, fmt::format("'{}' is not host:port", endpoint));
  auto start = Clock::now();
  int fd = connectTo(host, port, timeout, &why);
  if (fd < 0)
    return grpc::Status(grpc::UNAVAILABLE, fmt::format("cannot connect to {}: {}", endpoint, why));
  auto l = std::make_shared<WireLink>(fd, endpoint, std::move(deferred));
  auto left = std::chrono::ceil<Duration>(start + timeout - Clock::now());
  grpc::Status s = l->handshake(std::max(left, Duration(1)), max_value_bytes, token);
  if (!s.ok()) return s;
  *link = std::move(l);
  return grpc::Status::OK;
}

}  // namespace ddpl::rdzv::grpc_detail
