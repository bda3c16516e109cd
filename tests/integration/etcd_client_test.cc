// launcher/etcd_client.h against a real etcd: the calls the etcd rendezvous is built on, checked
// on the wire (our proto/etcd/ messages against etcd's server), with the properties it relies
// on: of agents racing a compare-and-swap exactly one wins, a key on a lease vanishes when the
// keep-alives stop and a watch says so, a dead endpoint is skipped, TLS with client
// certificates works and a client without one is refused.
#include "launcher/etcd_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
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
      auto r = clients[i]->txn({{"/t/state", EtcdCompare::Target::kMod, kv->mod_revision}},
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
  auto w = c.watch("/t/", etcdPrefixEnd("/t/"), rev + 1,
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
