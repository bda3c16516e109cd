#include "rendezvous/server/connection_gate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/log.h"
#include "common/peer_uid.h"
#include "rendezvous/protocol/tcpstore_format.h"
#include "rendezvous/protocol/wire_format.h"

namespace ddpl::rdzv::grpc_detail {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr auto kSweepInterval = std::chrono::seconds(1);
// Out of descriptors (EMFILE) the listening socket stays readable: accepting again at once
// would spin, so the gate waits this long first.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr auto kWarnInterval = std::chrono::seconds(10);
// The loop's tags for the listening sockets and the sniffed connections; connections use their
// fd. (The loop's wake-up eventfd has its own: EventLoop::kWakeTag.)
constexpr uint64_t kListenTag = uint64_t{1} << 40;
constexpr uint64_t kSniffTag = uint64_t{1} << 42;

// gRPC names a peer by grpc_sockaddr_to_uri: "ipv4:1.2.3.4:5", "ipv6:[::1]:5", with
// IPv4-mapped IPv6 addresses written as IPv4.
std::string peerName(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    return fmt::format("ipv4:{}:{}", buf, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      in_addr v4;
      std::memcpy(&v4, &a->sin6_addr.s6_addr[12], sizeof(v4));
      inet_ntop(AF_INET, &v4, buf, sizeof(buf));
      return fmt::format("ipv4:{}:{}", buf, ntohs(a->sin6_port));
    }
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    return fmt::format("ipv6:[{}]:{}", buf, ntohs(a->sin6_port));
  }
  return "unknown";
}

uint64_t inodeOf(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

std::string hostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[')
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

}  // namespace

ConnectionGate::ConnectionGate(const std::string& host, int port, GateOptions options)
    : options_(std::move(options)) {
  std::string h = host;
  if (!h.empty() && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(h.empty() ? nullptr : h.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    throw NetworkError(fmt::format("rendezvous server cannot listen on {}: {}",
                                   hostPort(host, port), gai_strerror(rc)));
  bool has_v4 = false;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) has_v4 |= ai->ai_family == AF_INET;
  std::string why;
  int bound_port = port;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      // "::" alone serves IPv4 too, as gRPC's listener does; next to an IPv4 address of its
      // own it must not take that port.
      int v6only = has_v4 ? 1 : 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    sockaddr_storage ss{};
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (bound_port != 0) {
      if (ss.ss_family == AF_INET)
        reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(static_cast<uint16_t>(bound_port));
      else
        reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(static_cast<uint16_t>(bound_port));
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&ss), ai->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      close(fd);
      // One address of several may be missing (no IPv6 here); a port taken is fatal.
      if (errno == EADDRINUSE) {
        for (int l : listen_fds_) close(l);
        listen_fds_.clear();
        break;
      }
      continue;
    }
    sockaddr_storage got{};
    socklen_t len = sizeof(got);
    getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len);
    bound_port = ntohs(got.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&got)->sin_port
                                                : reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
    listen_fds_.push_back(fd);
  }
  freeaddrinfo(res);
  if (listen_fds_.empty())
    throw NetworkError(fmt::format("rendezvous server cannot listen on {}: {}",
                                   hostPort(host, port), why.empty() ? "no usable address" : why));
  port_ = bound_port;
  if (loop_.error()) {
    std::string e = std::strerror(loop_.error());
    for (int l : listen_fds_) close(l);
    throw NetworkError("rendezvous server: cannot create its accept loop: " + e);
  }
  for (size_t i = 0; i < listen_fds_.size(); ++i)
    loop_.add(listen_fds_[i], EPOLLIN, kListenTag | i);
}

ConnectionGate::~ConnectionGate() { stop(); }

void ConnectionGate::start(
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  next_sweep_ = SteadyClock::now() + kSweepInterval;
  thread_ = std::thread([this] { loop(); });
}

