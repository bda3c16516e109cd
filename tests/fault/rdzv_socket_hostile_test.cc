// The store's socket transport (wire_format.h, wire_server.cc) under hostile clients: wrong and
// missing tokens, silent and slow hellos, oversized and malformed frames, a client that
// pipelines parked gets or large answers and never reads, a thousand tokenless sockets under a
// 1024-file limit. Each client here is a raw TCP socket speaking the protocol by hand, so the
// test sees exactly what the server sends (frames, then EOF) and nothing a client library
// would smooth over. Servers are in-process on loopback port 0 (their stats are read
// directly) or real rdzv-server processes (their memory, files and log read from /proc and
// the log file). Nothing asserts on wall-clock speed.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>
#include <thread>

#include "proto/rendezvous.pb.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/wire_format.h"
#include "rendezvous/server/server.h"
#include "tests/common/rdzv_server_process.h"
#include "tests/common/subprocess.h"

namespace ddpl::rdzv {
namespace {

namespace fs = std::filesystem;
namespace pb = ::ddpl::rendezvous::v1;
using ::ddpl::testing::eventually;
using grpc_detail::appendFrame;
using grpc_detail::appendFrameHeader;
using grpc_detail::kWireMagic;
using grpc_detail::kWireMagicBytes;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr int kUnauthenticated = 16;  // grpc::UNAUTHENTICATED
constexpr int kInvalidArgument = 3;
constexpr int kResourceExhausted = 8;

using ::ddpl::testing::count;
using ::ddpl::testing::openFilesOf;
using ::ddpl::testing::rssOf;
using ::ddpl::testing::OpenFilesRaised;
using ::ddpl::testing::ServerProcess;
using ::ddpl::testing::tooFewOpenFiles;

using ::ddpl::testing::TokenFile;

std::unique_ptr<Store> connectStore(const std::string& endpoint, const std::string& token = "",
                                    bool socket = true) {
  GrpcStoreOptions o;
  o.endpoint = endpoint;
  o.token = token;
  o.socket = socket;
  o.connect_timeout = seconds(20);
  return connectGrpcStore(o);
}

pb::StoreRequest pingRequest(uint64_t id, const std::string& token) {
  pb::StoreRequest r;
  r.set_id(id);
  r.mutable_ping();
  if (!token.empty()) r.set_token(token);
  return r;
}

pb::StoreRequest getRequest(uint64_t id, const std::string& key, int64_t timeout_ms) {
  pb::StoreRequest r;
  r.set_id(id);
  r.mutable_get()->set_key(key);
  r.mutable_get()->set_timeout_ms(timeout_ms);
  return r;
}

pb::StoreRequest setRequest(uint64_t id, const std::string& key, const std::string& value) {
  pb::StoreRequest r;
  r.set_id(id);
  r.mutable_set()->set_key(key);
  r.mutable_set()->set_value(value);
  return r;
}

std::string frameOf(const pb::StoreRequest& r) {
  std::string s;
  appendFrame(s, r);
  return s;
}

std::string headerOf(uint32_t len) {
  std::string s;
  appendFrameHeader(s, len);
  return s;
}

// A raw client of the store socket: it writes what it is told (the magic first, unless told
// not to) and reads the server's frames one at a time, each with a timeout.
class RawClient {
 public:
  enum class Got { kFrame, kEof, kTimeout, kBadFrame };

  explicit RawClient(int port, bool magic = true) {
    fd_ = ::ddpl::testing::connectLoopback(port);
    EXPECT_GE(fd_, 0) << "cannot connect to port " << port << ": " << std::strerror(errno);
    if (fd_ >= 0 && magic) EXPECT_TRUE(send(std::string(kWireMagic, kWireMagicBytes)));
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Writes all of `bytes` within `timeout`; false once the server stops taking them (it does
  // not read, or it closed the connection).
  bool send(const std::string& bytes, milliseconds timeout = seconds(20)) {
    size_t done = sendSome(bytes, timeout);
    return done == bytes.size();
  }
  // As much of `bytes` as the server takes within `timeout`.
  size_t sendSome(const std::string& bytes, milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;
      auto left =
          std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    }
    return off;
  }
  bool sendFrame(const pb::StoreRequest& r) { return send(frameOf(r)); }

  // The next frame from the server, or its end (EOF or a reset), or nothing within `timeout`.
  Got next(pb::StoreResponse* resp, milliseconds timeout = seconds(20)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (buf_.size() >= grpc_detail::kFrameHeaderBytes) {
        uint32_t len = grpc_detail::readFrameHeader(buf_.data());
        if (buf_.size() - grpc_detail::kFrameHeaderBytes >= len) {
          bool ok = resp->ParseFromArray(buf_.data() + grpc_detail::kFrameHeaderBytes,
                                         static_cast<int>(len));
          buf_.erase(0, grpc_detail::kFrameHeaderBytes + len);
          return ok ? Got::kFrame : Got::kBadFrame;
        }
      }
      auto left =
          std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (r == 0) return Got::kTimeout;
      if (r < 0 && errno == EINTR) continue;
      char chunk[64 << 10];
      ssize_t n = recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) {
        buf_.append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return Got::kEof;
    }
  }
  // Bytes received that do not make a whole frame (nonzero at EOF: a truncated frame).
  size_t leftover() const { return buf_.size(); }

