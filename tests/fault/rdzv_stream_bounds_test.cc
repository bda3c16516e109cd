// Issue 33, the gRPC side: a client that opens thousands of Session streams on one HTTP/2
// connection and never lets the server write to them (a zero flow-control window). The client
// here is a raw socket speaking HTTP/2 by hand, so that it can do what no gRPC client does:
// advertise a zero window, ignore the server's SETTINGS (and with them its stream limit), and
// open streams as fast as it can write them. The server is a real rdzv-server process: its
// memory is read from /proc. Nothing asserts on wall-clock speed.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <thread>

#include "proto/rendezvous.pb.h"
#include "rendezvous/client/grpc_store.h"
#include "tests/common/rdzv_server_process.h"
#include "tests/common/subprocess.h"

#if defined(__SANITIZE_THREAD__)
#define DDPL_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DDPL_TEST_TSAN 1
#endif
#endif

namespace ddpl::rdzv {
namespace {

namespace fs = std::filesystem;
namespace pb = ::ddpl::rendezvous::v1;
using ::ddpl::testing::eventually;
using ::ddpl::testing::rssOf;
using ::ddpl::testing::ServerProcess;
using std::chrono::milliseconds;
using std::chrono::seconds;

using ::ddpl::testing::TokenFile;

// ---- a minimal HTTP/2 client ---------------------------------------------------------------

constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoaway = 7,
                  kWindowUpdate = 8;
constexpr uint8_t kEndHeaders = 0x4, kAck = 0x1, kEndStream = 0x1;

std::string frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string f;
  uint32_t len = static_cast<uint32_t>(payload.size());
  f += static_cast<char>((len >> 16) & 0xff);
  f += static_cast<char>((len >> 8) & 0xff);
  f += static_cast<char>(len & 0xff);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  stream &= 0x7fffffff;  // the reserved bit
  for (int shift = 24; shift >= 0; shift -= 8) f += static_cast<char>((stream >> shift) & 0xff);
  return f + payload;
}

// HPACK: a literal header field without indexing, with a literal name (no Huffman). Every
// string here is shorter than 127 bytes, so each length fits the 7-bit prefix.
void literalHeader(std::string& block, const std::string& name, const std::string& value) {
  block += '\0';
  block += static_cast<char>(name.size());
  block += name;
  block += static_cast<char>(value.size());
  block += value;
}

// A gRPC message on the wire: uncompressed flag, 4-byte big-endian length, the protobuf.
std::string grpcMessage(const google::protobuf::MessageLite& r) {
  std::string body = r.SerializeAsString();
  std::string m(1, '\0');
  uint32_t len = static_cast<uint32_t>(body.size());
  for (int shift = 24; shift >= 0; shift -= 8) m += static_cast<char>((len >> shift) & 0xff);
  return m + body;
}

// One HTTP/2 connection that opens Session streams and never grants the server a byte of
// window: the server can send headers, but no message. A reader thread drains what the server
// sends and answers its pings (keepalive), acknowledging its SETTINGS only when told to.
class ZeroWindowClient {
 public:
  ZeroWindowClient(int port, std::string token, bool ack_settings)
      : token_(std::move(token)), ack_settings_(ack_settings) {
    fd_ = ::ddpl::testing::connectLoopback(port);
    EXPECT_GE(fd_, 0);
    // SETTINGS_INITIAL_WINDOW_SIZE (4) = 0: no stream may carry data to this client.
    std::string settings = std::string("\0\x04\0\0\0\0", 6);
    send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + frame(kSettings, 0, 0, settings));
    reader_ = std::thread([this] { read(); });
  }
  ~ZeroWindowClient() { close(); }

  // Opens `streams` Session streams, each sending `requests` numKeys requests; returns how
  // many were written before the server stopped taking bytes (or closed the connection).
  int openSessions(int streams, int requests) {
    std::string messages;
    for (int i = 1; i <= requests; ++i) {
      pb::StoreRequest r;
      r.set_id(static_cast<uint64_t>(i));
      r.mutable_num_keys()->set_prefix("p/");
      messages += grpcMessage(r);
    }
    return openCalls(streams, "/ddpl.rendezvous.v1.Store/Session", messages, false);
  }

  // Opens `calls` unary Wait calls for a key nobody sets, each of which parks on the server.
  int openParkedWaits(int calls) {
    pb::WaitRequest w;
    w.add_keys("never/set");
    w.set_timeout_ms(600000);
    return openCalls(calls, "/ddpl.rendezvous.v1.Store/Wait", grpcMessage(w), true);
  }

