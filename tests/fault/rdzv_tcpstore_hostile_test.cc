// torch's TCPStore protocol on our server (protocol/tcpstore_format.h,
// server/wire_server_tcpstore.cc): its parser, then the server under raw-socket clients that
// speak the protocol by hand (so the test sees exactly the bytes and the EOF the server sends):
// peers that are not the job's, no attempt open, garbage, unknown query types, lengths far past
// the limits, slow senders, a new attempt closing the old one's connections and deleting its
// keys, WAIT and CANCEL_WAIT in the order torch's client needs, the parked-wait bound. The
// real torch client is tested against the real torch server in tests/python
// (tcpstore_conformance.py, under launch). Servers are in-process, loopback, port 0.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "rendezvous/protocol/tcpstore_format.h"
#include "rendezvous/server/server.h"
#include "tests/common/subprocess.h"

namespace ddpl::rdzv {
namespace {

using namespace std::chrono_literals;
using tcpstore::Query;
using tcpstore::Request;

// ---- the parser ------------------------------------------------------------------------

Request query(Query t, std::vector<std::string> keys = {},
              std::vector<std::vector<uint8_t>> values = {}, int64_t number = 0) {
  Request r;
  r.type = t;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  return r;
}

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TcpStoreFormat, EveryQueryRoundTripsAndEveryPrefixNeedsMore) {
  std::vector<Request> all = {
      query(Query::kSet, {"/a"}, {bytesOf("v")}),
      query(Query::kCompareSet, {"/a"}, {bytesOf(""), bytesOf("new")}),
      query(Query::kGet, {"/a"}),
      query(Query::kAdd, {"/n"}, {}, -7),
      query(Query::kCheck, {"/a", "/b"}),
      query(Query::kWait, {"/a"}),
      query(Query::kGetNumKeys),
      query(Query::kDeleteKey, {"/a"}),
      query(Query::kAppend, {"/a"}, {bytesOf("xy")}),
      query(Query::kMultiGet, {"/a", "/b", "/c"}),
      query(Query::kMultiSet, {"/a", "/b"}, {bytesOf("1"), bytesOf("")}),
      query(Query::kCancelWait),
      query(Query::kQueuePush, {"/q"}, {bytesOf("item")}),
      query(Query::kQueuePop, {"/q"}),
      query(Query::kQueueLen, {"/q"}),
  };
  Request ping = query(Query::kPing);
  ping.u32 = 0xdeadbeef;
  all.push_back(ping);
  tcpstore::Limits limits;
  for (const Request& r : all) {
    std::string wire = tcpstore::encodeQuery(r);
    Request back;
    for (size_t n = 0; n < wire.size(); ++n)
      ASSERT_EQ(tcpstore::parseQuery(wire.data(), n, limits, &back).status,
                tcpstore::Parse::kNeedMore)
          << tcpstore::queryName(static_cast<uint8_t>(r.type)) << " prefix " << n;
    wire += "trailing";
    auto res = tcpstore::parseQuery(wire.data(), wire.size(), limits, &back);
    ASSERT_EQ(res.status, tcpstore::Parse::kOk);
    EXPECT_EQ(res.consumed, wire.size() - 8);
    EXPECT_EQ(back.type, r.type);
    EXPECT_EQ(back.keys, r.keys);
    EXPECT_EQ(back.values, r.values);
    EXPECT_EQ(back.number, r.number);
    EXPECT_EQ(back.u32, r.u32);
  }
}

TEST(TcpStoreFormat, LimitsAreCheckedBeforeTheBytesArrive) {
  tcpstore::Limits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 100;
  limits.max_keys = 4;
  limits.max_query_bytes = 1000;
  Request out;
  auto check = [&](const std::string& wire, const char* says) {
    // Only the header: a length announced past a limit is refused before its bytes come.
    auto res = tcpstore::parseQuery(wire.data(), wire.size(), limits, &out);
    EXPECT_EQ(res.status, tcpstore::Parse::kTooLarge) << says;
    EXPECT_NE(res.error.find(says), std::string::npos) << res.error;
  };
  std::string key_len;
  tcpstore::appendU8(key_len, static_cast<uint8_t>(Query::kGet));
  tcpstore::appendLength(key_len, 17);
  check(key_len, "a key of 17 bytes (at most 16)");
  std::string huge;
  tcpstore::appendU8(huge, static_cast<uint8_t>(Query::kSet));
  tcpstore::appendLength(huge, 1);
  huge += "k";
  tcpstore::appendLength(huge, uint64_t{1} << 62);
  check(huge, "a value of 4611686018427387904 bytes (at most 100)");
  std::string many;
  tcpstore::appendU8(many, static_cast<uint8_t>(Query::kWait));
  tcpstore::appendLength(many, 5);
  check(many, "5 keys in one query (at most 4)");
  Request big = query(Query::kMultiSet, {"a", "b", "c", "d"},
                      {std::vector<uint8_t>(100), std::vector<uint8_t>(100),
                       std::vector<uint8_t>(100), std::vector<uint8_t>(100)});
  limits.max_query_bytes = 300;
  check(tcpstore::encodeQuery(big), "a query of more than");
  std::string unknown(1, static_cast<char>(tcpstore::kLastQuery + 1));
  auto res = tcpstore::parseQuery(unknown.data(), unknown.size(), limits, &out);
  EXPECT_EQ(res.status, tcpstore::Parse::kUnknown);
  EXPECT_EQ(res.type, tcpstore::kLastQuery + 1);
}

// ---- the server -------------------------------------------------------------------------

ServerOptions torchServer() {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.token = "secret";
  o.tcpstore = true;
  o.tcpstore_attempt = 0;
  o.stats_interval = Duration(0);
  o.max_value_bytes = 1 << 20;
  return o;
}

// A torch client by hand: the hello, then queries; answers read with a deadline.
class RawTorch {
 public:
  explicit RawTorch(int port, bool hello = true) : fd_(::ddpl::testing::connectLoopback(port)) {
    if (hello) {
      Request v = query(Query::kValidate);
      v.u32 = tcpstore::kValidationMagic;
      send(tcpstore::encodeQuery(v));
    }
  }
  ~RawTorch() {
    if (fd_ >= 0) ::close(fd_);
  }
  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed: the reads below see it
      off += static_cast<size_t>(n);
    }
  }
  void send(const Request& r) { send(tcpstore::encodeQuery(r)); }
  // Exactly `n` bytes, or fewer when the connection ended or the deadline passed.
  std::string read(size_t n, std::chrono::milliseconds within = 5000ms) {
    std::string out;
    auto until = std::chrono::steady_clock::now() + within;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) {
        ended_ = true;
        break;
      }
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  // The server closed the connection within `within` (EOF or reset, nothing more to read).
  bool closedBy(std::chrono::milliseconds within = 5000ms) {
    read(SIZE_MAX >> 1, within);
    return ended_;
  }
  uint32_t ping(uint32_t nonce) {
    Request p = query(Query::kPing);
    p.u32 = nonce;
    send(p);
    std::string r = read(4);
    uint32_t v = 0;
    if (r.size() == 4) std::memcpy(&v, r.data(), 4);
    return v;
  }
  int64_t i64() {
    std::string r = read(8);
    int64_t v = -1;
    if (r.size() == 8) std::memcpy(&v, r.data(), 8);
    return v;
  }
  std::string bytes() {
    int64_t n = i64();
    return n < 0 ? "<none>" : read(static_cast<size_t>(n));
  }

 private:
  int fd_;
  bool ended_ = false;
};