  // Sends the first request (a ping with id 0 and the token) and returns its answer.
  pb::StoreResponse hello(const std::string& token) {
    EXPECT_TRUE(sendFrame(pingRequest(0, token)));
    pb::StoreResponse resp;
    EXPECT_EQ(next(&resp), Got::kFrame);
    return resp;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// The server's answer is one OpError with `code` whose message contains `text`, then the end of
// the connection with nothing after it.
void expectErrorThenEof(RawClient& c, int code, const std::string& text,
                        milliseconds timeout = seconds(20)) {
  pb::StoreResponse resp;
  ASSERT_EQ(c.next(&resp, timeout), RawClient::Got::kFrame) << "expected an error: " << text;
  ASSERT_TRUE(resp.has_error()) << resp.DebugString();
  EXPECT_EQ(resp.id(), 0u);
  EXPECT_EQ(resp.error().code(), code) << resp.error().message();
  EXPECT_THAT(resp.error().message(), HasSubstr(text));
  pb::StoreResponse more;
  EXPECT_EQ(c.next(&more, seconds(20)), RawClient::Got::kEof) << more.DebugString();
  EXPECT_EQ(c.leftover(), 0u);
}

// Closed by the server without its token: EOF, after the hello timeout's error when it was
// held that long (evicted ones get no frame).
// Returns whether it was told.
bool expectClosedWithoutToken(RawClient& c) {
  pb::StoreResponse resp;
  RawClient::Got got = c.next(&resp, seconds(20));
  bool told = got == RawClient::Got::kFrame;
  if (told) {
    EXPECT_EQ(resp.error().code(), kUnauthenticated) << resp.DebugString();
    EXPECT_THAT(resp.error().message(), HasSubstr("no token within 10s of connecting"));
    got = c.next(&resp, seconds(20));
  }
  EXPECT_EQ(got, RawClient::Got::kEof);
  return told;
}

// ---- the token -----------------------------------------------------------------------------

// A wrong token and a missing one are each answered UNAUTHENTICATED, and the connection ends;
// the right token gets the server's value limit and a working store.
TEST(StoreSocketTokenTest, WrongOrMissingTokenIsRefusedThenClosedAndTheRightOneWorks) {
  ServerOptions o;
  o.token = "s3cret";
  o.max_value_bytes = 3 << 20;
  RendezvousServer server(o);
  {
    RawClient c(server.port());
    ASSERT_TRUE(c.sendFrame(pingRequest(0, "guess")));
    expectErrorThenEof(c, kUnauthenticated, "the call's token does not match the server's");
  }
  {
    RawClient c(server.port());
    ASSERT_TRUE(c.sendFrame(pingRequest(0, "")));
    expectErrorThenEof(c, kUnauthenticated, "this server requires a token and the call had none");
  }
  {
    // Requests pipelined behind a refused hello are never run.
    RawClient c(server.port());
    ASSERT_TRUE(c.send(frameOf(pingRequest(0, "guess")) + frameOf(setRequest(1, "sneaky", "x"))));
    expectErrorThenEof(c, kUnauthenticated, "does not match");
  }
  EXPECT_EQ(server.stats().unauthenticated_calls, 3);
  RawClient c(server.port());
  pb::StoreResponse hello = c.hello("s3cret");
  ASSERT_TRUE(hello.has_ping()) << hello.DebugString();
  EXPECT_EQ(hello.id(), 0u);
  EXPECT_EQ(hello.ping().max_value_bytes(), 3 << 20);
  ASSERT_TRUE(c.send(frameOf(setRequest(1, "k", "v")) + frameOf(getRequest(2, "k", 1000)) +
                     frameOf(getRequest(3, "sneaky", 0))));
  pb::StoreResponse resp;
  ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.id(), 1u);
  EXPECT_TRUE(resp.has_set()) << resp.DebugString();
  ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.id(), 2u);
  EXPECT_EQ(resp.get().value(), "v");
  ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.id(), 3u);
  ASSERT_TRUE(resp.has_error()) << "the refused client's set ran: " << resp.DebugString();
  EXPECT_EQ(resp.error().code(), 4);  // DEADLINE_EXCEEDED: the key was never set
  EXPECT_EQ(server.stats().unauthenticated_calls, 3);
}

// Three hundred sockets with a wrong token, one after another: each is refused and closed, and
// the log says so in a line per interval with a count, not a line per socket.
TEST(StoreSocketTokenTest, FloodOfRefusedSocketsLogsABoundedNumberOfLines) {
  TokenFile token("tok");
  ServerProcess server({"--token-file", token.path()});
  constexpr int kSockets = 300;
  for (int i = 0; i < kSockets; ++i) {
    RawClient c(server.port());
    ASSERT_TRUE(c.sendFrame(pingRequest(0, fmt::format("wrong{}", i))));
    expectErrorThenEof(c, kUnauthenticated, "does not match");
    if (::testing::Test::HasFailure()) return;
  }
  // The first refusal is logged at once, the others counted and logged when the interval
  // (10 s) ends: all of them accounted for.
  std::regex counted("refused (\\d+) calls without a valid token");
  auto accounted = [&] {
    std::string log = server.log();
    int n = count(log, "refused a call from");
    for (std::sregex_iterator it(log.begin(), log.end(), counted), end; it != end; ++it)
      n += std::stoi((*it)[1]);
    return n;
  };
  EXPECT_TRUE(eventually([&] { return accounted() == kSockets; }, seconds(30)))
      << accounted() << " refusals logged of " << kSockets << ":\n"
      << server.log();
  std::string log = server.log();
  EXPECT_LT(count(log, "refused"), 10) << log;
  EXPECT_THAT(log, HasSubstr("wrong token"));
}

// protobuf logs a line for each message it refuses for a string field that is not UTF-8:
// something any peer can send, without the token. 200 of them used to write 200 lines.
TEST(StoreSocketTokenTest, InvalidUtf8DoesNotFloodTheLog) {
  TokenFile token("tok");
  ServerProcess server({"--token-file", token.path()});
  constexpr int kSockets = 200;
  for (int i = 0; i < kSockets; ++i) {
    RawClient c(server.port());
    // Serialized with a placeholder, then patched: protobuf would complain here too.
    std::string frame = frameOf(pingRequest(0, "PLACEHOLDER"));
    frame.replace(frame.find("PLACEHOLDER"), 11, "\xff\xfe not utf8");
    ASSERT_TRUE(c.send(frame));
    // protobuf logs the field and refuses the message.
    expectErrorThenEof(c, kInvalidArgument, "is not a StoreRequest");
    if (::testing::Test::HasFailure()) return;
  }
  std::string log = server.log();
  EXPECT_GE(count(log, "protobuf"), 1) << "protobuf's complaint is still logged, once";
  EXPECT_LT(count(log, "protobuf"), 10) << log;
}

// ---- the hello -----------------------------------------------------------------------------

// A socket that sends the magic and then nothing, and one that sends its hello a byte every
// 100 ms (it would take 30 s): both are told UNAUTHENTICATED naming the hello timeout (10 s,
// counted from the connection, not from the last byte) and closed.
TEST(StoreSocketHelloTest, SilentAndSlowHellosAreClosedAfterTheHelloTimeout) {
  ServerOptions o;
  o.token = "tok";
  RendezvousServer server(o);
  RawClient silent(server.port());
  RawClient slow(server.port());
  std::string hello = frameOf(pingRequest(0, "tok" + std::string(300, 'x')));
  std::atomic<size_t> sent{0};
  std::atomic<bool> stop{false};
  std::thread dripper([&] {
    for (size_t i = 0; i < hello.size() && !stop; ++i) {
      if (slow.sendSome(hello.substr(i, 1), seconds(5)) != 1) return;
      ++sent;
      std::this_thread::sleep_for(milliseconds(100));
    }
  });
  // Still held a while after connecting: the timeout is not zero.
  pb::StoreResponse resp;
  EXPECT_EQ(silent.next(&resp, seconds(2)), RawClient::Got::kTimeout);
  expectErrorThenEof(silent, kUnauthenticated, "no token within 10s of connecting", seconds(30));
  expectErrorThenEof(slow, kUnauthenticated, "no token within 10s of connecting", seconds(30));
  stop = true;
  dripper.join();
  EXPECT_LT(sent.load(), hello.size()) << "the slow hello was read to its end";
  EXPECT_GT(sent.load(), 5u);
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 0; }, seconds(10)));
}