  // Opens `streams` calls of `path`, each sending `messages`, and ending its side when
  // `end_stream` (a unary call).
  int openCalls(int streams, const std::string& path, const std::string& messages,
                bool end_stream) {
    std::string block;
    literalHeader(block, ":method", "POST");
    literalHeader(block, ":scheme", "http");
    literalHeader(block, ":path", path);
    literalHeader(block, ":authority", "127.0.0.1");
    literalHeader(block, "content-type", "application/grpc");
    literalHeader(block, "te", "trailers");
    if (!token_.empty()) literalHeader(block, "x-ddpl-token", token_);
    int opened = 0;
    for (int i = 0; i < streams; ++i) {
      uint32_t id = next_stream_;
      next_stream_ += 2;
      std::string batch = frame(kHeaders, kEndHeaders, id, block);
      // The server's window for a new stream is 64 KiB at least; the connection's is what the
      // server has granted so far, waited for.
      if (!awaitWindow(static_cast<int64_t>(messages.size()))) return opened;
      for (size_t off = 0; off < messages.size(); off += 16384)
        batch += frame(kData, end_stream && off + 16384 >= messages.size() ? kEndStream : 0, id,
                       messages.substr(off, 16384));
      if (!send(batch)) return opened;
      ++opened;
    }
    return opened;
  }

  void close() {
    if (fd_ < 0) return;
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    if (reader_.joinable()) reader_.join();
    ::close(fd_);
    fd_ = -1;
  }

  int resets() const { return resets_; }
  bool goaway() const { return goaway_; }
  // The server closed the connection (its reads ended).
  bool ended() {
    std::lock_guard<std::mutex> lock(window_mu_);
    return ended_;
  }

 private:
  // Takes `bytes` of the connection's send window, once the server has granted them.
  bool awaitWindow(int64_t bytes) {
    std::unique_lock<std::mutex> lock(window_mu_);
    if (!window_cv_.wait_for(lock, seconds(5), [&] { return window_ >= bytes || ended_; }) ||
        ended_)
      return false;
    window_ -= bytes;
    return true;
  }

  bool send(const std::string& bytes) {
    std::lock_guard<std::mutex> lock(write_mu_);
    size_t off = 0;
    auto until = std::chrono::steady_clock::now() + seconds(10);
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (std::chrono::steady_clock::now() > until) return false;
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, 100);
    }
    return true;
  }

  void read() {
    std::string buf;
    char chunk[64 << 10];
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      ssize_t n = recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        std::lock_guard<std::mutex> lock(window_mu_);
        ended_ = true;
        window_cv_.notify_all();
        return;
      }
      if (n < 0) continue;
      buf.append(chunk, static_cast<size_t>(n));
      size_t off = 0;
      while (buf.size() - off >= 9) {
        auto b = reinterpret_cast<const unsigned char*>(buf.data() + off);
        uint32_t len = uint32_t{b[0]} << 16 | uint32_t{b[1]} << 8 | b[2];
        if (buf.size() - off < 9 + len) break;
        uint8_t type = b[3], flags = b[4];
        std::string payload = buf.substr(off + 9, len);
        off += 9 + len;
        if (type == kSettings && !(flags & kAck) && ack_settings_)
          send(frame(kSettings, kAck, 0, ""));
        if (type == kPing && !(flags & kAck)) send(frame(kPing, kAck, 0, payload));
        if (type == kRstStream) ++resets_;
        if (type == kWindowUpdate && len == 4 &&
            (uint32_t{b[5]} << 24 | uint32_t{b[6]} << 16 | uint32_t{b[7]} << 8 | b[8]) == 0) {
          auto w = reinterpret_cast<const unsigned char*>(payload.data());
          int64_t inc =
              int64_t{w[0] & 0x7f} << 24 | int64_t{w[1]} << 16 | int64_t{w[2]} << 8 | w[3];
          std::lock_guard<std::mutex> lock(window_mu_);
          window_ += inc;
          window_cv_.notify_all();
        }
        if (type == kGoaway) goaway_ = true;
      }
      buf.erase(0, off);
    }
  }

  int fd_ = -1;
  std::string token_;
  bool ack_settings_;
  uint32_t next_stream_ = 1;
  std::mutex write_mu_;
  std::mutex window_mu_;
  std::condition_variable window_cv_;
  int64_t window_ = 65535;  // the connection's initial send window (RFC 9113, 6.9.2)
  bool ended_ = false;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  std::atomic<int> resets_{0};
  std::atomic<bool> goaway_{false};
};

struct Attack {
  int streams = 3000;
  bool ack_settings = true;
  bool parked_waits = false;  // unary Wait calls that park, instead of Session streams
  bool check_release = true;  // the memory goes back once the client left
  std::vector<std::string> server_args;
  int64_t bound = 0;  // the most the server may grow by
};

