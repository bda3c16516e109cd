// libFuzzer target: the checkpoint replica protocol (launcher/checkpoint/replica.h), both ends.
// Even first byte: the rest is what a peer sends a ReplicaServer after "DDPLREP1 <secret> " (a
// peer of the job knows the secret; without it the inputs would only meet the secret check),
// over a real loopback connection to one server that lives for the whole run, with small
// budgets, in a private folder under /dev/shm. Odd first byte: the rest is a peer's answer to
// listSteps (second byte even) or fetchStep (odd), served by a thread of this harness.
// Findings besides a crash or a sanitizer report: the server neither answering nor closing
// within 10 s, and a client that throws anything but ddpl::Error (an unchecked number from
// the wire, say): each traps.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "common/errors.h"
#include "launcher/checkpoint/replica.h"

using namespace ddpl::launcher;
namespace fs = std::filesystem;

namespace {

constexpr int kDeadlineMs = 10000;

// Removed at exit (libFuzzer's run ends with exit()).
char base_dir[] = "/dev/shm/ddpl-fuzz-replica-XXXXXX";

std::string baseDir() {
  static const bool made = [] {
    if (!mkdtemp(base_dir)) __builtin_trap();
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(base_dir, ec);
    });
    return true;
  }();
  (void)made;
  return base_dir;
}

// One for the whole run; its folder is emptied every so many inputs (between two of them, when
// no connection is open), so that a long run stays within /dev/shm. Not rebuilt: a new server
// thread's first allocations, made after the input that started it returned, were once taken
// by LeakSanitizer for that input's leak.
ReplicaServer* server() {
  static std::unique_ptr<ReplicaServer> s;
  static int inputs = 0;
  const std::string dir = baseDir() + "/server";
  if (!s) s = std::make_unique<ReplicaServer>(dir, 64 << 10, 1 << 20, 2);
  if (++inputs % 2000 == 0) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
  }
  return s.get();
}

// Closed with a reset: a hundred thousand connections a minute would otherwise leave their
// ports in TIME_WAIT until connect() finds none free.
void abortOnClose(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// The server's port on loopback. Tried for up to a second: once in four runs of a minute, on a
// machine busy with other builds, a connect failed at once (the errno was not printed then);
// a server that stays unreachable is still a finding.
int connectLoopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int attempt = 0;; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      abortOnClose(fd);
      return fd;
    }
    fprintf(stderr, "connect to the replica server: %s\n", strerror(errno));
    if (fd >= 0) close(fd);
    if (attempt == 100) __builtin_trap();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void serverSide(const std::string& bytes) {
  ReplicaServer* s = server();
  int fd = connectLoopback(s->port());
  std::string out = "DDPLREP1 " + s->secret() + " " + bytes;
  // The server reads the request line first and the rest as it needs it: what it leaves unread
  // is dropped with the connection.
  size_t off = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDeadlineMs);
  bool shut = false;
  char buf[4096];
  for (;;) {
    if (!shut && off == out.size()) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    until - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) __builtin_trap();  // neither answered nor closed: a hang
    pollfd p{fd, static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    if (poll(&p, 1, left) < 0) continue;
    if (!shut && (p.revents & POLLOUT)) {
      ssize_t n = send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0)
        off += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        shut = true;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;
      break;  // closed
    }
  }
  close(fd);
}

// A peer that answers one request with `answer` and closes.
void clientSide(bool fetch, const std::string& answer) {
  static int listen_fd = -1, port = 0;
  if (listen_fd < 0) {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listen_fd, 4) != 0 ||
        getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      __builtin_trap();
    port = ntohs(a.sin_port);
  }
  std::thread peer([&] {
    int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    abortOnClose(c);
    char ch;
    while (recv(c, &ch, 1, 0) == 1 && ch != '\n') {
    }
    (void)!send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
    // The client closes first (a reset now could overtake the answer), then this end resets.
    shutdown(c, SHUT_WR);
    timeval tv{10, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (recv(c, &ch, 1, 0) > 0) {
    }
    close(c);
  });
  ReplicaEndpoint e{"127.0.0.1", port, std::string(32, 'a')};
  const std::string rank_dir = baseDir() + "/client";
  try {
    if (fetch)
      (void)fetchStep(e, 0, 7, rank_dir, 5);
    else
      (void)listSteps(e, 0, 1, 5);
  } catch (const ddpl::Error&) {
    // refused, malformed or cut short: said so, documented
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    __builtin_trap();
  } catch (...) {
    __builtin_trap();
  }
  peer.join();
  std::error_code ec;
  fs::remove_all(rank_dir, ec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if (data[0] % 2 == 0)
    serverSide(std::string(1, static_cast<char>(data[1])) + rest);
  else
    clientSide(data[1] % 2, rest);
  return 0;
}