TEST(TcpStoreServer, ServesTheQueriesInTheirOrder) {
  RendezvousServer server(torchServer());
  RawTorch c(server.port());
  EXPECT_EQ(c.ping(42), 42u);
  c.send(query(Query::kSet, {"/a"}, {bytesOf("1")}));
  c.send(query(Query::kAdd, {"/a"}, {}, 41));
  EXPECT_EQ(c.i64(), 42);
  c.send(query(Query::kGet, {"/a"}));
  EXPECT_EQ(c.bytes(), "42");
  c.send(query(Query::kAppend, {"/a"}, {bytesOf("!")}));
  c.send(query(Query::kCompareSet, {"/a"}, {bytesOf("42!"), bytesOf("x")}));
  EXPECT_EQ(c.bytes(), "x");
  c.send(query(Query::kCompareSet, {"/missing"}, {bytesOf("e"), bytesOf("d")}));
  EXPECT_EQ(c.bytes(), "e") << "torch answers `expected` for a missing key";
  c.send(query(Query::kCheck, {"/a", "/missing"}));
  EXPECT_EQ(c.read(1), std::string(1, tcpstore::kCheckNotReady));
  c.send(query(Query::kMultiSet, {"/b", "/c"}, {bytesOf("B"), bytesOf("C")}));
  c.send(query(Query::kMultiGet, {"/c", "/b", "/missing"}));
  EXPECT_EQ(c.bytes(), "C");
  EXPECT_EQ(c.bytes(), "B");
  EXPECT_EQ(c.bytes(), "");
  c.send(query(Query::kGetNumKeys));
  EXPECT_EQ(c.i64(), 3);
  c.send(query(Query::kDeleteKey, {"/b"}));
  EXPECT_EQ(c.i64(), 1);
  c.send(query(Query::kDeleteKey, {"/b"}));
  EXPECT_EQ(c.i64(), 0);
  c.send(query(Query::kQueuePush, {"/q"}, {bytesOf("one")}));
  c.send(query(Query::kQueuePush, {"/q"}, {bytesOf("two")}));
  c.send(query(Query::kQueueLen, {"/q"}));
  EXPECT_EQ(c.i64(), 2);
  c.send(query(Query::kQueuePop, {"/q"}));
  EXPECT_EQ(c.i64(), 2);
  EXPECT_EQ(c.bytes(), "one");
  c.send(query(Query::kCheck, {"/q"}));
  EXPECT_EQ(c.read(1), std::string(1, tcpstore::kCheckReady)) << "a non-empty queue is present";
  c.send(query(Query::kQueuePop, {"/q"}));
  EXPECT_EQ(c.i64(), 1);
  EXPECT_EQ(c.bytes(), "two");
  c.send(query(Query::kQueuePop, {"/q"}));
  EXPECT_EQ(c.i64(), 0) << "an empty queue answers its length and nothing else";
  EXPECT_EQ(c.ping(7), 7u);
}