// One connection opens `streams` Session streams with a zero window, each asking 1,030
// numKeys (max_stream_pending, 1,024, would be reached on each). The server must stay within
// `bound` meanwhile, serve another client, and give the memory back when the client leaves.
void zeroWindowAttack(const Attack& a) {
#ifdef DDPL_TEST_TSAN
  // Debian's gRPC is not built with TSan: a TSan-built server reports every hand-off between
  // gRPC's threads (scripts/test_sanitized.sh leaves the gRPC suites out for that reason).
  GTEST_SKIP() << "floods gRPC, which TSan cannot follow here";
#endif
  TokenFile token("tok");
  std::vector<std::string> args = {"--token-file", token.path()};
  args.insert(args.end(), a.server_args.begin(), a.server_args.end());
  ServerProcess server(args);
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.token = "tok";
  o.socket = false;  // gRPC, on a connection of its own
  o.connect_timeout = seconds(20);
  connectGrpcStore(o)->set("p/k", toBytes("v"));  // the server has served a call
  const int64_t baseline = rssOf(server.pid());
  ASSERT_GT(baseline, 0);
  ZeroWindowClient hostile(server.port(), "tok", a.ack_settings);
  int opened = 0;
  std::thread opener([&] {
    opened =
        a.parked_waits ? hostile.openParkedWaits(a.streams) : hostile.openSessions(a.streams, 1030);
  });
  // Settled: the server's memory stops moving once it has read what it will.
  int64_t peak = baseline, last = -1;
  int still = 0;
  for (int i = 0; i < 300 && still < 15; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    int64_t rss = rssOf(server.pid());
    peak = std::max(peak, rss);
    still = std::llabs(rss - last) < (1 << 20) ? still + 1 : 0;
    last = rss;
  }
  opener.join();
  peak = std::max(peak, rssOf(server.pid()));
  // Another client is served meanwhile.
  auto good = connectGrpcStore(o);
  EXPECT_EQ(good->add("n", 1), 1);
  EXPECT_EQ(toString(good->get("p/k", seconds(10))), "v");
  EXPECT_LT(peak - baseline, a.bound)
      << fmt::format("server grew by {} MiB; the client opened {} streams, {} were reset{}",
                     (peak - baseline) >> 20, opened, hostile.resets(),
                     hostile.goaway() ? ", then the connection went away" : "");
  // The client's writes may all fit in the socket's buffers before a slow server reads them
  // (an ASan build): what says the limit held is that the server ended the connection.
  if (a.parked_waits)
    EXPECT_TRUE(eventually([&] { return hostile.ended() || hostile.goaway(); }, seconds(20)))
        << "the server let one connection park all " << opened
        << " calls instead of ending it past its limit (" << hostile.resets()
        << " streams reset); the server's log:\n"
        << server.log();
  hostile.close();
  if (!a.check_release) return;
#ifndef DDPL_TEST_ASAN
  // An ASan-built server keeps what it frees in its quarantine: its memory cannot go back.
  EXPECT_TRUE(eventually([&] { return rssOf(server.pid()) - baseline < (32 << 20); }, seconds(20)))
      << fmt::format("server still {} MiB above its baseline after the client left",
                     (rssOf(server.pid()) - baseline) >> 20);
#endif
}

// The first finding: one token-holding connection opened 6,000 Session streams with a
// zero window, each asking 1,030 numKeys: the server grew by 818 MB while its own count said
// 30 MB were queued, and kept 772 MB after the client left (3,000 streams: 412 MiB, 415 MiB
// kept). A connection holds at most 1,024 streams now (ConnectionLimits::
// max_streams_per_connection, HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS): gRPC ends one that
// opens more, and the memory goes back.
TEST(StreamBoundsTest, ThousandsOfZeroWindowSessionStreamsOnOneConnectionStayBounded) {
  Attack a;
  a.bound = int64_t{160} << 20;
  zeroWindowAttack(a);
}

// gRPC 1.51 holds a client to the stream limit only once it has acknowledged the server's
// SETTINGS: this one never does. The server counts Session streams per connection itself and
// ends the connection past the limit.
TEST(StreamBoundsTest, AClientIgnoringTheStreamLimitIsBoundedByTheServerItself) {
  Attack a;
  a.ack_settings = false;
  a.bound = int64_t{160} << 20;
  zeroWindowAttack(a);
}

// Parked unary calls pin gRPC's call state as streams do, and count against the same limit:
// the server ends a connection that parks more than 1,024 (it let one park 6,000, up to
// --max-parked, 100,000). What they held is not checked to go back: gRPC's freed call state
// went back to the system on a quiet machine and stayed (88-115 MiB) under load, with or
// without the limit.
TEST(StreamBoundsTest, ParkedUnaryCallsCountAgainstTheConnectionsLimitToo) {
  Attack a;
  a.streams = 6000;
  a.ack_settings = false;
  a.parked_waits = true;
  a.check_release = false;
  a.bound = int64_t{160} << 20;
  a.server_args = {"--log-level", "debug"};  // its log names each refusal, for a failure
  zeroWindowAttack(a);
}

// Under the stream limit, the streams of one connection share one budget for their queued
// answers (max_stream_queued_bytes, 8 MiB here), and each answer counts what it costs in
// memory, not its 6 bytes on the wire: 1,000 streams of 1,024 numKeys answers each used to
// take 140 MiB while the server counted 6 MiB.
TEST(StreamBoundsTest, StreamsOfOneConnectionShareOneBudgetThatCountsWhatAnswersCost) {
  Attack a;
  a.streams = 1000;
  a.server_args = {"--max-stream-queued-bytes", std::to_string(8 << 20)};
  a.bound = int64_t{96} << 20;
  zeroWindowAttack(a);
}

}  // namespace
}  // namespace ddpl::rdzv
