// torch's TCPStore protocol on our server (protocol/tcpstore_format.h,
// server/wire_server_tcpstore.cc): its parser, then the server under raw-socket clients that
// speak the protocol by hand (so the test sees exactly the bytes and the EOF the server sends):
// peers that are not the job's, no attempt open, garbage, unknown query types, lengths far past
// the limits, slow senders, a new attempt closing the old one's connections and deleting its
// keys, WAIT and CANCEL_WAIT in the order torch's client needs, the parked-wait bound, and the
// types newer than the pinned torch's client (LIST_KEYS and BARRIER, torch 2.10+), which only
// these raw clients can send here. The real torch client is tested against the real torch
// server in tests/python (tcpstore_conformance.py, under launch; tcpstore_conformance_2x.py
// with two ranks and any torch). Servers are in-process, loopback, port 0.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

#include "common/log.h"
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
      query(Query::kListKeys),
      query(Query::kBarrier, {"/b"}, {}, 8),
      query(Query::kBarrier, {""}, {}, -1),
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
  std::string barrier_key;
  tcpstore::appendU8(barrier_key, static_cast<uint8_t>(Query::kBarrier));
  tcpstore::appendLength(barrier_key, uint64_t{1} << 62);
  check(barrier_key, "BARRIER: a key of 4611686018427387904 bytes (at most 16)");
  std::string unknown(1, static_cast<char>(tcpstore::kLastQuery + 1));
  auto res = tcpstore::parseQuery(unknown.data(), unknown.size(), limits, &out);
  EXPECT_EQ(res.status, tcpstore::Parse::kUnknown);
  EXPECT_EQ(res.type, tcpstore::kLastQuery + 1);
}