// ---- frames --------------------------------------------------------------------------------

// A first frame declaring more than 64 KiB is refused before any of it is buffered, naming the
// size and the limit; two hundred such sockets, each also sending 60 KiB after the header,
// leave the server's memory where it was.
TEST(StoreSocketFrameTest, OversizedFirstFrameIsRefusedNamingSizeAndLimitAndTheServerDoesNotGrow) {
  TokenFile token("tok");
  ServerProcess server({"--token-file", token.path()});
  {
    RawClient c(server.port());
    ASSERT_TRUE(c.send(headerOf((64 << 10) + 1)));
    expectErrorThenEof(c, kInvalidArgument,
                       "first request of 65537 bytes: it must be a ping with the token, at most "
                       "65536 bytes");
  }
  const int64_t baseline = rssOf(server.pid());
  ASSERT_GT(baseline, 0);
  std::string junk(60 << 10, 'j');
  for (int round = 0; round < 4; ++round) {
    std::vector<std::unique_ptr<RawClient>> clients;
    for (int i = 0; i < 50; ++i) {
      clients.push_back(std::make_unique<RawClient>(server.port()));
      // The rest may not be taken: the server ends the connection after the header.
      clients.back()->sendSome(headerOf(0xFFFFFF00u) + junk, seconds(2));
    }
    for (auto& c : clients)
      expectErrorThenEof(*c, kInvalidArgument, "first request of 4294967040 bytes");
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_LT(rssOf(server.pid()) - baseline, 16 << 20)
      << fmt::format("server grew by {} KiB", (rssOf(server.pid()) - baseline) >> 10);
  auto good = connectStore(server.endpoint(), "tok");
  good->set("k", toBytes("v"));
  EXPECT_EQ(toString(good->get("k", seconds(5))), "v");
}

// After the token, a frame declaring 4 GiB is refused RESOURCE_EXHAUSTED naming the limit (the
// server's max value size plus the message overhead), and the connection ends.
TEST(StoreSocketFrameTest, HugeFrameAfterTheTokenIsResourceExhaustedNamingTheLimit) {
  ServerOptions o;
  o.max_value_bytes = 1 << 20;
  RendezvousServer server(o);
  RawClient c(server.port());
  ASSERT_TRUE(c.hello("").has_ping());
  ASSERT_TRUE(c.send(headerOf(0xFFFFFFFFu)));
  expectErrorThenEof(c, kResourceExhausted,
                     "request of 4294967295 bytes: this server takes at most 2097152 bytes (its "
                     "max value size plus 1048576 bytes)");
  // One byte over the limit is refused too; the limit itself is not (a set of a 1 MiB value
  // fits well under it).
  RawClient d(server.port());
  ASSERT_TRUE(d.hello("").has_ping());
  ASSERT_TRUE(d.send(headerOf(2097153)));
  expectErrorThenEof(d, kResourceExhausted, "request of 2097153 bytes");
  RawClient e(server.port());
  ASSERT_TRUE(e.hello("").has_ping());
  ASSERT_TRUE(e.sendFrame(setRequest(1, "big", std::string(1 << 20, 'b'))));
  pb::StoreResponse resp;
  ASSERT_EQ(e.next(&resp), RawClient::Got::kFrame);
  EXPECT_TRUE(resp.has_set()) << resp.DebugString();
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }));
}

