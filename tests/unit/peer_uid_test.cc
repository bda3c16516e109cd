// common/peer_uid.h: who owns the other end of a connection, as the kernel says (sock_diag for
// TCP, SO_PEERCRED for Unix sockets). Real sockets on loopback; the other user is `nobody`
// (65534), for which the test must run as root (CI does): without root those cases skip.
#include "common/peer_uid.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace ddpl {
namespace {

constexpr uint32_t kNobody = 65534;

struct Listener {
  int fd = -1;
  sockaddr_storage address{};
  explicit Listener(int family) {
    fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(*a);
    } else {
      // "::" serving IPv4 too: its IPv4 clients come as IPv4-mapped IPv6 addresses.
      int v6only = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      len = sizeof(*a);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 16) != 0) {
      ::close(fd);
      fd = -1;
      return;
    }
    len = sizeof(address);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len);
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  int port() const {
    return ntohs(address.ss_family == AF_INET
                     ? reinterpret_cast<const sockaddr_in*>(&address)->sin_port
                     : reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  // The next connection, within 5 s (-1 if none).
  int accept() const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return -1;
    return ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
};

// A client socket connected to `port` on the IPv4 or IPv6 loopback address.
int connectTo(int port, int family = AF_INET) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    a->sin6_addr = in6addr_loopback;
    len = sizeof(*a);
  }
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(PeerUid, OurOwnLoopbackClientIsOurs) {
  Listener l(AF_INET);
  ASSERT_GE(l.fd, 0);
  int client = connectTo(l.port());
  ASSERT_GE(client, 0);
  int server = l.accept();
  ASSERT_GE(server, 0);
  PeerUid got = peerUidOf(server);
  ASSERT_TRUE(got.uid) << got.why;
  EXPECT_EQ(*got.uid, ::geteuid());
  // And the other way: the server's socket, seen from the client.
  got = peerUidOf(client);
  ASSERT_TRUE(got.uid) << got.why;
  EXPECT_EQ(*got.uid, ::geteuid());
  ::close(client);
  ::close(server);
}

TEST(PeerUid, IPv6AndIPv4MappedClientsAreFound) {
  Listener l(AF_INET6);
  if (l.fd < 0) GTEST_SKIP() << "no IPv6 on this host";
  for (int family : {AF_INET, AF_INET6}) {
    int client = connectTo(l.port(), family);
    if (client < 0 && family == AF_INET6) continue;  // no ::1 here
    ASSERT_GE(client, 0);
    int server = l.accept();
    ASSERT_GE(server, 0);
    PeerUid got = peerUidOf(server);
    ASSERT_TRUE(got.uid) << (family == AF_INET ? "IPv4-mapped: " : "IPv6: ") << got.why;
    EXPECT_EQ(*got.uid, ::geteuid());
    ::close(client);
    ::close(server);
  }
}

// An IPv6 socket connected to an IPv4 address (torch's TCPStore client makes those): the
// kernel answers the IPv4 question with the IPv4-mapped addresses of an IPv6 socket.
TEST(PeerUid, AnIPv6ClientOfAnIPv4ServerIsFound) {
  Listener l(AF_INET);
  ASSERT_GE(l.fd, 0);
  int client = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(static_cast<uint16_t>(l.port()));
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &a.sin6_addr), 1);
  if (::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(client);
    GTEST_SKIP() << "no IPv6 sockets here";
  }
  int server = l.accept();
  ASSERT_GE(server, 0);
  PeerUid got = peerUidOf(server);
  ASSERT_TRUE(got.uid) << got.why;
  EXPECT_EQ(*got.uid, ::geteuid());
  ::close(client);
  ::close(server);
}

// The one that matters: the client's socket is another user's, the server's (the accepted
// one, with the same two addresses the other way round) ours. A lookup that asked for the
// wrong end would say ours.
TEST(PeerUid, AClientRunningAsAnotherUserIsThatUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching to uid 65534 (nobody) needs root";
  Listener l(AF_INET);
  ASSERT_GE(l.fd, 0);
  int ready[2], hold[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
  const int port = l.port();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(hold[1]);
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)
      ::_exit(3);
    int c = connectTo(port);
    if (c < 0) ::_exit(4);
    char one = 1;
    if (::write(ready[1], &one, 1) != 1) ::_exit(5);
    char any;
    (void)::read(hold[0], &any, 1);  // until the parent has looked
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(hold[0]);
  char one = 0;
  pollfd p{ready[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ASSERT_EQ(::read(ready[0], &one, 1), 1);
  int server = l.accept();
  ASSERT_GE(server, 0);
  PeerUid got = peerUidOf(server);
  ::close(hold[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_TRUE(got.uid) << got.why;
  EXPECT_EQ(*got.uid, kNobody);
  ::close(server);
  ::close(ready[0]);
}

// Another machine's client has no socket here: no owner, and the reason says so.
TEST(PeerUid, ARemotePeerHasNoOwnerHere) {
  Listener l(AF_INET);
  ASSERT_GE(l.fd, 0);
  sockaddr_storage remote{};
  auto* a = reinterpret_cast<sockaddr_in*>(&remote);
  a->sin_family = AF_INET;
  a->sin_port = htons(40000);
  inet_pton(AF_INET, "192.0.2.9", &a->sin_addr);  // TEST-NET-1
  PeerUid got = tcpPeerUid(l.address, remote);
  EXPECT_FALSE(got.uid);
  EXPECT_NE(got.why.find("192.0.2.9:40000"), std::string::npos) << got.why;
  EXPECT_NE(got.why.find("not a socket of this host"), std::string::npos) << got.why;
}

// A client that closed first leaves its TIME_WAIT remnant, which the kernel reports as uid 0:
// that is nobody's, not root's.
TEST(PeerUid, AClosedClientsRemnantHasNoOwner) {
  Listener l(AF_INET);
  ASSERT_GE(l.fd, 0);
  int client = connectTo(l.port());
  ASSERT_GE(client, 0);
  int server = l.accept();
  ASSERT_GE(server, 0);
  sockaddr_storage local{}, peer{};
  socklen_t len = sizeof(local);
  ::getsockname(server, reinterpret_cast<sockaddr*>(&local), &len);
  len = sizeof(peer);
  ::getpeername(server, reinterpret_cast<sockaddr*>(&peer), &len);
  ::close(client);  // the active close: the client's end goes to TIME_WAIT
  char buf[1];
  pollfd p{server, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ASSERT_EQ(::read(server, buf, 1), 0);
  ::close(server);
  PeerUid got;
  // The client's FIN_WAIT2 becomes TIME_WAIT when the server's FIN arrives (at once here).
  for (int i = 0; i < 100; ++i) {
    got = tcpPeerUid(local, peer);
    if (!got.uid) break;
    ::usleep(10000);
  }
  EXPECT_FALSE(got.uid) << "owner " << *got.uid << " reported for a closed client";
}

TEST(PeerUid, AUnixSocketsPeerIsItsCredentials) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  PeerUid got = peerUidOf(pair[0]);
  ASSERT_TRUE(got.uid) << got.why;
  EXPECT_EQ(*got.uid, ::geteuid());
  ::close(pair[0]);
  ::close(pair[1]);
}

}  // namespace
}  // namespace ddpl
