// LibTorch's own C++ client (c10d::TCPStore) against our server's TCPStore protocol and against
// torch's own server (libuv), in one process: every operation, its errors, timeouts, races and
// many waiters give the same results from both. (The Python client, which wraps this one, is
// compared the same way under launch: tests/python/tcpstore_conformance.py.)
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/server/server.h"

namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> b(const std::string& s) { return {s.begin(), s.end()}; }
std::string s(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

c10::intrusive_ptr<c10d::TCPStore> client(int port, std::chrono::milliseconds timeout = 20s) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

// What an operation gave: its result, or "error:" and the exception's kind.
std::string outcome(const std::function<std::string()>& fn) {
  try {
    return fn();
  } catch (const c10::DistQueueEmptyError&) {  // a DistStoreError: first
    return "error:DistQueueEmptyError";
  } catch (const c10::DistStoreError&) {
    return "error:DistStoreError";
  } catch (const c10::DistNetworkError&) {
    return "error:DistNetworkError";
  } catch (const c10::Error&) {
    return "error:c10::Error";
  }
}

std::vector<std::pair<std::string, std::string>> scenarios(int port) {
  auto st = client(port);
  std::vector<std::pair<std::string, std::string>> out;
  auto rec = [&](const std::string& name, const std::function<std::string()>& fn) {
    out.emplace_back(name, outcome(fn));
  };
  rec("set/get", [&] { st->set("k", b("v1")); return s(st->get("k")); });
  rec("empty value", [&] { st->set("e", {}); return std::to_string(st->get("e").size()); });
  rec("1 MiB value", [&] {
    st->set("big", std::vector<uint8_t>(1 << 20, 7));
    return std::to_string(st->get("big").size());
  });
  rec("add new", [&] { return std::to_string(st->add("ctr", 5)); });
  rec("add again", [&] { return std::to_string(st->add("ctr", -8)); });
  rec("counter as text", [&] { return s(st->get("ctr")); });
  rec("compareSet missing, expected empty", [&] { return s(st->compareSet("cs", {}, b("a"))); });
  rec("compareSet missing, expected set", [&] { return s(st->compareSet("cs2", b("x"), b("y"))); });
  rec("compareSet mismatch", [&] { return s(st->compareSet("cs", b("no"), b("b"))); });
  rec("compareSet match", [&] { return s(st->compareSet("cs", b("a"), b("b"))); });
  rec("check", [&] {
    return std::to_string(st->check({"k", "ctr"})) + std::to_string(st->check({"k", "absent"}));
  });
  rec("multiSet/multiGet", [&] {
    st->multiSet({"m1", "m2"}, {b("1"), b("2")});
    auto v = st->multiGet({"m2", "m1"});
    return s(v.at(0)) + s(v.at(1));
  });
  rec("append", [&] {
    st->append("ap", b("ab"));
    st->append("ap", b("cd"));
    return s(st->get("ap"));
  });
  rec("deleteKey", [&] {
    return std::to_string(st->deleteKey("m1")) + std::to_string(st->deleteKey("m1"));
  });
  rec("numKeys delta", [&] {
    int64_t before = st->getNumKeys();
    st->set("n1", b("1"));
    st->set("n2", b("2"));
    return std::to_string(st->getNumKeys() - before);
  });
  rec("queue", [&] {
    st->queuePush("q", b("one"));
    st->queuePush("q", b("two"));
    std::string r = std::to_string(st->queueLen("q"));
    r += s(st->queuePop("q", false)) + s(st->queuePop("q", true));
    return r + std::to_string(st->queueLen("q"));
  });
  rec("queue pop empty", [&] { return s(st->queuePop("q", false)); });
  auto brief = client(port, 500ms);
  rec("wait times out", [&] { brief->wait({"never"}); return std::string("returned"); });
  rec("get times out", [&] { return s(brief->get("never2")); });
  rec("explicit wait timeout", [&] {
    brief->wait({"never3"}, 200ms);
    return std::string("returned");
  });
  rec("usable after timeouts", [&] { brief->set("after", b("ok")); return s(brief->get("after")); });
  rec("blocking pop times out", [&] { return s(brief->queuePop("emptyq", true)); });
  rec("many waiters released by one set", [&] {
    std::vector<c10::intrusive_ptr<c10d::TCPStore>> cs;
    for (int i = 0; i < 16; ++i) cs.push_back(client(port));
    std::atomic<int> released{0};
    std::vector<std::thread> ts;
    for (auto& c : cs)
      ts.emplace_back([&, c] {
        c->wait({"gate"});
        ++released;
      });
    std::this_thread::sleep_for(200ms);
    st->set("gate", b("open"));
    for (auto& t : ts) t.join();
    return std::to_string(released.load());
  });
  rec("compareSet race: one winner", [&] {
    std::vector<c10::intrusive_ptr<c10d::TCPStore>> cs;
    for (int i = 0; i < 16; ++i) cs.push_back(client(port));
    std::atomic<int> wins{0};
    std::vector<std::thread> ts;
    for (int i = 0; i < 16; ++i)
      ts.emplace_back([&, i] {
        auto mine = b("c" + std::to_string(i));
        if (cs[i]->compareSet("race", {}, mine) == mine) ++wins;
      });
    for (auto& t : ts) t.join();
    return std::to_string(wins.load());
  });
  return out;
}

TEST(TcpStoreCppClient, OurServerAnswersAsTorchsOwnDoes) {
  ddpl::rdzv::ServerOptions o;
  o.host = "127.0.0.1";
  o.token = "not-for-torch";
  o.tcpstore = true;
  o.tcpstore_attempt = 0;
  o.stats_interval = ddpl::rdzv::Duration(0);
  ddpl::rdzv::RendezvousServer ours(o);

  c10d::TCPStoreOptions t;
  t.port = 0;
  t.isServer = true;
  t.waitWorkers = false;
  t.useLibUV = true;
  t.timeout = 20s;
  auto theirs = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", t);

  auto a = scenarios(ours.port());
  auto r = scenarios(theirs->getPort());
  ASSERT_EQ(a.size(), r.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].second, r[i].second) << a[i].first << ": ours vs torch's";
  EXPECT_EQ(a.front().second, "v1");  // it ran at all
}

}  // namespace