// Bytes that are not a StoreRequest, before or after the token, and a first request that is
// not a ping or not id 0: each is refused INVALID_ARGUMENT and the connection ends.
TEST(StoreSocketFrameTest, MalformedFramesAndWrongFirstRequestsAreRefusedThenClosed) {
  ServerOptions o;
  o.token = "tok";
  RendezvousServer server(o);
  // A field 1 length-delimited, claiming 5 bytes where 2 follow.
  const std::string garbage =
      "\x0a\x05"
      "ab";
  {
    RawClient c(server.port());
    ASSERT_TRUE(c.send(headerOf(4) + garbage));
    expectErrorThenEof(c, kInvalidArgument, "a frame of 4 bytes is not a StoreRequest");
  }
  {
    RawClient c(server.port());
    ASSERT_TRUE(c.hello("tok").has_ping());
    ASSERT_TRUE(c.send(headerOf(4) + garbage));
    expectErrorThenEof(c, kInvalidArgument, "a frame of 4 bytes is not a StoreRequest");
  }
  const std::string first_must_ping =
      "the first request on a store socket must be a ping with id 0 carrying the token";
  {
    RawClient c(server.port());  // a get first, even with the token
    pb::StoreRequest r = getRequest(0, "k", 0);
    r.set_token("tok");
    ASSERT_TRUE(c.sendFrame(r));
    expectErrorThenEof(c, kInvalidArgument, first_must_ping);
  }
  {
    RawClient c(server.port());  // a ping with id 7
    ASSERT_TRUE(c.sendFrame(pingRequest(7, "tok")));
    expectErrorThenEof(c, kInvalidArgument, first_must_ping);
  }
  {
    RawClient c(server.port());  // an empty frame: a request with no operation
    ASSERT_TRUE(c.send(headerOf(0)));
    expectErrorThenEof(c, kInvalidArgument, first_must_ping);
  }
  {
    // After the token an empty request is answered as an error on its own, and the
    // connection goes on.
    RawClient c(server.port());
    ASSERT_TRUE(c.hello("tok").has_ping());
    pb::StoreRequest empty;
    empty.set_id(9);
    ASSERT_TRUE(c.send(frameOf(empty) + frameOf(setRequest(10, "k", "v"))));
    pb::StoreResponse resp;
    ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
    EXPECT_EQ(resp.id(), 9u);
    EXPECT_EQ(resp.error().code(), kInvalidArgument);
    EXPECT_THAT(resp.error().message(), HasSubstr("request 9 names no operation"));
    ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
    EXPECT_EQ(resp.id(), 10u);
    EXPECT_TRUE(resp.has_set());
  }
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 0; }, seconds(10)));
}

// Sockets without a token cannot use up the server's budget for requests read and not yet
// handled (max_queued_bytes, 2 MiB here): 60 of them each hold most of a 64 KiB hello (3.5
// MiB in all), and a client with the token still sends a 1 MiB value. The tokenless ones are
// bounded on their own (their hellos, at most max_queued_bytes together): past it, the one
// that would add more is refused naming the numbers.
TEST(StoreSocketFrameTest, TokenlessHellosCannotUseUpTheInputBudgetOfAuthorizedClients) {
  ServerOptions o;
  o.token = "tok";
  o.limits.max_queued_bytes = 2 << 20;
  RendezvousServer server(o);
  std::vector<std::unique_ptr<RawClient>> tokenless;
  int refused = 0;
  for (int i = 0; i < 60; ++i) {
    tokenless.push_back(std::make_unique<RawClient>(server.port()));
    tokenless.back()->send(headerOf(64 << 10) + std::string(60 << 10, 'h'));
  }
  std::vector<bool> answered(tokenless.size());
  auto sweep = [&] {
    for (size_t i = 0; i < tokenless.size(); ++i) {
      pb::StoreResponse resp;
      if (answered[i] || tokenless[i]->next(&resp, milliseconds(0)) != RawClient::Got::kFrame)
        continue;
      answered[i] = true;
      ++refused;
      EXPECT_EQ(resp.error().code(), kResourceExhausted) << resp.DebugString();
      EXPECT_THAT(resp.error().message(), HasSubstr("bytes of first requests not yet complete"));
      EXPECT_THAT(resp.error().message(), HasSubstr("limit 2097152 bytes"));
    }
    return refused >= 20;
  };
  // 2 MiB of 60 KiB hellos: about 34 fit (a few more as refused ones give theirs back).
  EXPECT_TRUE(eventually(sweep)) << refused << " refused";
  RawClient good(server.port());
  ASSERT_TRUE(good.hello("tok").has_ping());
  ASSERT_TRUE(good.sendFrame(setRequest(1, "big", std::string(1 << 20, 'b'))));
  pb::StoreResponse resp;
  ASSERT_EQ(good.next(&resp), RawClient::Got::kFrame);
  EXPECT_TRUE(resp.has_set()) << resp.DebugString();
  sweep();
  EXPECT_LE(refused, 30);
  EXPECT_TRUE(eventually([&] { return server.stats().keys == 1; }));
}

// A protocol error after answers that the socket could not yet take: the answers owed still
// arrive whole, then the error, then the end; nothing is cut off in the middle of a frame.
TEST(StoreSocketFrameTest, AnswersOwedBeforeAProtocolErrorArriveWholeBeforeTheError) {
  ServerOptions o;
  RendezvousServer server(o);
  constexpr size_t kValue = 1 << 20;
  constexpr int kGets = 12;  // 12 MiB: more than the socket buffers hold
  // Read back: a set on the socket transport is quiet (unconfirmed), and the raw gets below
  // must not park waiting for it.
  auto good = connectStore(server.endpoint());
  good->set("big", Bytes(kValue, 7));
  ASSERT_EQ(good->get("big", seconds(5)).size(), kValue);
  RawClient c(server.port());
  ASSERT_TRUE(c.hello("").has_ping());
  std::string batch;
  for (int i = 1; i <= kGets; ++i) batch += frameOf(getRequest(i, "big", 1000));
  batch += headerOf(4) +
           "\x0a\x05"
           "ab";
  ASSERT_TRUE(c.send(batch));
  // The server has handled the batch and holds answers the socket did not take.
  ASSERT_TRUE(eventually([&] { return server.stats().queued_bytes > 0; }, seconds(20)));
  pb::StoreResponse resp;
  for (int i = 1; i <= kGets; ++i) {
    ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame)
        << "answer " << i << " of " << kGets << " (" << c.leftover() << " bytes of it)";
    EXPECT_EQ(resp.id(), static_cast<uint64_t>(i));
    EXPECT_EQ(resp.get().value().size(), kValue);
  }
  expectErrorThenEof(c, kInvalidArgument, "a frame of 4 bytes is not a StoreRequest");
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }));
}