void ConnectionGate::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  loop_.wake();
  if (thread_.joinable()) thread_.join();
  for (int l : listen_fds_) close(l);
  listen_fds_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  // The duplicates only; gRPC's own descriptors end with its Shutdown, the store socket's
  // (no duplicate) with the WireServer's.
  for (auto& [dup, c] : conns_)
    if (!c.wire) close(dup);
  conns_.clear();
  for (auto& [fd, sn] : sniffing_) close(fd);
  sniffing_.clear();
  sniff_order_.clear();
  by_peer_.clear();
  by_grpc_fd_.clear();
}

void ConnectionGate::loop() {
  epoll_event events[64];
  while (!stopping_) {
    int timeout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      timeout = nextTimeoutMs(SteadyClock::now());
    }
    int n = loop_.wait(events, 64, timeout);
    if (n < 0) {
      log::error("[{}] accept loop: epoll_wait: {}", options_.log_name, std::strerror(errno));
      return;
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag & kListenTag) {
        acceptAll(listen_fds_[tag & ~kListenTag]);
      } else if (tag & kSniffTag) {
        sniff(static_cast<int>(tag & ~kSniffTag));
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        dropLocked(static_cast<int>(tag));
      }
    }
    auto now = SteadyClock::now();
    std::vector<std::pair<int, Sniffing>> silent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      expireSniffsLocked(now, silent);
    }
    for (auto& [fd, sn] : silent) handToGrpc(sn.listen_fd, fd, sn.peer);
    std::lock_guard<std::mutex> lock(mu_);
    runDueClosesLocked(now);
    if (now >= next_sweep_) {
      sweepLocked();
      next_sweep_ = now + kSweepInterval;
    }
    if (accept_paused_until_ != SteadyClock::time_point{} && now >= accept_paused_until_) {
      accept_paused_until_ = {};
      for (size_t i = 0; i < listen_fds_.size(); ++i)
        loop_.modify(listen_fds_[i], EPOLLIN, kListenTag | i);
    }
  }
}

int ConnectionGate::nextTimeoutMs(SteadyClock::time_point now) const {
  auto next = next_sweep_;
  if (!sniff_order_.empty()) next = std::min(next, sniff_order_.front().first);
  if (accept_paused_until_ != SteadyClock::time_point{})
    next = std::min(next, accept_paused_until_);
  if (close_pending_)
    for (const auto& [dup, c] : conns_)
      if (c.close_at != SteadyClock::time_point{} && !c.closing) next = std::min(next, c.close_at);
  if (next <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
}

void ConnectionGate::acceptAll(int listen_fd) {
  while (!stopping_) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(listen_fd, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog; try again soon.
    int err = errno;
    size_t held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held = conns_.size() + sniffing_.size();  // the store socket's included
    }
    warnRateLimited(
        fmt::format("cannot accept a connection: {}; {} held (raise the open-file "
                    "limit or lower --max-connections)",
                    std::strerror(err), held));
    std::lock_guard<std::mutex> lock(mu_);
    accept_paused_until_ = SteadyClock::now() + kAcceptPause;
    for (size_t i = 0; i < listen_fds_.size(); ++i) loop_.modify(listen_fds_[i], 0, kListenTag | i);
    return;
  }
}

