// Agents forming rounds through a real server on port 0: ranks, watches, heartbeats,
// eviction and the errors a misconfigured node gets.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/server/server.h"

namespace ddpl::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

RendezvousClientOptions clientOptions(const RendezvousServer& s) {
  RendezvousClientOptions o;
  o.endpoint = s.endpoint();
  o.connect_timeout = seconds(10);
  return o;
}

JoinOptions joinOptions(const std::string& run, const std::string& node, int min, int max,
                        int lws = 1) {
  JoinOptions j;
  j.run_id = run;
  j.node_id = node;
  j.local_world_size = lws;
  j.address = node + ".cluster";
  j.min_nodes = min;
  j.max_nodes = max;
  j.join_timeout = seconds(60);
  j.last_call_timeout = seconds(0);
  return j;
}

// Collects the one RoundChange a watch reports.
struct ChangeLatch {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<RoundChange> change;
  std::function<void(const RoundChange&)> callback() {
    return [this](const RoundChange& c) {
      std::lock_guard<std::mutex> l(mu);
      change = c;
      cv.notify_all();
    };
  }
  std::optional<RoundChange> await(Duration limit = seconds(20)) {
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, limit, [&] { return change.has_value(); });
    return change;
  }
};

// c-node (2 workers), a-node (4) and b-node (1) join one round of `run` at once; their
// assignments in that order.
std::vector<RoundAssignment> joinThree(RendezvousClient& client, const std::string& run,
                                       bool include_members) {
  std::vector<std::future<RoundAssignment>> f;
  int lws[] = {2, 4, 1};
  const char* ids[] = {"c-node", "a-node", "b-node"};
  for (int i = 0; i < 3; ++i) {
    auto j = joinOptions(run, ids[i], 3, 3, lws[i]);
    j.include_members = include_members;
    f.push_back(std::async(std::launch::async, [&client, j] { return client.join(j); }));
  }
  std::vector<RoundAssignment> a;
  for (auto& x : f) a.push_back(x.get());
  return a;
}

TEST(MembershipTest, AgentsFormOneRoundWithConsistentRanks) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto a = joinThree(client, "job", /*include_members=*/true);
  // Ranks follow sorted node ids: a-node (4 workers), b-node (1), c-node (2).
  EXPECT_EQ(a[1].group_rank, 0);
  EXPECT_EQ(a[2].group_rank, 1);
  EXPECT_EQ(a[0].group_rank, 2);
  for (auto& x : a) {
    EXPECT_EQ(x.round, 0);
    EXPECT_EQ(x.group_world_size, 3);
    EXPECT_EQ(x.world_size, 7);
    EXPECT_EQ(x.rank_offsets, (std::vector<int32_t>{0, 4, 5}));
    EXPECT_EQ(x.master_address, "a-node.cluster");
    EXPECT_EQ(x.store_prefix, "job/0/");
    ASSERT_EQ(x.members.size(), 3u);
    EXPECT_EQ(x.members[1].node_id, "b-node");
    EXPECT_GT(x.heartbeat_interval.count(), 0);
  }
  EXPECT_EQ(a[0].rank_offset, 5);
  EXPECT_EQ(a[0].local_world_size, 2);
}

// Without include_members a reply carries only the node's own place, so it stays O(1) bytes
// at any N; a client that predates own_place_only still gets every node's world size.
TEST(MembershipTest, EachNodeGetsItsOwnPlaceWithoutTheWholeList) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto a = joinThree(client, "own", /*include_members=*/false);
  // a-node: ranks 0-3, b-node: 4, c-node: 5-6.
  EXPECT_EQ(a[1].rank_offset, 0);
  EXPECT_EQ(a[1].local_world_size, 4);
  EXPECT_EQ(a[2].rank_offset, 4);
  EXPECT_EQ(a[2].local_world_size, 1);
  EXPECT_EQ(a[0].rank_offset, 5);
  EXPECT_EQ(a[0].local_world_size, 2);
  for (auto& x : a) {
    EXPECT_EQ(x.world_size, 7);
    EXPECT_EQ(x.group_world_size, 3);
    EXPECT_TRUE(x.local_world_sizes.empty());
    EXPECT_TRUE(x.rank_offsets.empty());
    EXPECT_TRUE(x.members.empty());
  }

  namespace pb = ::ddpl::rendezvous::v1;
  auto stub = pb::Rendezvous::NewStub(
      grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials()));
  pb::JoinRequest req;
  req.set_run_id("legacy");
  req.set_node_id("n");
  req.set_local_world_size(3);
  req.set_min_nodes(1);
  req.set_max_nodes(1);
  req.set_join_timeout_ms(10000);
  pb::JoinResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  ASSERT_TRUE(stub->Join(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.local_world_sizes_size(), 1);
  EXPECT_EQ(resp.local_world_sizes(0), 3);
  EXPECT_EQ(resp.rank_offset(), 0);
  EXPECT_EQ(resp.local_world_size(), 3);
}

