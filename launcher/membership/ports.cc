#include "launcher/membership/ports.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"

namespace ddpl::launcher {
namespace {

// Returns the bound port, or -errno.
int tryBind(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    throw NetworkError(fmt::format("cannot resolve address '{}': {}", addr, gai_strerror(rc)));
  int result = -EADDRNOTAVAIL;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    // Same option TCPStore uses, so a port in TIME_WAIT counts as free, as it is for rank 0.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      result = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      close(fd);
      break;
    }
    result = -errno;
    close(fd);
  }
  freeaddrinfo(res);
  return result;
}

}  // namespace

int pickFreePort(const std::string& addr) {
  int port = tryBind(addr, 0);
  if (port <= 0)
    throw NetworkError(
        fmt::format("cannot bind any port on '{}': {}; is it an address of this "
                    "machine? (--master-addr)",
                    addr, std::strerror(-port)));
  return port;
}

void checkPortFree(const std::string& addr, int port) {
  int rc = tryBind(addr, port);
  if (rc == -EADDRINUSE)
    throw NetworkError(fmt::format(
        "{}:{} is already in use (--master-port): stop what holds it (ss -ltnp 'sport = :{}'), "
        "pick another port, or leave --master-port out to get a free one",
        addr, port, port));
  if (rc < 0)
    throw NetworkError(fmt::format("cannot bind {}:{} (--master-addr/--master-port): {}", addr,
                                   port, std::strerror(-rc)));
}

std::string routeAddressTo(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
    throw NetworkError(fmt::format("cannot resolve rendezvous host '{}'", host));
  std::string out;
  for (addrinfo* ai = res; ai && out.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      char buf[INET6_ADDRSTRLEN] = {0};
      if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
      else
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
      out = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty())
    throw NetworkError(fmt::format("no route to the rendezvous host '{}' from this machine", host));
  return out;
}

int pickMasterPort(const std::string& master_addr, const std::string& local_addr) {
  std::string bind_addr = local_addr.empty() ? "0.0.0.0" : local_addr;
  return pickFreePort(isLoopback(master_addr) ? "127.0.0.1" : bind_addr);
}

}  // namespace ddpl::launcher
