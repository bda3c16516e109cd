#include "common/peer_uid.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace ddpl {
namespace {

// The kernel's TCP states (include/net/tcp_states.h) whose sockets report no owner: a closed
// connection's TIME_WAIT remnant and a half-open request say uid 0, which is not root's.
constexpr uint8_t kTimeWait = 6;
constexpr uint8_t kNewSynRecv = 12;

struct Endpoint {
  int family = AF_UNSPEC;
  uint16_t port = 0;      // network order
  uint32_t addr[4] = {};  // network order; IPv4 in addr[0]
  std::string text;
};

// An IPv4-mapped IPv6 address is the IPv4 socket's (a "::" listener serving IPv4 sees its
// clients so): the kernel finds the client's socket by its IPv4 4-tuple.
Endpoint endpointOf(const sockaddr_storage& ss) {
  Endpoint e;
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    e.family = AF_INET;
    e.port = a->sin_port;
    std::memcpy(&e.addr[0], &a->sin_addr, 4);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    e.text = fmt::format("{}:{}", buf, ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    e.port = a->sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      e.family = AF_INET;
      std::memcpy(&e.addr[0], &a->sin6_addr.s6_addr[12], 4);
      inet_ntop(AF_INET, &e.addr[0], buf, sizeof(buf));
      e.text = fmt::format("{}:{}", buf, ntohs(a->sin6_port));
    } else {
      e.family = AF_INET6;
      std::memcpy(e.addr, &a->sin6_addr, 16);
      inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
      e.text = fmt::format("[{}]:{}", buf, ntohs(a->sin6_port));
    }
  }
  return e;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::atomic<uint32_t> g_sequence{1};

}  // namespace

PeerUid tcpPeerUid(const sockaddr_storage& local, const sockaddr_storage& peer,
                   std::chrono::milliseconds timeout) {
  const Endpoint l = endpointOf(local), p = endpointOf(peer);
  if (l.family == AF_UNSPEC || p.family == AF_UNSPEC || l.family != p.family)
    return {std::nullopt,
            fmt::format("not a TCP connection over IPv4 or IPv6 ({} from {})",
                        l.text.empty() ? "?" : l.text, p.text.empty() ? "?" : p.text)};
  const std::string names = fmt::format("the client {} of {}", p.text, l.text);
  Fd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (nl.get() < 0)
    return {std::nullopt, fmt::format("cannot ask the kernel who owns {}: netlink sock_diag: {}",
                                      names, std::strerror(errno))};
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  const uint32_t sequence = g_sequence.fetch_add(1);
  ask.header.nlmsg_len = sizeof(ask);
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;  // no NLM_F_DUMP: the one socket with this 4-tuple
  ask.header.nlmsg_seq = sequence;
  ask.request.sdiag_family = static_cast<uint8_t>(l.family);
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0u;
  // The client's socket: its own address is the peer's, its destination the server's.
  ask.request.id.idiag_sport = p.port;
  ask.request.id.idiag_dport = l.port;
  std::memcpy(ask.request.id.idiag_src, p.addr, sizeof(p.addr));
  std::memcpy(ask.request.id.idiag_dst, l.addr, sizeof(l.addr));
  ask.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  const auto until = std::chrono::steady_clock::now() + timeout;
  if (::sendto(nl.get(), &ask, sizeof(ask), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(ask)))
    return {std::nullopt, fmt::format("cannot ask the kernel who owns {}: netlink sock_diag: {}",
                                      names, std::strerror(errno))};
  // One answer: the socket's record, or an error (ENOENT: no such socket in this namespace).
  alignas(nlmsghdr) char buf[8192];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd pfd{nl.get(), POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&pfd, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0)
      return {std::nullopt, fmt::format("the kernel did not say who owns {} within {} ms", names,
                                        timeout.count())};
    sockaddr_nl from{};
    socklen_t from_len = sizeof(from);
    ssize_t n = ::recvfrom(nl.get(), buf, sizeof(buf), MSG_DONTWAIT,
                           reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0)
      return {std::nullopt, fmt::format("cannot read who owns {}: netlink sock_diag: {}", names,
                                        std::strerror(errno))};
    if (from.nl_pid != 0) continue;  // only the kernel answers this socket
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != sequence) continue;
      if (h->nlmsg_type == NLMSG_ERROR) {
        int error = 0;
        if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr)))
          error = -static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
        if (error == ENOENT)
          return {std::nullopt,
                  fmt::format("{} is not a socket of this host (another machine, or another "
                              "network namespace), or it is gone",
                              names)};
        return {std::nullopt, fmt::format("the kernel would not say who owns {}: {}", names,
                                          std::strerror(error))};
      }
      if (h->nlmsg_type == NLMSG_DONE)
        return {std::nullopt, fmt::format("{} is not a socket of this host", names)};
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
          h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg)))
        continue;
      const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      // The socket asked for, not another (a listener, which the kernel falls back to when no
      // connection has the 4-tuple): its addresses and ports must be the ones asked for. An
      // IPv6 client socket connected to an IPv4 address (torch's client makes those) answers
      // an IPv4 question with IPv4-mapped addresses.
      const bool mapped = l.family == AF_INET && m->idiag_family == AF_INET6;
      uint32_t want_src[4] = {p.addr[0], p.addr[1], p.addr[2], p.addr[3]};
      uint32_t want_dst[4] = {l.addr[0], l.addr[1], l.addr[2], l.addr[3]};
      if (mapped) {
        want_src[0] = want_src[1] = want_dst[0] = want_dst[1] = 0;
        want_src[2] = want_dst[2] = htonl(0xffff);
        want_src[3] = p.addr[0];
        want_dst[3] = l.addr[0];
      }
      const size_t bytes = m->idiag_family == AF_INET ? 4 : 16;
      if ((m->idiag_family != l.family && !mapped) || m->id.idiag_sport != p.port ||
          m->id.idiag_dport != l.port || std::memcmp(m->id.idiag_src, want_src, bytes) != 0 ||
          std::memcmp(m->id.idiag_dst, want_dst, bytes) != 0)
        return {std::nullopt, fmt::format("the kernel answered for another socket than {}", names)};
      if (m->idiag_state == kTimeWait || m->idiag_state == kNewSynRecv)
        return {std::nullopt, fmt::format("{} is closed already (TCP state {}): it has no owner",
                                          names, m->idiag_state)};
      return {m->idiag_uid, ""};
    }
  }
}

PeerUid peerUidOf(int fd, std::chrono::milliseconds timeout) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
    return {std::nullopt, fmt::format("getsockname: {}", std::strerror(errno))};
  if (local.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
      return {std::nullopt, fmt::format("SO_PEERCRED: {}", std::strerror(errno))};
    if (cred.pid == 0) return {std::nullopt, "the Unix socket has no peer"};
    return {static_cast<uint32_t>(cred.uid), ""};
  }
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return {std::nullopt, fmt::format("getpeername: {}", std::strerror(errno))};
  return tcpPeerUid(local, peer, timeout);
}

}  // namespace ddpl