TEST(MembershipTest, LeavingEndsTheRoundForOthersButNotTheRun) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto fa =
      std::async(std::launch::async, [&] { return client.join(joinOptions("run", "a", 2, 2)); });
  auto b = client.join(joinOptions("run", "b", 2, 2));
  auto a = fa.get();
  ChangeLatch latch;
  auto watch = client.watch(b, latch.callback());
  EXPECT_EQ(client.heartbeat(b), 0);
  client.leave("run", "a");
  auto change = latch.await();
  ASSERT_TRUE(change.has_value());
  EXPECT_THAT(change->reason, HasSubstr("'a' left"));
  EXPECT_EQ(change->round, 0);
  EXPECT_FALSE(change->connection_lost);
  EXPECT_THROW(client.heartbeat(b), StoreError) << "round 0 is over";
  // The run goes on: both re-join into round 1.
  auto fa2 =
      std::async(std::launch::async, [&] { return client.join(joinOptions("run", "a", 2, 2)); });
  auto b2 = client.join(joinOptions("run", "b", 2, 2));
  EXPECT_EQ(b2.round, 1);
  EXPECT_EQ(fa2.get().store_prefix, "run/1/");
}

TEST(MembershipTest, SilentNodeIsEvictedAfterTheHeartbeatWindow) {
  ServerOptions so;
  so.heartbeat_window = milliseconds(900);
  RendezvousServer server(so);
  RendezvousClient client(clientOptions(server));
  auto fs = std::async(std::launch::async,
                       [&] { return client.join(joinOptions("run", "silent", 2, 2)); });
  auto a = client.join(joinOptions("run", "alive", 2, 2));
  fs.get();  // the silent node never heartbeats nor watches
  ChangeLatch latch;
  auto watch = client.watch(a, latch.callback());  // heartbeats every window/3
  auto change = latch.await();
  ASSERT_TRUE(change.has_value());
  EXPECT_THAT(change->reason, HasSubstr("'silent' evicted: no heartbeat"));
  EXPECT_THAT(change->reason, HasSubstr("window 0.9s"));
}

TEST(MembershipTest, BrokenWatchStreamEvictsTheNode) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto fb =
      std::async(std::launch::async, [&] { return client.join(joinOptions("run", "b", 2, 2)); });
  auto a = client.join(joinOptions("run", "a", 2, 2));
  auto b = fb.get();
  ChangeLatch la, lb;
  auto wa = client.watch(a, la.callback());
  auto wb = client.watch(b, lb.callback());
  // Only once both streams are registered does dropping one mean anything.
  for (int i = 0; i < 2000 && server.stats().watchers < 2; ++i)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(server.stats().watchers, 2);
  wb.reset();  // b's agent dies: its stream is cancelled
  auto change = la.await();
  ASSERT_TRUE(change.has_value());
  EXPECT_THAT(change->reason, HasSubstr("'b' evicted: its watch stream broke"));
}