void ConnectionGate::admit(int listen_fd, int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  std::string peer = peerName(ss);
  bool at_cap;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // gRPC closed a connection without shutting it down and the kernel gave its number to
    // this one: that old connection is over.
    if (auto it = by_grpc_fd_.find(fd); it != by_grpc_fd_.end()) {
      auto c = conns_.find(it->second);
      // A store socket's entry is its own descriptor, which its WireServer forgets here
      // before closing (wireClosed): were one left, the number is the newcomer's now.
      if (c != conns_.end() && !c->second.wire) shutDownLocked(c->second);
      dropLocked(it->second);
    }
    at_cap = static_cast<int64_t>(conns_.size() + sniffing_.size()) >= options_.max_connections;
    if (at_cap && !evictOneLocked()) {
      ++stats_.rejected_at_cap;
      lock.unlock();
      close(fd);
      warnRateLimited(fmt::format(
          "refused a connection from {}: {} connections held, the limit (--max-connections), "
          "and every one has made an authorized call",
          peer, options_.max_connections));
      return;
    }
    ++stats_.accepted;
  }
  if (!options_.adopt_wire && !options_.adopt_torch) {
    handToGrpc(listen_fd, fd, peer);
    return;
  }
  // gRPC's or the store socket's: its first bytes tell. A client of the store socket sends
  // them as soon as its connect returns, before this accept, so they are usually here
  // already (1,024 ranks connecting save an epoll turn each). At the cap, though, each
  // newcomer evicted a connection whose store-socket file closes only on the socket loop's
  // next turn: those wait their epoll turn here, or a flood of them runs the server out of
  // files before the loop catches up.
  if (Route to = at_cap ? Route::kWait : firstBytesSay(fd); to != Route::kWait) {
    route(listen_fd, fd, peer, to);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto until = SteadyClock::now() + options_.sniff_timeout;
  sniffing_[fd] = Sniffing{listen_fd, peer, until};
  sniff_order_.emplace_back(until, fd);
  // Added after the look: an edge-triggered add still reports bytes that came in between.
  loop_.add(fd, EPOLLIN | EPOLLRDHUP | EPOLLET, kSniffTag | static_cast<uint64_t>(fd));
}

ConnectionGate::Route ConnectionGate::firstBytesSay(int fd) {
  char buf[kWireMagicBytes];
  static_assert(kWireMagicBytes >= tcpstore::kHelloBytes);
  ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Route::kWait;
  if (n <= 0) return Route::kGone;
  auto len = static_cast<size_t>(n);
  // torch's TCPStore client opens with VALIDATE (a zero byte, which neither HTTP/2's preface
  // nor TLS nor our magic starts with) and its magic number.
  if (buf[0] == 0) {
    size_t k = std::min(len, tcpstore::kHelloBytes);
    if (std::memcmp(buf, tcpstore::kHello, k) != 0) return Route::kGrpc;
    return k == tcpstore::kHelloBytes ? Route::kTorch : Route::kWait;
  }
  if (std::memcmp(buf, kWireMagic, len) != 0) return Route::kGrpc;
  // A prefix of the magic: the next bytes raise another edge.
  return len == kWireMagicBytes ? Route::kWire : Route::kWait;
}

void ConnectionGate::sniff(int fd) {
  Route to = firstBytesSay(fd);
  if (to == Route::kWait) return;
  Sniffing sn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sniffing_.find(fd);
    if (it == sniffing_.end()) return;
    sn = std::move(it->second);
    sniffing_.erase(it);
    loop_.remove(fd);
  }
  route(sn.listen_fd, fd, sn.peer, to);
}

void ConnectionGate::route(int listen_fd, int fd, const std::string& peer, Route to) {
  // Not served here: gRPC drops what is not HTTP/2.
  if ((to == Route::kTorch && !options_.adopt_torch) || (to == Route::kWire && !options_.adopt_wire))
    to = Route::kGrpc;
  if (to == Route::kTorch && options_.torch_uid && !torchClientAdmitted(fd, peer))
    to = Route::kGone;
  if (to == Route::kGone) {
    close(fd);
  } else if (to == Route::kWire || to == Route::kTorch) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++(to == Route::kWire ? stats_.to_wire : stats_.to_torch);
    }
    // Tracked like gRPC's, before the store socket can see its token: it counts against the
    // one cap until it ends, and it can be evicted to make room until it has shown its token.
    if (!track(fd, peer, /*wire=*/true)) {
      close(fd);
      warnRateLimited(
          fmt::format("refused a store socket from {}: {}", peer, std::strerror(errno)));
    } else if (!(to == Route::kWire ? options_.adopt_wire(fd, peer)
                                      : options_.adopt_torch(fd, peer))) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto g = by_grpc_fd_.find(fd); g != by_grpc_fd_.end()) dropLocked(g->second);
      }
      close(fd);
      // A torch client refused says why itself (not one of the job's nodes, no store yet).
      if (to == Route::kWire)
        warnRateLimited(
            fmt::format("refused a store socket from {}: at the connection limit", peer));
    }
  } else {
    handToGrpc(listen_fd, fd, peer);
  }
}

