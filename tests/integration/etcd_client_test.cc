// launcher/membership/etcd/etcd_client.h against a real etcd: the calls the etcd rendezvous is
// built on, checked on the wire (our proto/etcd/ messages against etcd's server), with the
// properties it relies on: of agents racing a compare-and-swap exactly one wins, a key on a lease
// vanishes when the keep-alives stop and a watch says so, a dead endpoint is skipped, TLS with
// client certificates works and a client without one is refused.
#include "launcher/membership/etcd/etcd_client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/errors.h"
#include "tests/common/etcd_cluster.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// etcd's count of the LeaseKeepAlive streams it started (its /metrics).
const std::string kKeepAliveStreams = "grpc_server_started_total{grpc_method=\"LeaseKeepAlive\"";

// A lease on "/t/alive" kept by `c`'s keeper; `expired` counts the keeper's reports of its loss.
struct KeptAlive {
  KeptAlive(EtcdClient& c, std::chrono::seconds ttl) {
    int64_t lease = c.grantLease(ttl);
    c.put("/t/alive", "", lease);
    keeper = c.keepAlive(lease, ttl, [this](int64_t) {
      ++expired;
      return int64_t{0};
    });
  }
  std::atomic<int> expired{0};
  std::unique_ptr<EtcdLeaseKeeper> keeper;
};

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdCluster::installed())
      GTEST_SKIP() << "etcd is not installed (make setup installs Debian's etcd-server)";
  }
  EtcdOptions options(const EtcdCluster& c) {
    EtcdOptions o;
    for (const auto& e : split(c.endpoints())) o.endpoints.push_back(e);
    o.connect_timeout = 5s;
    o.call_timeout = 5s;
    return o;
  }
  // The client asks member `first` first (its streams start there), then the others in turn.
  EtcdOptions startingAt(const EtcdCluster& c, int first) {
    EtcdOptions o = options(c);
    o.endpoints = {c.endpoint(first), c.endpoint((first + 1) % 3), c.endpoint((first + 2) % 3)};
    return o;
  }
};

}  // namespace

TEST_F(EtcdClientTest, OfAgentsRacingACompareAndSwapExactlyOneWins) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient setup(options(etcd));
  setup.put("/t/state", "round 0");
  auto kv = setup.get("/t/state");
  ASSERT_TRUE(kv);
  constexpr int kAgents = 8;
  std::vector<std::unique_ptr<EtcdClient>> clients;
  for (int i = 0; i < kAgents; ++i) clients.push_back(std::make_unique<EtcdClient>(options(etcd)));
  std::atomic<int> ready{0}, won{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kAgents; ++i)
    threads.emplace_back([&, i] {
      ++ready;
      while (ready < kAgents) std::this_thread::yield();
      auto r =
          clients[i]->txn({{"/t/state", EtcdCompare::Target::kMod, kv->mod_revision}},
                          {{EtcdOp::Kind::kPut, "/t/state", "round 1 by " + std::to_string(i)}});
      if (r.succeeded) ++won;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(setup.get("/t/state")->value.rfind("round 1 by ", 0), 0u);

  // Counters by compare-and-swap lose no increment under contention.
  threads.clear();
  for (int i = 0; i < kAgents; ++i)
    threads.emplace_back([&, i] {
      for (int n = 0; n < 20; ++n) clients[i]->add("/t/count", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(setup.add("/t/count", 0), kAgents * 20);
  EXPECT_EQ(setup.deletePrefix("/t/"), 2);
  EXPECT_TRUE(setup.getPrefix("/t/").empty());
}

TEST_F(EtcdClientTest, LeasedKeyVanishesWhenKeepAlivesStopAndTheWatchSaysSo) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient c(options(etcd));
  int64_t lease = c.grantLease(2s);
  c.put("/t/members/b", "", c.grantLease(60s));
  int64_t rev = c.put("/t/members/a", "", lease);
  std::mutex mu;
  std::vector<EtcdEvent> seen;
  auto w = c.watch(
      "/t/", etcdPrefixEnd("/t/"), rev + 1,
      [&](const std::vector<EtcdEvent>& ev) {
        std::lock_guard<std::mutex> lock(mu);
        seen.insert(seen.end(), ev.begin(), ev.end());
      },
      [](const std::string&) {});
  // Kept alive past its TTL, it stays.
  for (int i = 0; i < 4; ++i) {
    EXPECT_GT(c.keepAliveOnce(lease), 0);
    std::this_thread::sleep_for(700ms);
  }
  EXPECT_TRUE(c.get("/t/members/a"));
  auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return !seen.empty();
      },
      10s));
  auto after = std::chrono::steady_clock::now() - stopped;
  EXPECT_LT(after, 4s);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].type, EtcdEvent::Type::kDelete);
    EXPECT_EQ(seen[0].kv.key, "/t/members/a");
  }
  EXPECT_EQ(c.keepAliveOnce(lease), 0);  // expired: the agent learns it was dropped
  EXPECT_FALSE(c.get("/t/members/a"));
  EXPECT_TRUE(c.get("/t/members/b"));
}