// torch 2.15's enum (store/TCPStoreBackend.hpp): every type through BARRIER is known.
TEST(TcpStoreFormat, KnowsEveryTypeOfTorch215) {
  EXPECT_EQ(tcpstore::kLastQuery, 18);
  EXPECT_STREQ(tcpstore::queryName(17), "LIST_KEYS");
  EXPECT_STREQ(tcpstore::queryName(18), "BARRIER");
  EXPECT_STREQ(tcpstore::queryName(19), "unknown");
  tcpstore::Limits limits;
  Request out;
  std::string list(1, '\x11');
  EXPECT_EQ(tcpstore::parseQuery(list.data(), list.size(), limits, &out).status,
            tcpstore::Parse::kOk);
  EXPECT_EQ(out.type, Query::kListKeys);
  // The bytes torch 2.15.0's client sends for store.barrier("b", 1) (TCPStore's keys start
  // with '/'), recorded from it.
  const unsigned char barrier[] = {0x12, 0x02, 0, 0, 0, 0, 0, 0, 0, '/',
                                   'b',  0x01, 0, 0, 0, 0, 0, 0, 0};
  auto res =
      tcpstore::parseQuery(reinterpret_cast<const char*>(barrier), sizeof(barrier), limits, &out);
  ASSERT_EQ(res.status, tcpstore::Parse::kOk);
  EXPECT_EQ(res.consumed, sizeof(barrier));
  EXPECT_EQ(out.type, Query::kBarrier);
  EXPECT_EQ(out.keys, std::vector<std::string>{"/b"});
  EXPECT_EQ(out.number, 1);
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
  // LIST_KEYS and BARRIER are written byte by byte, as torch 2.15's client sends them (type 17
  // with nothing more; type 18, the key, the world size as int64), not with encodeQuery.
  //
  // A LIST_KEYS answer: its count, then each key; sorted.
  std::vector<std::string> listKeys() {
    send(std::string(1, '\x11'));
    int64_t n = i64();
    std::vector<std::string> keys;
    for (int64_t i = 0; i < n && !ended_; ++i) keys.push_back(bytes());
    if (n < 0) keys.push_back("<no answer>");
    std::sort(keys.begin(), keys.end());
    return keys;
  }
  // One BARRIER; its answer is read with barrierDone.
  void barrier(const std::string& key, int64_t world) {
    std::string q(1, '\x12');
    tcpstore::appendLength(q, key.size());
    q += key;
    tcpstore::appendI64(q, world);
    send(q);
  }
  bool barrierDone(std::chrono::milliseconds within = 5000ms) {
    return read(1, within) == std::string(1, tcpstore::kStopWaiting);
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

// ---- the types new since the pinned torch's client: LIST_KEYS and BARRIER ----------------

using Keys = std::vector<std::string>;

TEST(TcpStoreServer, ListKeysAnswersTheAttemptsKeysAsTheClientNamedThem) {
  RendezvousServer server(torchServer());
  RawTorch c(server.port());
  EXPECT_EQ(c.listKeys(), Keys{}) << "an empty store";
  c.send(query(Query::kSet, {"/a"}, {bytesOf("1")}));
  c.send(query(Query::kMultiSet,
               {"/b/c", "",
                "/\x01"
                "bin"},
               {bytesOf("2"), bytesOf(""), bytesOf("")}));
  c.send(query(Query::kQueuePush, {"/q"}, {bytesOf("item")}));
  // As torch's server: every key (the client keeps those under its own prefix), and a queue
  // is not a key.
  EXPECT_EQ(c.listKeys(), (Keys{"",
                                "/\x01"
                                "bin",
                                "/a", "/b/c"}));
  c.send(query(Query::kDeleteKey, {"/b/c"}));
  EXPECT_EQ(c.i64(), 1);
  RawTorch other(server.port());
  EXPECT_EQ(other.listKeys(), (Keys{"",
                                    "/\x01"
                                    "bin",
                                    "/a"}))
      << "another client of the attempt";
  server.beginTcpStoreAttempt(1, {}, true);
  RawTorch next(server.port());
  EXPECT_EQ(next.listKeys(), Keys{}) << "a key of the attempt before";
  next.send(query(Query::kSet, {"/mine"}, {bytesOf("x")}));
  EXPECT_EQ(next.listKeys(), Keys{"/mine"});
  EXPECT_EQ(next.ping(3), 3u);
}

TEST(TcpStoreServer, ListKeysAnswersUpToTheLargestQueryAndEndsPastIt) {
  RendezvousServer server(torchServer());  // max_value_bytes 1 MiB
  // The bound: a query whole, max_value_bytes + 1 MiB. An answer is its count (8 bytes), then
  // each key as its length (8) and its bytes: fill it to exactly the bound.
  const uint64_t limit = (uint64_t{1} << 20) + (uint64_t{1} << 20);
  const uint64_t per = 1024;  // 8 + a key of 1016 bytes
  uint64_t n = (limit - 8) / per, rest = (limit - 8) - n * per;
  ASSERT_GE(rest, 8u);
  Keys keys;
  std::vector<std::vector<uint8_t>> values;
  for (uint64_t i = 0; i < n; ++i) {
    std::string k = fmt::format("/k{:06}", i);
    keys.push_back(k + std::string(per - 8 - k.size(), 'x'));
    values.emplace_back();
  }
  keys.push_back("/" + std::string(rest - 8 - 1, 'y'));
  values.emplace_back();
  RawTorch c(server.port());
  for (size_t at = 0; at < keys.size(); at += 512) {
    size_t end = std::min(keys.size(), at + 512);
    c.send(query(Query::kMultiSet, Keys(keys.begin() + at, keys.begin() + end),
                 {values.begin() + at, values.begin() + end}));
  }
  EXPECT_EQ(c.ping(1), 1u);
  Keys listed = c.listKeys();
  ASSERT_EQ(listed.size(), keys.size()) << "an answer of exactly the bound";
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(listed, keys);
  // One key more (10 bytes of answer): past the bound, the connection ends.
  c.send(query(Query::kSet, {"/z"}, {bytesOf("")}));
  c.send(std::string(1, '\x11'));
  EXPECT_TRUE(c.closedBy()) << "an answer past the bound";
  RawTorch other(server.port());
  EXPECT_EQ(other.ping(2), 2u) << "the others are served on";
  other.send(query(Query::kGetNumKeys));
  EXPECT_EQ(other.i64(), static_cast<int64_t>(keys.size()) + 1) << "the store is as it was";
}

TEST(TcpStoreServer, BarrierReleasesEveryoneWhenTheLastArrives) {
  RendezvousServer server(torchServer());
  RawTorch a(server.port()), b(server.port()), c(server.port());
  a.barrier("/bar", 3);
  b.barrier("/bar", 3);
  EXPECT_FALSE(a.barrierDone(300ms)) << "released with 1 of 3 arrived";
  EXPECT_FALSE(b.barrierDone(10ms)) << "released with 2 of 3 arrived";
  ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 2; }));
  c.barrier("/bar", 3);
  EXPECT_TRUE(c.barrierDone()) << "the last to arrive";
  EXPECT_TRUE(a.barrierDone());
  EXPECT_TRUE(b.barrierDone());
  EXPECT_EQ(server.stats().parked_store_calls, 0);
  // As torch's server: the key holds the count, is a key like any other, and the barrier is
  // for one use (one more arrival passes at once).
  a.send(query(Query::kGet, {"/bar"}));
  EXPECT_EQ(a.bytes(), "3");
  EXPECT_EQ(a.listKeys(), Keys{"/bar"}) << "its release is no key of the client's";
  a.send(query(Query::kGetNumKeys));
  EXPECT_EQ(a.i64(), 1);
  a.barrier("/bar", 3);
  EXPECT_TRUE(a.barrierDone(1000ms));
  // A world of one, or less: at once.
  b.barrier("/solo", 1);
  EXPECT_TRUE(b.barrierDone(1000ms));
  b.barrier("/none", -5);
  EXPECT_TRUE(b.barrierDone(1000ms));
  // The key deleted: counting starts again, and the release of the round before is not its.
  c.send(query(Query::kDeleteKey, {"/bar"}));
  EXPECT_EQ(c.i64(), 1);
  c.barrier("/bar", 2);
  EXPECT_FALSE(c.barrierDone(300ms)) << "released by the barrier before";
  a.barrier("/bar", 2);
  EXPECT_TRUE(a.barrierDone());
  EXPECT_TRUE(c.barrierDone());
}