bool ConnectionGate::torchClientAdmitted(int fd, const std::string& peer) {
  // A blocking netlink exchange on the gate's thread, bounded by kPeerUidTimeout; the kernel
  // answers in microseconds.
  const PeerUid owner = peerUidOf(fd);
  const uint32_t uid = *options_.torch_uid;
  if (owner.uid && *owner.uid == uid) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.refused_uid;
  }
  if (owner.uid)
    warnRateLimited(fmt::format(
        "refused a torch TCPStore client from {}: its socket is uid {}'s, and this store "
        "serves only the job's user, uid {}: torch's protocol has no token, so only the job's "
        "own processes may use it (run the client as uid {}; with --standalone, other users "
        "may use the store through DDPL_STORE_ADDR with the job's DDPL_STORE_TOKEN)",
        peer, *owner.uid, uid, uid));
  else
    warnRateLimited(fmt::format(
        "refused a torch TCPStore client from {}: cannot tell which user it runs as ({}), and "
        "this store serves only the job's user, uid {}",
        peer, owner.why, uid));
  return false;
}

void ConnectionGate::expireSniffsLocked(SteadyClock::time_point now,
                                        std::vector<std::pair<int, Sniffing>>& late) {
  while (!sniff_order_.empty() && sniff_order_.front().first <= now) {
    auto [until, fd] = sniff_order_.front();
    sniff_order_.pop_front();
    auto it = sniffing_.find(fd);
    if (it == sniffing_.end() || it->second.until != until) continue;  // gone, or a newer one
    loop_.remove(fd);
    late.emplace_back(fd, std::move(it->second));
    sniffing_.erase(it);
  }
}

bool ConnectionGate::track(int fd, const std::string& peer, bool wire) {
  // gRPC's connection: a duplicate of our own, to watch for its end and to end it, since gRPC
  // may close its descriptor without telling (its inode says when). The store socket's
  // WireServer tells the gate before it closes (wireClosed), so its own descriptor serves:
  // no duplicate to make and close, no inode to look up, one file per connection.
  int dup_fd = wire ? fd : fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  Conn c;
  c.dup_fd = dup_fd;
  c.grpc_fd = fd;
  c.inode = wire ? 0 : inodeOf(fd);
  c.peer = peer;
  c.order = next_order_++;
  c.wire = wire;
  if (!wire) {
    // Only the end of the connection: its data is gRPC's to read. (The store socket tells
    // of its ends itself: wireClosed.)
    loop_.add(dup_fd, EPOLLRDHUP, static_cast<uint64_t>(dup_fd));
  }
  by_peer_[peer] = dup_fd;
  by_grpc_fd_[fd] = dup_fd;
  conns_.emplace(dup_fd, std::move(c));
  return true;
}