TEST_F(EtcdClientTest, ADeadEndpointIsSkipped) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdOptions o = options(etcd);
  o.endpoints.insert(o.endpoints.begin(), "127.0.0.1:" + std::to_string(freeLoopbackPort()));
  EtcdClient c(o);
  c.put("/t/k", "v");
  EXPECT_EQ(c.get("/t/k")->value, "v");
  EXPECT_TRUE(c.waitForEvent("/t/k", "", 1, 2s));  // revision 1 on: the put is in it
}

TEST_F(EtcdClientTest, TlsWithClientCertificatesAndNoneRefused) {
  std::string dir = makeTempDir("etcd-tls");
  auto made = makeTestTls(dir, true);
  if (!made) GTEST_SKIP() << "openssl could not make test certificates";
  EtcdTls tls = *made;
  EtcdCluster etcd(1, tls);
  ASSERT_TRUE(etcd.healthy());
  EtcdOptions o = options(etcd);
  o.ca_file = tls.ca;
  o.cert_file = tls.cert;
  o.key_file = tls.key;
  EtcdClient c(o);
  c.put("/t/k", "over tls");
  EXPECT_EQ(c.get("/t/k")->value, "over tls");
  // No client certificate: etcd refuses the handshake; plaintext to a TLS port fails too.
  EtcdOptions no_cert = options(etcd);
  no_cert.ca_file = tls.ca;
  no_cert.connect_timeout = 2s;
  EXPECT_THROW(EtcdClient{no_cert}, ddpl::NetworkError);
  EtcdOptions plain = options(etcd);
  plain.connect_timeout = 2s;
  EXPECT_THROW(EtcdClient{plain}, ddpl::NetworkError);
}

// The reads and compares the etcd rendezvous counts places with (issue 14): what they return
// must not depend on how many keys there are, and the "nothing changed since" compare must
// fail on exactly the change it guards against.
TEST_F(EtcdClientTest, RangesCountReadOnlyChangesAndGuardACount) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient c(options(etcd));
  c.put("/t/p/b", "1");
  c.put("/t/p/a", "2");
  int64_t seen = c.put("/t/p/c", "3");
  c.put("/t/q", "outside");
  EtcdRange all;
  all.key = "/t/p/";
  all.range_end = etcdPrefixEnd(all.key);

  EtcdRange count = all;
  count.count_only = true;
  auto n = c.range(count);
  EXPECT_EQ(n.count, 3);
  EXPECT_TRUE(n.kvs.empty());

  EtcdRange oldest = all;
  oldest.oldest_first = true;
  oldest.limit = 1;
  oldest.keys_only = true;
  auto first = c.range(oldest);
  ASSERT_EQ(first.kvs.size(), 1u);
  EXPECT_EQ(first.kvs[0].key, "/t/p/b");  // created first, though not first by name
  EXPECT_EQ(first.kvs[0].value, "");

  // Only what changed since `seen`, and still the count of the whole range: a key gone shows
  // as a count below what the reader holds.
  c.put("/t/p/d", "4");
  c.txn({}, {{EtcdOp::Kind::kDelete, "/t/p/a"}});
  EtcdRange since = all;
  since.min_mod_revision = seen + 1;
  auto changed = c.range(since);
  ASSERT_EQ(changed.kvs.size(), 1u);
  EXPECT_EQ(changed.kvs[0].key, "/t/p/d");
  EXPECT_EQ(changed.count, 3);  // b, c, d

  // "No change to the guard key after revision R": holds until someone touches it.
  int64_t r = c.put("/t/seq", "x");
  EtcdCompare unchanged{"/t/seq", EtcdCompare::Target::kMod, r + 1, "", EtcdCompare::Result::kLess};
  EXPECT_TRUE(c.txn({unchanged}, {{EtcdOp::Kind::kPut, "/t/state", "closed"}}).succeeded);
  c.put("/t/seq", "y");
  EXPECT_FALSE(c.txn({unchanged}, {{EtcdOp::Kind::kPut, "/t/state", "closed again"}}).succeeded);
}