TEST(TcpStoreServer, BarrierCancelledByItsClientOrItsDisconnectLeavesNothingParked) {
  RendezvousServer server(torchServer());
  {
    // Its client's timeout: CANCEL_WAIT, answered WAIT_CANCELED; it stays counted, as in
    // torch's server.
    RawTorch a(server.port()), b(server.port());
    a.barrier("/t", 2);
    ASSERT_TRUE(
        ::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 1; }));
    a.send(query(Query::kCancelWait));
    EXPECT_EQ(a.read(1), std::string(1, tcpstore::kWaitCanceled));
    EXPECT_EQ(server.stats().parked_store_calls, 0);
    b.barrier("/t", 2);
    EXPECT_TRUE(b.barrierDone()) << "the cancelled arrival counted";
    EXPECT_EQ(a.ping(4), 4u) << "nothing of the cancelled barrier came after its cancel";
  }
  {
    // A participant that disconnects while parked: its wait is dropped with it; it stays
    // counted, and the others are released by the last of them.
    auto gone = std::make_unique<RawTorch>(server.port());
    gone->barrier("/d", 3);
    ASSERT_TRUE(
        ::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 1; }));
    gone.reset();
    ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 0; }))
        << "a disconnected participant's barrier stays parked";
    RawTorch b(server.port()), c(server.port());
    b.barrier("/d", 3);
    EXPECT_FALSE(b.barrierDone(300ms));
    c.barrier("/d", 3);
    EXPECT_TRUE(c.barrierDone());
    EXPECT_TRUE(b.barrierDone());
  }
}