void ConnectionGate::handToGrpc(int listen_fd, int fd, const std::string& peer) {
  if (!track(fd, peer, /*wire=*/false)) {
    close(fd);
    warnRateLimited(fmt::format("refused a connection from {}: {}", peer, std::strerror(errno)));
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
  p.listener_fd = listen_fd;
  p.fd = fd;
  acceptor_->HandleNewConnection(&p);
}

void ConnectionGate::dropLocked(int dup_fd) {
  auto it = conns_.find(dup_fd);
  if (it == conns_.end()) return;
  if (!it->second.wire) loop_.remove(dup_fd);
  if (auto p = by_peer_.find(it->second.peer); p != by_peer_.end() && p->second == dup_fd)
    by_peer_.erase(p);
  if (auto g = by_grpc_fd_.find(it->second.grpc_fd); g != by_grpc_fd_.end() && g->second == dup_fd)
    by_grpc_fd_.erase(g);
  if (!it->second.wire) close(dup_fd);  // a store socket's is its WireServer's to close
  conns_.erase(it);
}

void ConnectionGate::shutDownLocked(Conn& c) {
  if (c.closing) return;
  c.closing = true;
  // Both directions: gRPC's reads see the end of the stream and it tears the transport
  // down; the peer sees FIN. The entry goes when its HUP arrives.
  shutdown(c.dup_fd, SHUT_RDWR);
}

bool ConnectionGate::evictOneLocked() {
  // A connection that has not even sent its first bytes goes first.
  while (!sniff_order_.empty()) {
    auto [until, fd] = sniff_order_.front();
    sniff_order_.pop_front();
    auto it = sniffing_.find(fd);
    if (it == sniffing_.end() || it->second.until != until) continue;
    loop_.remove(fd);
    close(fd);
    sniffing_.erase(it);
    ++stats_.evicted;
    return true;
  }
  Conn* oldest = nullptr;
  for (auto& [dup, c] : conns_)
    if (!c.authorized && !c.closing && (!oldest || c.order < oldest->order)) oldest = &c;
  if (!oldest) return false;
  ++stats_.evicted;
  shutDownLocked(*oldest);
  // Forgotten now rather than at its HUP, so that the newcomer fits under the cap at once.
  dropLocked(oldest->dup_fd);
  return true;
}

void ConnectionGate::sweepLocked() {
  std::vector<int> gone;
  for (auto& [dup, c] : conns_)
    if (!c.wire && inodeOf(c.grpc_fd) != c.inode) gone.push_back(dup);
  for (int dup : gone) {
    // gRPC closed its descriptor without shutdown(2) (a failed handshake): only our
    // duplicate holds the socket open, so end it for the peer too.
    shutdown(dup, SHUT_RDWR);
    dropLocked(dup);
  }
}

void ConnectionGate::runDueClosesLocked(SteadyClock::time_point now) {
  if (!close_pending_) return;
  bool more = false;
  for (auto& [dup, c] : conns_) {
    if (c.close_at == SteadyClock::time_point{} || c.closing) continue;
    if (c.close_at <= now) {
      ++stats_.closed_refused;
      shutDownLocked(c);
    } else {
      more = true;
    }
  }
  close_pending_ = more;
}

void ConnectionGate::wireClosed(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  auto g = by_grpc_fd_.find(fd);
  if (g == by_grpc_fd_.end()) return;  // evicted already, or the gate stopped
  auto c = conns_.find(g->second);
  if (c != conns_.end() && c->second.wire) dropLocked(g->second);
}

void ConnectionGate::noteCall(const std::string& peer, bool authorized) {
  bool wake_up = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_peer_.find(peer);
    if (it == by_peer_.end()) return;
    Conn& c = conns_.at(it->second);
    if (authorized) {
      c.authorized = true;
      c.close_at = {};
    } else if (!c.authorized && c.close_at == SteadyClock::time_point{}) {
      c.close_at = SteadyClock::now() + options_.refused_close_delay;
      close_pending_ = wake_up = true;
    }
  }
  if (wake_up) loop_.wake();
}

void ConnectionGate::closePeer(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return;
  shutDownLocked(conns_.at(it->second));
}

GateStats ConnectionGate::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  GateStats s = stats_;
  // The store socket counts its own (ServerStats adds them).
  int64_t wire = 0;
  for (const auto& [dup, c] : conns_) wire += c.wire;
  s.open = static_cast<int64_t>(conns_.size() + sniffing_.size()) - wire;
  return s;
}

void ConnectionGate::warnRateLimited(const std::string& what) {
  int64_t skipped = 0;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = SteadyClock::now();
    if (warned_at_ != SteadyClock::time_point{} && now - warned_at_ < kWarnInterval) {
      ++unwarned_;
      last_unwarned_ = what;
      return;
    }
    warned_at_ = now;
    skipped = unwarned_;
    unwarned_ = 0;
    last = std::move(last_unwarned_);
  }
  if (skipped > 0)
    log::warn("[{}] {} more like this in the last {}s (latest: {})", options_.log_name, skipped,
              std::chrono::duration_cast<std::chrono::seconds>(kWarnInterval).count(), last);
  log::warn("[{}] {}", options_.log_name, what);
}

}  // namespace ddpl::rdzv::grpc_detail