// One stream over several ranges: events of each arrive, and only theirs.
TEST_F(EtcdClientTest, OneWatchOverSeveralRanges) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient c(options(etcd));
  int64_t rev = c.put("/t/other", "0");
  std::mutex mu;
  std::vector<std::string> keys;
  auto w = c.watch(
      {{"/t/state", ""}, {"/t/joins/", etcdPrefixEnd("/t/joins/")}}, rev + 1,
      [&](const std::vector<EtcdEvent>& evs) {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& e : evs) keys.push_back(e.kv.key);
      },
      [](const std::string&) {});
  c.put("/t/other", "1");
  c.put("/t/joins/a", "");
  c.put("/t/state", "s");
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return keys.size() >= 2;
      },
      10s));
  std::this_thread::sleep_for(200ms);  // room for a wrong extra event to arrive
  std::lock_guard<std::mutex> lock(mu);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"/t/joins/a", "/t/state"}));
  // A wait over several ranges returns on an event in any of them.
  EXPECT_TRUE(c.waitForEvent({{"/t/nothing", ""}, {"/t/state", ""}}, rev + 1, 2s));
  EXPECT_FALSE(c.waitForEvent({{"/t/nothing", ""}}, rev + 1, 300ms));
}

// A watch that has worked for longer than the connect timeout, whose member then dies, moves
// to another member and misses nothing. (It used to count the connect timeout from when it was
// created, and so failed at its first break once it was older than that: found by the
// netfault scenario etcd_leader_isolated once etcd ended the old leader's watches.)
TEST_F(EtcdClientTest, AWatchOlderThanTheConnectTimeoutMovesToAnotherMemberWhenItsOwnDies) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.healthy());
  int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  int follower = (leader + 1) % 3;
  EtcdOptions o = startingAt(etcd, follower);
  o.connect_timeout = 2s;
  EtcdClient c(o);
  int64_t rev = c.put("/t/x", "0");
  std::mutex mu;
  std::vector<std::string> values;
  std::string failure;
  auto w = c.watch(
      "/t/x", "", rev + 1,
      [&](const std::vector<EtcdEvent>& evs) {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& e : evs) values.push_back(e.kv.value);
      },
      [&](const std::string& why) {
        std::lock_guard<std::mutex> lock(mu);
        failure = why;
      });
  auto seen = [&](size_t n) {
    return eventually(
        [&] {
          std::lock_guard<std::mutex> lock(mu);
          return values.size() >= n;
        },
        10s);
  };
  c.put("/t/x", "1");
  ASSERT_TRUE(seen(1));
  std::this_thread::sleep_for(o.connect_timeout + 1s);
  etcd.kill9(follower);
  c.put("/t/x", "2");  // while the watch moves: delivered from its next revision
  c.put("/t/x", "3");
  EXPECT_TRUE(seen(3));
  std::this_thread::sleep_for(o.connect_timeout + 1s);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(failure, "");
  EXPECT_EQ(values, (std::vector<std::string>{"1", "2", "3"}));
}

// A watch on a member that lost its leader (the other two members SIGKILLed: no quorum left)
// is ended by etcd ("no leader", as the watch asks with clientv3's WithRequireLeader metadata)
// instead of staying open and silent until the member is back in a cluster; with no member
// able to take it, the watch reports its failure. Without the metadata it never does.
TEST_F(EtcdClientTest, AWatchOnAMemberThatLostItsLeaderDoesNotStaySilent) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.healthy());
  int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  int follower = (leader + 1) % 3, other = (leader + 2) % 3;
  EtcdClient c(startingAt(etcd, follower));  // the watch starts on the follower
  int64_t rev = c.put("/t/x", "0");
  std::atomic<int> events{0};
  std::mutex mu;
  std::string failure;
  auto w = c.watch(
      "/t/x", "", rev + 1, [&](const std::vector<EtcdEvent>& evs) { events += evs.size(); },
      [&](const std::string& why) {
        std::lock_guard<std::mutex> lock(mu);
        failure = why;
      });
  c.put("/t/x", "1");
  ASSERT_TRUE(eventually([&] { return events.load() == 1; }, 10s)) << "the watch works";
  etcd.kill9(leader);
  etcd.kill9(other);
  // etcd notices a lost leader after about three election timeouts (1 s here), then the
  // watch tries every endpoint for the client's connect timeout (5 s).
  EXPECT_TRUE(eventually(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return !failure.empty();
      },
      30s))
      << "the watch on the leaderless member stayed open and silent";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_NE(failure.find("no endpoint took it over"), std::string::npos) << failure;
}