// An answer decided after a protocol error (a parked get whose key arrives during the linger)
// is not sent: the error is the connection's last frame.
TEST(StoreSocketFrameTest, ParkedAnswersDoNotFollowTheError) {
  RendezvousServer server(ServerOptions{});
  RawClient c(server.port());
  ASSERT_TRUE(c.hello("").has_ping());
  ASSERT_TRUE(c.sendFrame(getRequest(1, "later", 60000)));
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 1; }));
  ASSERT_TRUE(c.send(headerOf(4) + "\x0a\x05"
                                   "ab"));
  pb::StoreResponse resp;
  ASSERT_EQ(c.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.error().code(), kInvalidArgument) << resp.DebugString();
  connectStore(server.endpoint())->set("later", toBytes("v"));
  EXPECT_EQ(c.next(&resp), RawClient::Got::kEof) << resp.DebugString();
  EXPECT_TRUE(eventually([&] { return server.stats().parked_store_calls == 0; }));
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }));
}

// ---- back-pressure -------------------------------------------------------------------------

// 5,000 gets of keys that never come, pipelined without reading: the server parks
// max_stream_pending of them and stops reading the socket; another client is served
// meanwhile; closing the socket releases every parked get.
TEST(StoreSocketBackPressureTest, PipelinedParkedGetsStopAtMaxStreamPendingAndCloseReleasesThem) {
  ServerOptions o;
  o.limits.max_stream_pending = 64;
  RendezvousServer server(o);
  auto good = connectStore(server.endpoint());
  RawClient hostile(server.port());
  ASSERT_TRUE(hostile.hello("").has_ping());
  std::string gets;
  for (int i = 1; i <= 5000; ++i)
    gets += frameOf(getRequest(i, fmt::format("never/{}", i), 600000));
  hostile.sendSome(gets, seconds(5));  // the kernel's buffers may hold them all: no matter
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 64; }))
      << server.stats().parked_store_calls;
  EXPECT_GE(server.stats().paused_reads, 1);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(server.stats().parked_store_calls, 64) << "read past max_stream_pending";
  for (int i = 0; i < 20; ++i) {
    good->set(fmt::format("k{}", i), toBytes("v"));
    EXPECT_EQ(toString(good->get(fmt::format("k{}", i), seconds(5))), "v");
  }
  // One of the parked gets answered lets exactly one more in.
  good->set("never/1", toBytes("x"));
  pb::StoreResponse resp;
  ASSERT_EQ(hostile.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.id(), 1u);
  EXPECT_EQ(resp.get().value(), "x");
  EXPECT_TRUE(eventually([&] { return server.stats().paused_reads >= 2; }));
  EXPECT_EQ(server.stats().parked_store_calls, 64);
  hostile.close();
  EXPECT_TRUE(eventually([&] { return server.stats().parked_store_calls == 0; }))
      << server.stats().parked_store_calls << " gets still parked";
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 1; }));
  good->set("after", toBytes("v"));
}

// Gets of a 1 MiB value pipelined by a client that never reads: the answers queued for it stay
// near max_stream_queued_bytes (4 MiB here) instead of growing to hundreds of MiB, others are
// served, and the queue is empty again once it leaves.
TEST(StoreSocketBackPressureTest, NonReadingClientOfLargeValuesStaysBoundedNearItsStreamLimit) {
  constexpr int64_t kValue = 1 << 20;
  constexpr int64_t kStreamBound = 4 << 20;
  ServerOptions o;
  o.limits.max_stream_queued_bytes = kStreamBound;
  o.limits.max_queued_bytes = 64 << 20;
  RendezvousServer server(o);
  auto good = connectStore(server.endpoint());
  good->set("big", Bytes(kValue, 7));
  ASSERT_EQ(good->get("big", seconds(5)).size(), static_cast<size_t>(kValue));  // stored
  RawClient hostile(server.port());
  int small = 64 << 10;
  setsockopt(hostile.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(hostile.hello("").has_ping());
  std::string gets;
  for (int i = 1; i <= 400; ++i) gets += frameOf(getRequest(i, "big", 1000));
  hostile.sendSome(gets, seconds(5));
  ASSERT_TRUE(eventually([&] { return server.stats().paused_reads >= 1; }));
  // Settled: the queue stops moving once the kernel's buffers are full.
  int64_t peak = 0, last = -1;
  int still = 0;
  for (int i = 0; i < 400 && still < 10; ++i) {
    std::this_thread::sleep_for(milliseconds(20));
    int64_t q = server.stats().queued_bytes;
    peak = std::max(peak, q);
    still = q == last ? still + 1 : 0;
    last = q;
  }
  // At most the stream's bound plus the one answer that crossed it.
  EXPECT_GE(peak, kStreamBound);
  EXPECT_LE(peak, kStreamBound + kValue + 64) << "queued " << peak << " bytes";
  EXPECT_EQ(server.stats().refused_for_memory, 0);
  EXPECT_EQ(good->get("big", seconds(5)).size(), static_cast<size_t>(kValue));
  hostile.close();
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }))
      << server.stats().queued_bytes << " bytes still queued";
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 1; }));
}

// ---- issue 33: bounds that bound ----------------------------------------------------------

// Waits until the server's queued answers stop moving (its clients' kernel buffers are full and
// it holds back what it will); returns the most it saw.
int64_t settledQueue(RendezvousServer& server) {
  int64_t peak = 0, last = -1;
  int still = 0;
  for (int i = 0; i < 200 && still < 10; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    int64_t q = server.stats().queued_bytes;
    peak = std::max(peak, q);
    still = q == last ? still + 1 : 0;
    last = q;
  }
  return peak;
}

