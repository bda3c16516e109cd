#pragma once
// What the socket-level fuzz targets share (fuzz_wire.cc: the store socket; fuzz_tcpstore.cc:
// torch's TCPStore protocol): one Core and one WireServer for the whole run, as in a server's
// life (rebuilt only when the fuzzer's sets have filled the store), and one connection per
// input: the target adopts one end of a socketpair, writes `out` to the other, half-closes,
// and reads every answer until the server closes. Findings, besides a crash or a sanitizer
// report: an answer `check` rejects (it traps); the server neither closing nor answering for
// 10 s (a hang); and the connection, its parked operations or its queued answer bytes still
// held 10 s after it ended (a leak of the server's bounds).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/protocol/wire_format.h"
#include "rendezvous/server/service_core.h"
#include "rendezvous/server/wire_server.h"

namespace ddpl::rdzv::grpc_detail::fuzz {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(10);
// The store is rebuilt past this many keys, so that a long run stays within the RSS limit.
constexpr int64_t kMaxKeys = 20000;

// Small limits, so that short inputs reach back-pressure, the value limit and the parked
// limit; a short wait cap, so that parked gets end by themselves too.
inline ServiceConfig config() {
  ServiceConfig c;
  c.token = "tok";
  c.max_value_bytes = 1024;
  c.max_wait = std::chrono::seconds(2);
  c.stats_interval = Duration(0);
  c.limits.max_stream_pending = 4;
  c.limits.max_stream_queued_bytes = 4096;
  c.limits.max_queued_bytes = 64 << 10;
  c.limits.max_parked = 16;
  return c;
}

struct World {
  std::unique_ptr<Core> core;
  std::unique_ptr<WireServer> wire;
  World() : core(std::make_unique<Core>(config())) {
    WireOptions o;
    o.hello_timeout = std::chrono::seconds(5);
    o.linger = std::chrono::milliseconds(200);
    wire = std::make_unique<WireServer>(core.get(), o);
  }
  ~World() {
    wire.reset();  // its connections' parked operations live in the core
    core.reset();
  }
};

inline World* world = nullptr;  // reachable until exit: not a leak

template <typename Pred>
inline bool within(SteadyClock::time_point until, Pred pred) {
  while (!pred()) {
    if (SteadyClock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

inline int msLeft(SteadyClock::time_point until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

// One connection: `adopt` hands the server its end; `check` takes what it can off the front of
// the answers read so far.
inline void fuzzConnection(const std::function<bool(WireServer&, int fd)>& adopt,
                           const std::string& out,
                           const std::function<void(std::string& in)>& check) {
  if (!world) world = new World;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();  // fds leak
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  // One connection at a time, each gone before the next: never at the cap.
  if (!adopt(*world->wire, sv[0])) __builtin_trap();
  std::string in;
  size_t off = 0;
  bool shut = false;
  const auto until = SteadyClock::now() + kDeadline;
  char buf[16 << 10];
  for (;;) {
    if (!shut && off == out.size()) {
      shutdown(sv[1], SHUT_WR);
      shut = true;
    }
    pollfd p{sv[1], static_cast<short>(POLLIN | (shut ? 0 : POLLOUT)), 0};
    int left = msLeft(until);
    if (left == 0) __builtin_trap();  // the server neither answered nor closed: a hang
    if (poll(&p, 1, left) < 0 && errno != EINTR) __builtin_trap();
    if (!shut && (p.revents & POLLOUT)) {
      ssize_t n = send(sv[1], out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        shut = true;  // the server ended the connection; its answers may still be readable
      }
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(sv[1], buf, sizeof(buf), 0);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
        check(in);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      break;  // EOF or reset: the server closed
    }
  }
  close(sv[1]);
  // The server lets go of everything the connection held.
  Core& core = *world->core;
  if (!within(SteadyClock::now() + kDeadline, [&] { return world->wire->stats().open == 0; }))
    __builtin_trap();
  if (!within(SteadyClock::now() + kDeadline, [&] {
        return core.queued_bytes.load() == 0 && core.parked_store.load() == 0 &&
               core.sessions.load() == 0;
      }))
    __builtin_trap();
  if (core.stats().keys > kMaxKeys) {
    delete world;
    world = nullptr;
  }
}

}  // namespace ddpl::rdzv::grpc_detail::fuzz