// The lease keeper (issue 14): one LeaseKeepAlive stream for as long as it works, whatever the
// number of TTLs (a stream per keep-alive cost etcd a new stream every TTL/3 per agent); a
// member that stalls for less than what is left of the lease (SIGSTOP: its connections stay
// open, answers just stop) costs nothing, the keep-alive waiting on the stream is answered
// when it resumes; stopping the keeper does not wait for the stalled member.
TEST_F(EtcdClientTest, KeeperUsesOneStreamAndOutlastsAStalledMember) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient c(options(etcd));
  const std::string renewed = "etcd_debugging_lease_renewed_total ";
  double streams_before = etcd.metric(0, kKeepAliveStreams),
         renewed_before = etcd.metric(0, renewed);
  ASSERT_GE(streams_before, 0) << "etcd's /metrics could not be read";
  constexpr auto kTtl = 6s;
  KeptAlive kept(c, kTtl);
  std::this_thread::sleep_for(3 * kTtl);
  EXPECT_TRUE(c.get("/t/alive"));
  EXPECT_EQ(etcd.metric(0, kKeepAliveStreams) - streams_before, 1)
      << "one stream for every keep-alive";
  // Every TTL/3: some 9 in 3 TTLs; at least 4 however slow the machine.
  EXPECT_GE(etcd.metric(0, renewed) - renewed_before, 4);

  // A stall shorter than what is left of the lease, begun just after a renewal (etcd's count
  // moved): 3 s of the 6 the renewal gave, and the next keep-alive (TTL/3 after it) waits on the
  // stalled member's stream for a second. Begun at any moment, the stall had 4 s at least, less
  // a late keep-alive and a slow resumption under load: about a second of margin.
  const double renewed_at_stall = etcd.metric(0, renewed);
  ASSERT_TRUE(eventually([&] { return etcd.metric(0, renewed) > renewed_at_stall; }, 10s))
      << "no renewal within 10 s of a 6 s lease";
  etcd.sendSignal(0, SIGSTOP);
  std::this_thread::sleep_for(3s);
  etcd.sendSignal(0, SIGCONT);
  std::this_thread::sleep_for(kTtl);  // past the TTL from the stall: renewed after it
  EXPECT_TRUE(c.get("/t/alive"));
  EXPECT_EQ(kept.expired.load(), 0);
  EXPECT_EQ(etcd.metric(0, kKeepAliveStreams) - streams_before, 1)
      << "a slow answer is no broken stream";

  // Stopped while the member stalls: returns without waiting for it.
  etcd.sendSignal(0, SIGSTOP);
  auto stopping = std::chrono::steady_clock::now();
  kept.keeper.reset();
  auto took = std::chrono::steady_clock::now() - stopping;
  etcd.sendSignal(0, SIGCONT);
  EXPECT_LT(took, 5s);
  // No keep-alive after it: the lease runs out.
  EXPECT_TRUE(eventually([&] { return !c.get("/t/alive"); }, kTtl + 5s));
}

// A stream that breaks (its member SIGKILLed) is reopened on another member at once, and the
// lease lives on. A follower is killed: a new leader would extend every lease by itself.
TEST_F(EtcdClientTest, KeeperMovesToAnotherMemberWhenItsStreamBreaks) {
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.healthy());
  int leader = etcd.leader();
  ASSERT_GE(leader, 0);
  int follower = (leader + 1) % 3;
  EtcdClient c(startingAt(etcd, follower));  // the keeper starts on the follower
  constexpr auto kTtl = 3s;
  KeptAlive kept(c, kTtl);
  ASSERT_TRUE(eventually([&] { return etcd.metric(follower, kKeepAliveStreams) >= 1; }, 10s));
  double elsewhere = 0;
  for (int i = 0; i < 3; ++i)
    if (i != follower) elsewhere += etcd.metric(i, kKeepAliveStreams);
  etcd.kill9(follower);
  std::this_thread::sleep_for(3 * kTtl);
  EXPECT_TRUE(c.get("/t/alive"));
  EXPECT_EQ(kept.expired.load(), 0);
  double now_elsewhere = 0;
  for (int i = 0; i < 3; ++i)
    if (i != follower) now_elsewhere += etcd.metric(i, kKeepAliveStreams);
  EXPECT_EQ(now_elsewhere - elsewhere, 1) << "one stream, reopened once";
}

// Expired: the callback runs, and the lease it returns is kept from then on.
TEST_F(EtcdClientTest, KeeperReportsAnExpiredLeaseAndKeepsTheFreshOne) {
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.healthy());
  EtcdClient c(options(etcd));
  constexpr auto kTtl = 3s;
  int64_t lease = c.grantLease(kTtl);
  std::atomic<int64_t> reported{0}, fresh{0};
  auto keeper = c.keepAlive(lease, kTtl, [&](int64_t id) {
    reported = id;
    fresh = c.grantLease(kTtl);
    c.put("/t/fresh", "", fresh);
    return fresh.load();
  });
  c.revokeLease(lease);  // as etcd does to a lease whose keep-alives stopped for its TTL
  ASSERT_TRUE(eventually([&] { return fresh.load() != 0; }, 10s));
  EXPECT_EQ(reported.load(), lease);
  std::this_thread::sleep_for(3 * kTtl);
  EXPECT_TRUE(c.get("/t/fresh"));
}