// Fast re-formation on a real server: a crashed agent's stream breaks, the two survivors
// re-join and their round completes as soon as both are back, not after the 30 s last call.
TEST(MembershipTest, SurvivorsOfACrashedAgentReformWithoutWaitingOutTheLastCall) {
  RendezvousServer server(ServerOptions{});
  constexpr auto kLastCall = seconds(30);  // the default, as the multi-node launcher uses
  auto opts = [&](const std::string& node) {
    auto j = joinOptions("elastic", node, 2, 3);
    j.last_call_timeout = kLastCall;
    return j;
  };
  auto ca = std::make_unique<RendezvousClient>(clientOptions(server));
  auto cb = std::make_unique<RendezvousClient>(clientOptions(server));
  auto cc = std::make_unique<RendezvousClient>(clientOptions(server));
  auto fa = std::async(std::launch::async, [&] { return ca->join(opts("a")); });
  auto fb = std::async(std::launch::async, [&] { return cb->join(opts("b")); });
  auto c = cc->join(opts("c"));  // the third arrival reaches max: round 0 completes at once
  auto a = fa.get();
  auto b = fb.get();
  ASSERT_EQ(a.round, 0);
  ChangeLatch la, lb, lc;
  auto wa = ca->watch(a, la.callback());
  auto wb = cb->watch(b, lb.callback());
  auto wc = cc->watch(c, lc.callback());
  ASSERT_EQ(server.stats().watchers, 3);

  wc.reset();  // c's agent crashes: its watch stream and its client go away
  cc.reset();
  auto change_a = la.await();
  auto change_b = lb.await();
  ASSERT_TRUE(change_a.has_value() && change_b.has_value());
  EXPECT_THAT(change_a->reason, HasSubstr("'c' evicted"));

  auto t0 = Clock::now();
  auto fa1 = std::async(std::launch::async, [&] { return ca->join(opts("a")); });
  auto b1 = cb->join(opts("b"));
  auto a1 = fa1.get();
  auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  EXPECT_EQ(a1.round, 1);
  EXPECT_EQ(b1.round, 1);
  EXPECT_EQ(a1.group_world_size, 2);
  EXPECT_EQ(b1.group_rank, 1);
  EXPECT_LT(took, kLastCall) << "the survivors waited out the last call (" << took.count()
                             << " ms)";
}

TEST(MembershipTest, ArrivalWithRoomTellsMembersAtOnce) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto a = client.join(joinOptions("run", "a", 1, 3));
  ChangeLatch latch;
  auto watch = client.watch(a, latch.callback());
  auto fc =
      std::async(std::launch::async, [&] { return client.join(joinOptions("run", "c", 1, 3)); });
  auto change = latch.await();
  ASSERT_TRUE(change.has_value());
  EXPECT_THAT(change->reason, HasSubstr("'c' wants to join"));
  EXPECT_EQ(change->nodes_waiting, 1);
  EXPECT_EQ(fc.get().round, 1);
}

TEST(MembershipTest, MisconfiguredNodesGetClearErrorsAndDoNotDisturbOthers) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto fa =
      std::async(std::launch::async, [&] { return client.join(joinOptions("run", "a", 2, 2)); });
  for (int i = 0; i < 2000 && server.stats().parked_joins < 1; ++i)
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(server.stats().parked_joins, 1) << "a's join never reached the server";
  auto skew = joinOptions("run", "b", 2, 2);
  skew.version = "0.0.1-old";
  try {
    client.join(skew);
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(e.what(), HasSubstr("version skew"));
  }
  try {
    client.join(joinOptions("run", "a", 2, 2));
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("duplicate node id 'a'"));
  }
  EXPECT_THROW(client.join(joinOptions("run", "x", 3, 2)), InvalidArgument);
  EXPECT_THROW(client.join(joinOptions("", "x", 1, 2)), InvalidArgument);
  auto b = client.join(joinOptions("run", "b", 2, 2));
  EXPECT_EQ(fa.get().round, b.round);
}

TEST(MembershipTest, JoinTimeoutNamesHowManyJoined) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  auto j = joinOptions("lonely", "a", 2, 3);
  j.join_timeout = milliseconds(300);
  try {
    client.join(j);
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("1/3 nodes joined (min 2)"));
    EXPECT_THAT(e.what(), HasSubstr(server.endpoint()));
  }
  EXPECT_EQ(server.stats().parked_joins, 0);
}

TEST(MembershipTest, ManyAsyncJoinsFormOneRound) {
  RendezvousServer server(ServerOptions{});
  RendezvousClient client(clientOptions(server));
  constexpr int kAgents = 128;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RoundAssignment> got;
  int errors = 0;
  for (int i = 0; i < kAgents; ++i)
    client.joinAsync(joinOptions("wide", fmt::format("n{:04d}", i), kAgents, kAgents, 8),
                     [&](RoundAssignment a, std::exception_ptr e) {
                       std::lock_guard<std::mutex> l(mu);
                       if (e)
                         ++errors;
                       else
                         got.push_back(std::move(a));
                       cv.notify_all();
                     });
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, seconds(60), [&] { return got.size() + errors == kAgents; }));
  EXPECT_EQ(errors, 0);
  std::vector<bool> seen(kAgents, false);
  for (auto& a : got) {
    EXPECT_EQ(a.world_size, kAgents * 8);
    EXPECT_EQ(a.rank_offset, a.group_rank * 8);
    seen.at(a.group_rank) = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), kAgents);
}

}  // namespace
}  // namespace ddpl::rdzv