std::unique_ptr<RawClient> nonReadingClient(int port) {
  auto c = std::make_unique<RawClient>(port);
  int small = 64 << 10;
  setsockopt(c->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  EXPECT_TRUE(c->hello("").has_ping());
  return c;
}

std::string getsOf(const std::string& key, int n, int64_t timeout_ms = 1000) {
  std::string gets;
  for (int i = 1; i <= n; ++i)
    gets += frameOf(getRequest(static_cast<uint64_t>(i), key, timeout_ms));
  return gets;
}

// The second finding: answers refused past the server-wide bound (max_queued_bytes) were
// queued anyway, as errors, and a connection was held back only at its own bound, so 5 + 12
// clients that never read pinned 1,057 MB against a 256 MiB bound. Here (16 MiB in all, 4 MiB
// per connection, 4 KiB values) 5 clients fill the server's budget and 12 more then send
// 30,000 gets each: each of the 12 is held back after its first refusal, the queue stays at the
// bound plus one answer per connection, and it empties when they leave.
TEST(StoreSocketBoundsTest, ErrorAnswersAreBoundedTooAndTheServerWideBoundHoldsForEveryAnswer) {
  constexpr int64_t kAll = 16 << 20, kPerConnection = 4 << 20, kValue = 4 << 10;
  ServerOptions o;
  o.limits.max_queued_bytes = kAll;
  o.limits.max_stream_queued_bytes = kPerConnection;
  RendezvousServer server(o);
  auto good = connectStore(server.endpoint());
  good->set("v", Bytes(kValue, 1));
  ASSERT_EQ(good->get("v", seconds(5)).size(), static_cast<size_t>(kValue));  // stored
  std::vector<std::unique_ptr<RawClient>> hostile;
  for (int i = 0; i < 5; ++i) {
    hostile.push_back(nonReadingClient(server.port()));
    hostile.back()->sendSome(getsOf("v", 2000), seconds(2));
  }
  int64_t filled = settledQueue(server);
  EXPECT_GE(filled, kAll * 3 / 4) << "the first five did not fill the server's budget";
  // 100,000 gets each (2 MB of requests), sent to the twelve side by side for as long as the
  // server takes them: refusals for all of them would be 11 MB per client.
  const std::string gets = getsOf("v", 100000);
  std::vector<size_t> sent(12);
  for (int i = 0; i < 12; ++i) hostile.push_back(nonReadingClient(server.port()));
  const int64_t baseline = rssOf(getpid());
  for (int idle = 0; idle < 10;) {
    size_t before = std::accumulate(sent.begin(), sent.end(), size_t{0});
    for (int i = 0; i < 12; ++i)
      sent[i] += hostile[5 + i]->sendSome(gets.substr(sent[i], 256 << 10), milliseconds(0));
    bool progress = std::accumulate(sent.begin(), sent.end(), size_t{0}) > before;
    idle = progress ? 0 : idle + 1;
    if (!progress) std::this_thread::sleep_for(milliseconds(50));
  }
  int64_t peak = settledQueue(server);
  const int64_t grown = rssOf(getpid()) - baseline;
  auto s = server.stats();
  EXPECT_GT(s.refused_for_memory, 0);
  // The bound, plus one answer of each connection past it (the one that took it over, or the
  // refusal it then got).
  const int64_t slack = 17 * (kValue + 1024);
  EXPECT_LE(peak, kAll + slack) << fmt::format(
      "{} bytes of answers queued against a bound of {} ({} refused)", peak, kAll,
      s.refused_for_memory);
  // What the server holds for them: the values are the store's own, the refusals a few.
  // (Not under ASan: its quarantine keeps the memory the refusals went through, 200 MB here.)
#ifndef DDPL_TEST_ASAN
  EXPECT_LT(grown, kAll) << fmt::format("this process grew by {} MiB", grown >> 20);
#else
  (void)grown;
#endif
  for (auto& c : hostile) c->close();
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }))
      << server.stats().queued_bytes << " bytes still queued";
  good->set("after", toBytes("x"));
  EXPECT_EQ(toString(good->get("after", seconds(5))), "x");
}

// The third finding: one client that never reads, asking for a 16 MiB value, made the
// single socket thread copy the value for every answer (a thousand gets parked before the value
// came were a thousand copies, 16 GB, made while the store's lock was held), and other clients'
// round trips timed out. The value is shared with the answers now, and a connection gets a
// bounded share of each turn of the loop. Here 1,024 gets of a 4 MiB value park before it is
// set, then the client keeps sending gets of it: the server's memory stays near one copy of the
// value, and another client's round trips all complete meanwhile (a generous deadline each: a
// liveness check, not a speed check).
TEST(StoreSocketBoundsTest, OneNonReadingClientOfALargeValueDoesNotStarveTheOthers) {
  constexpr size_t kValue = 4 << 20;
  RendezvousServer server(ServerOptions{});
  auto good = connectStore(server.endpoint());
  good->set("warm", toBytes("x"));
  const int64_t baseline = rssOf(getpid());
  auto hostile = nonReadingClient(server.port());
  ASSERT_TRUE(hostile->send(getsOf("big", 1024, 60000)));
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 1024; }))
      << server.stats().parked_store_calls;
  good->set("big", Bytes(kValue, 3));  // answers the 1,024 at once
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    std::string more = getsOf("big", 64);
    while (!stop && hostile->sendSome(more, milliseconds(200)) > 0) {
    }
  });
  int64_t peak = baseline;
  for (int i = 0; i < 20; ++i) {
    try {
      good->set(fmt::format("k{}", i), toBytes("v"));
      EXPECT_EQ(toString(good->get(fmt::format("k{}", i), seconds(10))), "v") << i;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "round trip " << i << " while the flood went on: " << e.what();
    }
    peak = std::max(peak, rssOf(getpid()));
    std::this_thread::sleep_for(milliseconds(20));
  }
  stop = true;
  flood.join();
  peak = std::max(peak, rssOf(getpid()));
  // One copy of the value in the store, one in the client that set it, and the kernel's and
  // the client's buffers; a copy per answer was 1,024 x 4 MiB. (Not under ASan, whose
  // quarantine keeps what the flood's requests went through.)
