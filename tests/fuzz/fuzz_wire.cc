// libFuzzer target: the store socket's server (wire_server.cc) on raw bytes. One Core and one
// WireServer serve the whole run, as in a server's life (rebuilt only when the fuzzer's sets
// have filled the store). Each input is what a client sends after the magic: the target
// adopts one end of a socketpair, writes the magic and the input to the other, half-closes,
// and reads every answer until the server closes. Findings, besides a crash or a sanitizer
// report: a whole frame from the server that is not a StoreResponse; the server neither
// closing nor answering for 10 s (a hang); and the connection, its parked operations or its
// queued answer bytes still held 10 s after it ended (a leak of the server's bounds).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "rendezvous/protocol/wire_format.h"
#include "rendezvous/server/service_core.h"
#include "rendezvous/server/wire_server.h"

using namespace ddpl;
using namespace ddpl::rdzv;
using namespace ddpl::rdzv::grpc_detail;

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(10);
// The store is rebuilt past this many keys, so that a long run stays within the RSS limit.
constexpr int64_t kMaxKeys = 20000;

// Small limits, so that short inputs reach back-pressure, the value limit and the parked
// limit; a short wait cap, so that parked gets end by themselves too.
ServiceConfig config() {
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

World* world = nullptr;  // reachable until exit: not a leak

template <typename Pred>
bool within(SteadyClock::time_point until, Pred pred) {
  while (!pred()) {
    if (SteadyClock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

int msLeft(SteadyClock::time_point until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

// Takes the whole frames off the front of `in`; traps on one that is not a StoreResponse.
void checkFrames(std::string& in) {
  size_t off = 0;
  while (in.size() - off >= kFrameHeaderBytes) {
    uint32_t len = readFrameHeader(in.data() + off);
    if (in.size() - off - kFrameHeaderBytes < len) break;
    pb::StoreResponse resp;
    if (!resp.ParseFromArray(in.data() + off + kFrameHeaderBytes, static_cast<int>(len)))
      __builtin_trap();
    off += kFrameHeaderBytes + len;
  }
  in.erase(0, off);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!world) world = new World;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) __builtin_trap();  // fds leak
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  // One connection at a time, each gone before the next: never at the cap.
  if (!world->wire->adopt(sv[0], "fuzz")) __builtin_trap();

  std::string out(kWireMagic, kWireMagicBytes);
  out.append(reinterpret_cast<const char*>(data), size);
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
        checkFrames(in);
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
  return 0;
}
