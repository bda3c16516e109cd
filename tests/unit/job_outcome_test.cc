// The job-outcome protocol that both multi-node backends share (MultiNodeRendezvous over
// JobKv), against an in-memory JobKv that several nodes share as they would share etcd or the
// rendezvous server's store.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "launcher/membership/multi_node_rendezvous.h"

namespace ddpl::launcher {
namespace {

struct SharedKv {
  // While set, every call waits (at most 20 s) as on a store that stopped answering.
  std::atomic<bool> stalled{false};
  void waitWhileStalled() {
    for (int i = 0; i < 2000 && stalled; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::mutex mu;
  std::map<std::string, std::string> values;
  std::map<std::string, std::set<std::string>> tallies;
};

class MemoryJobKv : public JobKv {
 public:
  explicit MemoryJobKv(SharedKv& kv) : kv_(kv) {}
  int64_t add(const std::string& key, int64_t delta) override {
    kv_.waitWhileStalled();
    std::lock_guard<std::mutex> lock(kv_.mu);
    auto& v = kv_.values[key];
    v = std::to_string((v.empty() ? 0 : std::stoll(v)) + delta);
    return std::stoll(v);
  }
  void set(const std::string& key, const std::string& value) override {
    kv_.waitWhileStalled();
    std::lock_guard<std::mutex> lock(kv_.mu);
    kv_.values[key] = value;
  }
  std::optional<std::string> get(const std::string& key) override {
    kv_.waitWhileStalled();
    std::lock_guard<std::mutex> lock(kv_.mu);
    auto it = kv_.values.find(key);
    if (it == kv_.values.end()) return std::nullopt;
    return it->second;
  }
  void append(const std::string&, const std::string&, const std::string&) override {}
  std::vector<std::string> readNew(const std::string&, int64_t*) override { return {}; }
  int64_t tally(const std::string& key, const std::string& node) override {
    std::lock_guard<std::mutex> lock(kv_.mu);
    auto& s = kv_.tallies[key];
    s.insert(node);
    return static_cast<int64_t>(s.size());
  }
  std::optional<std::string> waitFor(const std::string& key, std::chrono::milliseconds) override {
    return get(key);
  }

 private:
  SharedKv& kv_;
};

// A node of the job in `round`, whose backend only says where it is and that it left.
class Node : public MultiNodeRendezvous {
 public:
  Node(const std::string& id, SharedKv& kv, int64_t round)
      : MultiNodeRendezvous(id), round_(round) {
    setKv(std::make_unique<MemoryJobKv>(kv));
  }
  ~Node() override { stopThreads(); }
  int left = 0;
  int failures() { return failureCount(); }
  void join(int rank, int nodes) { roundAssigned(rank, nodes, round_); }

  bool roundStillCurrent() override { return true; }
  bool finish(bool) override { return true; }
  std::string describe() const override { return "test"; }
  void leaveEarly() override {}
  void stopBeforeJoining(const std::string&) override {}

 protected:
  std::optional<WorldAssignment> joinOnce() override { return std::nullopt; }
  std::optional<int64_t> currentRound() const override { return round_; }
  std::string storeName(bool) const override { return "the test's store"; }
  void leaveAfterFailure() override { ++left; }
  void noteTransport(const std::exception&) override {}

 private:
  int64_t round_;
};

// A hang stalls every rank in the collective, so each node's monitor finds it in the same
// instant and each records it before it can see the other's: one fault, counted once, its
// first report kept as the root cause (with --max-restarts=1 it was two failures and the job
// ended instead of restarting).
TEST(JobOutcome, OneRoundsFailureFoundByTwoNodesAtOnceCountsOnce) {
  SharedKv kv;
  Node a("a", kv, 0), b("b", kv, 0);
  EXPECT_EQ(a.recordFailure("rank 3 hung"), 1);
  EXPECT_EQ(b.recordFailure("rank 0 hung"), 1);
  EXPECT_EQ(a.failures(), 1);
  EXPECT_EQ(b.jobFailure(), "rank 3 hung");
  EXPECT_EQ(kv.values.at("round/0/end"), "failed");
  // Both still leave the round, so that the nodes still in it stop their workers.
  EXPECT_EQ(a.left, 1);
  EXPECT_EQ(b.left, 1);
}

TEST(JobOutcome, FailuresOfLaterRoundsCountEachTime) {
  SharedKv kv;
  Node r0("a", kv, 0), r1("a", kv, 1), r2("b", kv, 2);
  EXPECT_EQ(r0.recordFailure("first"), 1);
  EXPECT_EQ(r1.recordFailure("second"), 2);
  EXPECT_EQ(r2.recordFailure("third"), 3);
  EXPECT_EQ(r2.jobFailure(), "third");
}

// Issue 48's chaos soak: a node cut off from the store found a hang first, and its request for
// the other nodes' stacks waited on the agent's loop for the store (twice its call timeout), so
// that the node fenced itself 27 s after the cut instead of 6 s. The loop now waits at most 1 s
// for a request and not at all for an answer; the health thread makes the calls.
TEST(StacksRequests, AStoreThatStoppedAnsweringHoldsTheLoopAtMostASecond) {
  SharedKv kv;
  // Before the nodes, so that they outlive the health threads that call into them: a request
  // written late (the store stalled, then answered) reached b's callback after they were gone
  // (ASan: heap-use-after-free in the last run of the ASan suite).
  std::mutex mu;
  std::vector<std::pair<int64_t, std::string>> heard;
  Node a("a", kv, 0), b("b", kv, 0);
  b.setStacksRequestedCallback([&](int64_t id, std::string why) {
    std::lock_guard<std::mutex> lock(mu);
    heard.emplace_back(id, why);
  });
  b.join(1, 2);
  // Node b's health thread looks for requests after where they stand when it starts: it must
  // have started before a asks (in a job, nodes join long before a hang).
  auto started = [&] {
    std::lock_guard<std::mutex> lock(kv.mu);
    return kv.values.count("stacks/next") > 0;
  };
  for (int i = 0; i < 300 && !started(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(started());
  a.join(0, 2);
  int64_t id = a.requestStacks("rank 1 hung");
  ASSERT_GT(id, 0);
  for (int i = 0; i < 300; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!heard.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(heard.size(), 1u);
    EXPECT_EQ(heard[0], std::make_pair(id, std::string("rank 1 hung")));
  }
  b.answerStacks(id, "node 1: 2 stacks saved");
  HealthBus::StacksAnswers answers;
  for (int i = 0; i < 300 && answers.answers.empty(); ++i) {
    answers = a.stacksAnswers(id);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(answers.answers, std::vector<std::string>{"node 1: 2 stacks saved"});

  kv.stalled = true;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a.requestStacks("rank 0 hung"), 0);  // not made: the loop stopped waiting
  b.answerStacks(id, "again");
  double held = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(held, 0.9);
  EXPECT_LT(held, 3.0) << "the loop waited on the store";
  kv.stalled = false;
}

}  // namespace
}  // namespace ddpl::launcher