TEST(TcpStoreServer, ANewAttemptEndsTheOldAttemptsBarriers) {
  RendezvousServer server(torchServer());
  RawTorch old(server.port());
  old.barrier("/default_pg/0/store_based_barrier", 2);
  ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 1; }));
  server.beginTcpStoreAttempt(1, {}, true);
  EXPECT_TRUE(old.closedBy()) << "a dead attempt's participant is disconnected";
  EXPECT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 0; }));
  EXPECT_TRUE(::ddpl::testing::eventually([&] { return server.stats().keys == 0; }))
      << "the old attempt's barrier left keys: " << server.stats().keys;
  // The new attempt's barrier of the same name counts from 1: the dead rank's arrival is not
  // one of its.
  RawTorch a(server.port()), b(server.port());
  a.barrier("/default_pg/0/store_based_barrier", 2);
  EXPECT_FALSE(a.barrierDone(300ms)) << "released by the arrival of the attempt before";
  b.barrier("/default_pg/0/store_based_barrier", 2);
  EXPECT_TRUE(b.barrierDone());
  EXPECT_TRUE(a.barrierDone());
}

TEST(TcpStoreServer, BarriersAreBoundedAndMalformedOnesEndOnlyTheirConnection) {
  ServerOptions o = torchServer();
  o.limits.max_parked = 2;
  RendezvousServer server(o);
  RawTorch a(server.port()), b(server.port());
  a.barrier("/wide", 100);
  b.barrier("/wide", 100);
  ASSERT_TRUE(::ddpl::testing::eventually([&] { return server.stats().parked_store_calls == 2; }));
  {
    RawTorch one_more(server.port());
    one_more.barrier("/wide", 100);
    EXPECT_TRUE(one_more.closedBy()) << "a third parked barrier past max_parked=2";
  }
  {
    // A key length of 2^62: refused from the header.
    RawTorch huge(server.port());
    std::string q(1, '\x12');
    tcpstore::appendLength(q, uint64_t{1} << 62);
    huge.send(q);
    EXPECT_TRUE(huge.closedBy(2000ms));
  }
  {
    // Its world size in two parts: nothing happens until it is whole.
    RawTorch slow(server.port());
    std::string q(1, '\x12');
    tcpstore::appendLength(q, 5);
    q += "/slow";
    tcpstore::appendI64(q, 1);
    slow.send(q.substr(0, q.size() - 3));
    EXPECT_FALSE(slow.barrierDone(300ms));
    slow.send(q.substr(q.size() - 3));
    EXPECT_TRUE(slow.barrierDone());
  }
  {
    // A barrier on a key that is no count: torch's server ends the connection too.
    RawTorch text(server.port());
    text.send(query(Query::kSet, {"/text"}, {bytesOf("abc")}));
    text.barrier("/text", 2);
    EXPECT_TRUE(text.closedBy());
  }
  EXPECT_EQ(server.stats().parked_store_calls, 2);
  EXPECT_EQ(a.ping(5), 5u) << "the parked ones are served on";
}

// A client whose torch is newer than this server's protocol: the connection ends, and the log
// says why and what to do.
TEST(TcpStoreServer, ATypeNewerThanTorch215IsNamedWithTheOptOut) {
  std::ostringstream logged;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logged);
  log::logger().sinks().push_back(sink);
  RendezvousServer server(torchServer());
  {
    RawTorch newer(server.port());
    EXPECT_EQ(newer.ping(1), 1u);
    newer.send(std::string(1, static_cast<char>(19)));
    EXPECT_TRUE(newer.closedBy());
  }
  auto& sinks = log::logger().sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  std::string text = logged.str();
  EXPECT_NE(text.find("query type 19, which torch 2.15.0's TCPStore protocol does not have (it "
                      "has types 0-18)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"), std::string::npos) << text;
}

}  // namespace
}  // namespace ddpl::rdzv