#ifndef DDPL_TEST_ASAN
  EXPECT_LT(peak - baseline, int64_t{160} << 20)
      << fmt::format("this process (server and clients) grew by {} MiB", (peak - baseline) >> 20);
#endif
  EXPECT_LE(server.stats().queued_bytes,
            ServerOptions{}.limits.max_queued_bytes + 2 * static_cast<int64_t>(kValue));
  hostile->close();
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }))
      << server.stats().queued_bytes << " bytes still queued";
}

// ---- connections ---------------------------------------------------------------------------

// A thousand sockets that send the magic and never their token, against a server under a
// 1024-file limit (it holds at most 480 connections): the server never runs out of files,
// the oldest tokenless sockets make room for newer ones, a client with the token connects and
// works throughout, and once the hello timeout has passed the server's files are back down.
TEST(StoreSocketConnectionsTest, ThousandTokenlessSocketsUnder1024FilesLeaveRoomForRealClients) {
  if (auto why = tooFewOpenFiles(1200); !why.empty()) GTEST_SKIP() << why;
  OpenFilesRaised raised(4096);
  TokenFile token("tok");
  ServerProcess server({"--token-file", token.path()}, {"prlimit", "--nofile=1024:1024", "--"});
  EXPECT_THAT(server.log(), HasSubstr("it will hold at most 480"));
  auto good = connectStore(server.endpoint(), "tok");
  const int baseline = openFilesOf(server.pid());
  std::vector<std::unique_ptr<RawClient>> hostile;
  int max_files = 0;
  for (int i = 0; i < 1000; ++i) {
    hostile.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(hostile.back()->valid()) << i;
    if (i % 100 == 99) {
      max_files = std::max(max_files, openFilesOf(server.pid()));
      good->set(fmt::format("k{}", i), toBytes("v"));
      // A new client with the token gets in too.
      auto fresh = connectStore(server.endpoint(), "tok");
      EXPECT_EQ(toString(fresh->get(fmt::format("k{}", i), seconds(5))), "v");
    }
  }
  // Two files per connection (the socket and the gate's duplicate), 480 at most, plus the
  // server's own: what it budgets for in its 1,024. A socket evicted to make room keeps its
  // file until the store socket's loop closes it, so a few more than 2 x 480 may be open for
  // a moment (up to 41 seen); what matters is that the server never ran out.
  EXPECT_LT(max_files, 1024) << "files open in the server while the sockets kept connecting ("
                             << baseline << " before)";
  EXPECT_THAT(server.log(), ::testing::Not(HasSubstr("cannot accept")));
  // Every one is closed: the oldest to make room (EOF, nothing sent), those held to the end
  // after the hello timeout, told so.
  int told = 0;
  for (auto& c : hostile) told += expectClosedWithoutToken(*c);
  EXPECT_GT(told, 100);
  EXPECT_TRUE(eventually([&] { return openFilesOf(server.pid()) < 100; }, seconds(20)))
      << openFilesOf(server.pid()) << " files open in the server";
  EXPECT_EQ(toString(good->get("k999", seconds(5))), "v");
  hostile.clear();
}

// Both transports flooded at once under a 1024-file limit (480 connections): connections that
// send HTTP/2's preface and then nothing (gRPC's, two files each: gRPC's and the gate's
// duplicate) and sockets that send the magic and never their token (the store socket's). The
// server's connections stay within its one cap, two files each, so it never runs out of files
// and a client with the token gets in. (Each transport used to have a cap of its own: 480
// store sockets plus 480 gRPC connections took all 1,024 files, accept failed with EMFILE and
// real clients waited for the hello timeout.)
TEST(StoreSocketConnectionsTest, BothTransportsFloodedUnder1024FilesStayWithinOneCap) {
  if (auto why = tooFewOpenFiles(2400); !why.empty()) GTEST_SKIP() << why;
  OpenFilesRaised raised(4096);
  TokenFile token("tok");
  ServerProcess server({"--token-file", token.path()}, {"prlimit", "--nofile=1024:1024", "--"});
  ASSERT_THAT(server.log(), HasSubstr("it will hold at most 480"));
  auto good = connectStore(server.endpoint(), "tok");
  const int baseline = openFilesOf(server.pid());
  const std::string preface = std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                              std::string("\0\0\0\x04\0\0\0\0\0", 9);  // empty SETTINGS
  std::vector<std::unique_ptr<RawClient>> hostile;
  int max_files = 0;
  // The store socket's first, then gRPC's: each fills its transport up to the cap.
  for (int i = 0; i < 1200; ++i) {
    if (i < 600) {
      hostile.push_back(std::make_unique<RawClient>(server.port()));
    } else {
      hostile.push_back(std::make_unique<RawClient>(server.port(), /*magic=*/false));
      hostile.back()->send(preface);
    }
    if (i % 100 == 99) {
      max_files = std::max(max_files, openFilesOf(server.pid()));
      good->set(fmt::format("k{}", i), toBytes("v"));
    }
  }
  max_files = std::max(max_files, openFilesOf(server.pid()));
  // A newcomer with the token, on a connection of its own, gets in.
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.token = "tok";
  o.connect_timeout = seconds(20);
  std::unique_ptr<Store> fresh;
  EXPECT_NO_THROW(fresh = connectGrpcStore(o)) << server.log();
  if (fresh) EXPECT_EQ(toString(fresh->get("k1199", seconds(5))), "v");
  EXPECT_LT(max_files, 1024) << baseline << " files open before";
  EXPECT_THAT(server.log(), ::testing::Not(HasSubstr("cannot accept"))) << server.log();
  hostile.clear();
}