TEST(TcpStoreServer, WaitAnswersWhenItsKeysComeAndCancelFollowsAnAnswerAlreadyDue) {
  RendezvousServer server(torchServer());
  RawTorch waiter(server.port()), setter(server.port());
  waiter.send(query(Query::kWait, {"/k", "/j"}));
  EXPECT_EQ(waiter.read(1, 300ms), "") << "answered before its keys exist";
  setter.send(query(Query::kSet, {"/k"}, {bytesOf("1")}));
  setter.send(query(Query::kSet, {"/j"}, {bytesOf("1")}));
  EXPECT_EQ(waiter.read(1), std::string(1, tcpstore::kStopWaiting));
  // Timed out on the client's side: CANCEL_WAIT is answered WAIT_CANCELED, and the wait never
  // answers after it.
  waiter.send(query(Query::kWait, {"/never"}));
  waiter.send(query(Query::kCancelWait));
  EXPECT_EQ(waiter.read(1), std::string(1, tcpstore::kWaitCanceled));
  setter.send(query(Query::kSet, {"/never"}, {bytesOf("late")}));
  EXPECT_EQ(waiter.ping(9), 9u) << "nothing of the cancelled wait came before the ping's answer";
  // Its keys already there: STOP_WAITING at once, then the cancel's answer after it.
  waiter.send(query(Query::kWait, {"/k"}));
  waiter.send(query(Query::kCancelWait));
  EXPECT_EQ(waiter.read(2), std::string(1, tcpstore::kStopWaiting) +
                                std::string(1, tcpstore::kWaitCanceled));
}

TEST(TcpStoreServer, AnotherAttemptClosesTheOldConnectionsAndForgetsTheirKeys) {
  RendezvousServer server(torchServer());
  RawTorch old(server.port());
  old.send(query(Query::kSet, {"/default_pg/0//cpu//rank_1"}, {bytesOf("10.0.0.9:4000")}));
  old.send(query(Query::kWait, {"/never"}));
  EXPECT_EQ(old.ping(1), 1u);
  ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 1; }));
  server.beginTcpStoreAttempt(1, {}, true);
  EXPECT_TRUE(old.closedBy()) << "a dead attempt's client is disconnected";
  EXPECT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 0; }));
  RawTorch now(server.port());
  now.send(query(Query::kCheck, {"/default_pg/0//cpu//rank_1"}));
  EXPECT_EQ(now.read(1), std::string(1, tcpstore::kCheckNotReady))
      << "the next attempt sees a key of the dead one";
  now.send(query(Query::kGetNumKeys));
  EXPECT_EQ(now.i64(), 0);
}

TEST(TcpStoreServer, PeersThatAreNotTheJobsAndClientsBeforeAnyAttemptAreRefused) {
  ServerOptions o = torchServer();
  o.tcpstore_attempt = -1;
  RendezvousServer server(o);
  {
    RawTorch early(server.port());
    EXPECT_TRUE(early.closedBy()) << "served before the job's workers exist";
  }
  server.beginTcpStoreAttempt(0, {"192.0.2.7"}, /*loopback=*/false);
  {
    RawTorch stranger(server.port());
    EXPECT_TRUE(stranger.closedBy()) << "127.0.0.1 is not one of the job's nodes";
  }
  EXPECT_EQ(server.stats().tcpstore_refused, 2);
  server.beginTcpStoreAttempt(1, {"192.0.2.7", "127.0.0.1"}, false);
  RawTorch member(server.port());
  EXPECT_EQ(member.ping(5), 5u);
}

TEST(TcpStoreServer, GarbageUnknownQueriesAndHugeLengthsEndOnlyThatConnection) {
  RendezvousServer server(torchServer());
  RawTorch good(server.port());
  EXPECT_EQ(good.ping(1), 1u);
  {
    RawTorch unknown(server.port());
    unknown.send(std::string(1, static_cast<char>(tcpstore::kLastQuery + 5)));
    EXPECT_TRUE(unknown.closedBy());
  }
  {
    // A key length of 2^62: refused from the header, without waiting for its bytes.
    RawTorch huge(server.port());
    std::string q;
    tcpstore::appendU8(q, static_cast<uint8_t>(Query::kGet));
    tcpstore::appendLength(q, uint64_t{1} << 62);
    huge.send(q);
    EXPECT_TRUE(huge.closedBy(2000ms));
  }
  {
    // A value past the server's limit (1 MiB here), announced but never sent.
    RawTorch big(server.port());
    std::string q;
    tcpstore::appendU8(q, static_cast<uint8_t>(Query::kSet));
    tcpstore::appendLength(q, 2);
    q += "/k";
    tcpstore::appendLength(q, (1 << 20) + (2 << 20));
    big.send(q);
    EXPECT_TRUE(big.closedBy(2000ms));
  }
  {
    // Not torch's magic after its VALIDATE byte: gRPC's, which drops it.
    RawTorch wrong(server.port(), /*hello=*/false);
    wrong.send(std::string("\x00\x01\x02\x03\x04\x05", 6));
    EXPECT_TRUE(wrong.closedBy());
  }
  {
    // ADD on a value that is not a number: torch's server ends the connection too.
    RawTorch add(server.port());
    add.send(query(Query::kSet, {"/s"}, {bytesOf("abc")}));
    add.send(query(Query::kAdd, {"/s"}, {}, 1));
    EXPECT_TRUE(add.closedBy());
  }
  EXPECT_EQ(good.ping(2), 2u) << "the others are served on";
  EXPECT_GE(server.stats().tcpstore_errors, 4);
}

TEST(TcpStoreServer, ASlowSenderHoldsNoOneElse) {
  RendezvousServer server(torchServer());
  RawTorch slow(server.port());
  std::string q = tcpstore::encodeQuery(query(Query::kSet, {"/slow"}, {bytesOf("value")}));
  slow.send(q.substr(0, 6));  // a query's first bytes, then nothing
  RawTorch other(server.port());
  other.send(query(Query::kSet, {"/x"}, {bytesOf("1")}));
  other.send(query(Query::kGet, {"/x"}));
  EXPECT_EQ(other.bytes(), "1");
  slow.send(q.substr(6));
  slow.send(query(Query::kGet, {"/slow"}));
  EXPECT_EQ(slow.bytes(), "value");
}

TEST(TcpStoreServer, ParkedWaitsAreBoundedServerWide) {
  ServerOptions o = torchServer();
  o.limits.max_parked = 3;
  RendezvousServer server(o);
  std::vector<std::unique_ptr<RawTorch>> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.push_back(std::make_unique<RawTorch>(server.port()));
    waiters.back()->send(query(Query::kWait, {"/never"}));
  }
  ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 3; }));
  RawTorch one_more(server.port());
  one_more.send(query(Query::kWait, {"/never"}));
  EXPECT_TRUE(one_more.closedBy()) << "a fourth parked wait past max_parked=3";
  EXPECT_EQ(waiters[0]->ping(3), 3u);
}

}  // namespace
}  // namespace ddpl::rdzv