// One cap (20 here) for both transports: 30 tokenless store sockets and 30 silent TCP
// connections leave the server holding at most 20, oldest evicted first; store-socket clients
// that showed their token are never evicted, and once they fill the cap a newcomer is closed on
// arrival while they keep working.
TEST(StoreSocketConnectionsTest, OneConnectionCapCoversBothTransportsAndSparesAuthorizedSockets) {
  ServerOptions o;
  o.token = "tok";
  o.connections.max_connections = 20;
  RendezvousServer server(o);
  std::vector<std::unique_ptr<RawClient>> tokenless, silent;
  for (int i = 0; i < 30; ++i) tokenless.push_back(std::make_unique<RawClient>(server.port()));
  for (int i = 0; i < 30; ++i)
    silent.push_back(std::make_unique<RawClient>(server.port(), /*magic=*/false));
  EXPECT_TRUE(eventually([&] { return server.stats().connections_accepted == 60; }));
  // Well before the hello timeout (10 s) could be what brings it down.
  EXPECT_TRUE(eventually([&] { return server.stats().connections <= 20; }, seconds(5)))
      << server.stats().connections << " connections held (" << server.stats().store_sockets
      << " store sockets)";
  EXPECT_GE(server.stats().connections_evicted, 40);
  // Socket clients with the token fill the cap, each evicting one that has not shown a token
  // (a silent one first, then the oldest): all sixty are closed.
  std::vector<std::unique_ptr<RawClient>> real;
  for (int i = 0; i < 20; ++i) {
    real.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(real.back()->hello("tok").has_ping()) << i;
  }
  for (auto& c : tokenless) expectClosedWithoutToken(*c);
  for (auto& c : silent) expectClosedWithoutToken(*c);
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 20; }));
  pb::StoreResponse resp;
  RawClient extra(server.port());
  EXPECT_EQ(extra.next(&resp, seconds(20)), RawClient::Got::kEof);
  EXPECT_EQ(server.stats().connections_rejected, 1);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(real[i]->sendFrame(setRequest(1, fmt::format("k{}", i), "v")));
    ASSERT_EQ(real[i]->next(&resp), RawClient::Got::kFrame) << i;
    EXPECT_TRUE(resp.has_set()) << resp.DebugString();
  }
  EXPECT_EQ(server.stats().connections, 20);
}

// The server's stats count socket clients among its connections and drop when they leave, and
// so do its files: the connection gate's duplicate of each socket goes too (WireServer tells
// it at the close; its sweep of closed descriptors is the backstop).
TEST(StoreSocketConnectionsTest, StatsCountSocketClientsAndDropWhenTheyLeave) {
  RendezvousServer server(ServerOptions{});
  auto base = server.stats();
  const int files_before = openFilesOf(getpid());
  EXPECT_EQ(base.store_sockets, 0);
  std::vector<std::unique_ptr<RawClient>> raw;
  for (int i = 0; i < 3; ++i) {
    raw.push_back(std::make_unique<RawClient>(server.port()));
    ASSERT_TRUE(raw.back()->hello("").has_ping());
  }
  auto store = connectStore(server.endpoint());
  store->set("k", toBytes("v"));
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 4; }))
      << server.stats().store_sockets;
  // One file per connection on each side: the gate keeps no duplicate of a store socket's.
  EXPECT_LE(openFilesOf(getpid()) - files_before, 4 * 2)
      << openFilesOf(getpid()) << " files open with 4 socket clients, " << files_before
      << " before them";
  auto s = server.stats();
  EXPECT_GE(s.connections, 4);
  EXPECT_GE(s.sessions, 4);
  EXPECT_GE(s.connections_accepted, 4);
  raw.clear();
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 1; }))
      << server.stats().store_sockets;
  EXPECT_TRUE(eventually([&] { return server.stats().sessions == s.sessions - 3; }));
  store.reset();
  EXPECT_TRUE(eventually([&] {
    auto t = server.stats();
    return t.store_sockets == 0 && t.connections == 0 && t.sessions == 0;
  })) << server.stats().connections
      << " connections, " << server.stats().sessions << " sessions";
  EXPECT_TRUE(eventually([&] { return openFilesOf(getpid()) <= files_before; }))
      << openFilesOf(getpid()) << " files open, " << files_before << " before the clients";
}

// One port, two transports, one store: a gRPC client and a socket client see each other's
// keys, counters and wakeups.
TEST(StoreSocketConnectionsTest, GrpcAndSocketClientsOnTheSamePortShareTheStore) {
  ServerOptions o;
  o.token = "tok";
  RendezvousServer server(o);
  auto via_grpc = connectStore(server.endpoint(), "tok", /*socket=*/false);
  auto via_socket = connectStore(server.endpoint(), "tok", /*socket=*/true);
  RawClient raw(server.port());
  ASSERT_TRUE(raw.hello("tok").has_ping());
  EXPECT_TRUE(eventually([&] { return server.stats().store_sockets == 2; }))
      << server.stats().store_sockets << " socket clients: the store client did not use the socket";
  via_grpc->set("from/grpc", toBytes("g"));
  via_socket->set("from/socket", toBytes("s"));
  EXPECT_EQ(toString(via_socket->get("from/grpc", seconds(5))), "g");
  EXPECT_EQ(toString(via_grpc->get("from/socket", seconds(5))), "s");
  EXPECT_EQ(via_grpc->add("n", 1), 1);
  EXPECT_EQ(via_socket->add("n", 2), 3);
  // A get parked on the raw socket is woken by the gRPC client's set.
  ASSERT_TRUE(raw.sendFrame(getRequest(5, "late", 20000)));
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 1; }));
  via_grpc->set("late", toBytes("here"));
  pb::StoreResponse resp;
  ASSERT_EQ(raw.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(resp.id(), 5u);
  EXPECT_EQ(resp.get().value(), "here");
  ASSERT_TRUE(raw.sendFrame(setRequest(6, "from/raw", "r")));
  ASSERT_EQ(raw.next(&resp), RawClient::Got::kFrame);
  EXPECT_EQ(toString(via_grpc->get("from/raw", seconds(5))), "r");
  EXPECT_EQ(via_socket->add("n", 0), 3);
}

}  // namespace
}  // namespace ddpl::rdzv
