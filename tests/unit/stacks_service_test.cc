#include "launcher/agent/stacks_service.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/common/subprocess.h"

namespace ddpl::launcher {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// Another node's side of the rendezvous, as the stacks service sees it: the health bus.
class FakeRendezvous : public HealthBus {
 public:
  void publishStatus(const std::string&) override {}
  std::vector<std::string> otherNodesStatus() override { return {}; }
  void setStacksRequestedCallback(StacksRequested) override {}

  int64_t requestStacks(const std::string& why) override {
    asked.push_back(why);
    return 5;
  }
  void answerStacks(int64_t id, const std::string& answer) override {
    EXPECT_EQ(std::this_thread::get_id(), loop_thread);  // its contract: the loop's thread only
    answers[id] = answer;
  }
  StacksAnswers stacksAnswers(int64_t id) override {
    EXPECT_EQ(std::this_thread::get_id(), loop_thread);
    StacksAnswers a;
    if (id == 5 && other_node_answered)
      a.answers.push_back("node 1 (hostB): 1 stack(s) saved in /elsewhere");
    else
      a.missing.push_back(1);
    return a;
  }

  std::thread::id loop_thread = std::this_thread::get_id();
  std::vector<std::string> asked;
  std::map<int64_t, std::string> answers;
  bool other_node_answered = false;
};

class StacksServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = ddpl::testing::makeTempDir("stacks-service");
    bin_ = ddpl::testing::makeTempDir("stacks-service-bin");
    // A stack tool that takes a second, as py-spy on a busy machine does.
    std::ofstream(bin_ + "/eu-stack") << "#!/bin/sh\nsleep 1\necho 'TID '$2':'\n"
                                      << "echo '#0  0x0000000000401000 slow_frame'\n";
    fs::permissions(bin_ + "/eu-stack", fs::perms::owner_all);
    fs::create_directories(run_dir_ + "/attempt_0/0");
    worker_ = fork();
    if (worker_ == 0) {
      execl("/bin/sleep", "sleep", "30", nullptr);
      _exit(127);
    }
    startService(30);
  }
  // This node finds a hang and saves its stacks; `later` after, its group restarts (attempt 1).
  void ownHangThenRestart(std::chrono::milliseconds later) {
    bool saved = false;
    service_->takeHangStacks(
        "hang: rank(s) 4 on node 2 (hostA)", [&](const HangStacks&) { saved = true; },
        [](HangStacks) {});
    turnUntil([&] { return saved; });
    ASSERT_TRUE(saved);
    std::this_thread::sleep_for(later);
    fs::create_directories(run_dir_ + "/attempt_1/0");
    service_->setGroup({1, run_dir_ + "/attempt_1", 2, {{0, 4, worker_, true}}});
  }
  // The service under test, with this --hang-timeout, running attempt 0.
  void startService(double hang_timeout_sec) {
    service_.reset();
    StacksService::Config c;
    c.run_dir = run_dir_;
    c.host = "hostA";
    c.path_env = bin_;
    c.status_line = [] { return "node 2 (hostA): 1/1 ranks up"; };
    c.hang_timeout_sec = hang_timeout_sec;
    service_ = std::make_unique<StacksService>(c, loop_, rdzv_);
    service_->setGroup({0, run_dir_ + "/attempt_0", 2, {{0, 4, worker_, true}}});
  }
  void TearDown() override {
    service_.reset();
    kill(worker_, SIGKILL);
    waitpid(worker_, nullptr, 0);
  }
  // Turns the loop until `done` or 20 s; returns how many turns a 50 ms timer counted.
  int turnUntil(const std::function<bool()>& done) {
    int ticks = 0;
    auto tick = loop_.addTimer(EventLoop::Clock::now(), 50ms, [&] { ++ticks; });
    epoll_event ev[4];
    auto end = EventLoop::Clock::now() + 20s;
    while (!done() && EventLoop::Clock::now() < end) loop_.wait(ev, 4, -1);
    loop_.cancelTimer(tick);
    return ticks;
  }

  std::string run_dir_, bin_;
  pid_t worker_ = -1;
  EventLoop loop_;
  FakeRendezvous rdzv_;
  std::unique_ptr<StacksService> service_;
};

TEST_F(StacksServiceTest, AnotherNodesRequestIsAnsweredWhileTheLoopKeepsTurning) {
  service_->onRemoteRequest(7, "snapshot asked on node 0 (hostB)");
  EXPECT_TRUE(rdzv_.answers.empty());  // the tool runs on the stacks thread
  int ticks = turnUntil([&] { return rdzv_.answers.count(7) > 0; });
  ASSERT_EQ(rdzv_.answers.count(7), 1u);
  EXPECT_GE(ticks, 10);  // the loop ran its timers through the tool's second
  const std::string& answer = rdzv_.answers[7];
  EXPECT_EQ(answer.rfind("node 2 (hostA): 1 stack(s) saved in " + run_dir_ + "/snapshots/", 0), 0u)
      << answer;
  EXPECT_NE(answer.find("\n  rank 4 (local rank 0, pid " + std::to_string(worker_) +
                        ") outside any collective: #0  0x0000000000401000 slow_frame"),
            std::string::npos)
      << answer;
  auto evidence = service_->evidence();
  ASSERT_EQ(evidence.size(), 1u);
  EXPECT_EQ(ddpl::testing::readFile(evidence[0]).rfind("# " + bin_ + "/eu-stack", 0), 0u);
}

TEST_F(StacksServiceTest, HangStacksAwaitTheOtherNodesOnTimersAndAnswerTheirHangRequestMeanwhile) {
  bool saved = false;
  std::optional<HangStacks> done;
  service_->takeHangStacks(
      "hang: rank(s) 4 on node 2 (hostA)",
      [&](const HangStacks& h) {
        saved = true;
        EXPECT_FALSE(done);
        EXPECT_EQ(h.lines.size(), 1u);
      },
      [&](HangStacks h) { done = std::move(h); });
  ASSERT_EQ(rdzv_.asked, std::vector<std::string>{"hang: rank(s) 4 on node 2 (hostA)"});
  // The other node found it too and asks while this node's stacks are being taken: it gets
  // them once saved, not a second snapshot.
  service_->onRemoteRequest(8, "hang: rank(s) 9 on node 1 (hostB)");
  turnUntil([&] { return saved; });
  ASSERT_TRUE(saved);
  EXPECT_FALSE(done);  // the other node has not answered yet
  EXPECT_EQ(rdzv_.answers[8].rfind("node 2 (hostA): found the hang itself; 1 stack(s) saved in " +
                                       run_dir_ + "/attempt_0/<local rank>/stacks.txt",
                                   0),
            0u)
      << rdzv_.answers[8];
  loop_.addTimer(EventLoop::Clock::now() + 300ms, [&] { rdzv_.other_node_answered = true; });
  turnUntil([&] { return done.has_value(); });
  ASSERT_TRUE(done);
  EXPECT_EQ(done->attempt, 0);
  EXPECT_EQ(done->remote,
            std::vector<std::string>{"node 1 (hostB): 1 stack(s) saved in /elsewhere"});
  ASSERT_EQ(done->summaries.count(0), 1u);
  EXPECT_FALSE(done->summaries.at(0).in_collective);
  EXPECT_TRUE(fs::exists(run_dir_ + "/attempt_0/0/stacks.txt"));
}

// The other node's hang request, relayed through the rendezvous, arrives after this node found
// the same hang and restarted its group: the answer is the hung workers' stacks saved at the
// hang, not the new workers' (in CI they were still importing torch). Once a hang timeout has
// passed since, a request may be about the new group: then its stacks are taken.
TEST_F(StacksServiceTest, AHangRequestThatArrivesAfterARestartIsAnsweredWithTheHungStacks) {
  ownHangThenRestart(0ms);
  service_->onRemoteRequest(9, "hang: rank(s) 9 on node 1 (hostB)");
  ASSERT_EQ(rdzv_.answers.count(9), 1u);  // at once: nothing to take
  EXPECT_EQ(rdzv_.answers[9].rfind("node 2 (hostA): found the hang itself; 1 stack(s) saved in " +
                                       run_dir_ + "/attempt_0/<local rank>/stacks.txt",
                                   0),
            0u)
      << rdzv_.answers[9];
  EXPECT_FALSE(fs::exists(run_dir_ + "/attempt_1/0/stacks.txt"));
}

TEST_F(StacksServiceTest, AHangRequestAHangTimeoutAfterTheOwnHangTakesTheNewGroupsStacks) {
  startService(0.5);
  ownHangThenRestart(600ms);
  service_->onRemoteRequest(10, "hang: rank(s) 9 on node 1 (hostB)");
  turnUntil([&] { return rdzv_.answers.count(10) > 0; });
  ASSERT_EQ(rdzv_.answers.count(10), 1u);
  EXPECT_EQ(rdzv_.answers[10].rfind("node 2 (hostA): 1 stack(s) saved in " + run_dir_ +
                                        "/attempt_1/<local rank>/stacks.txt",
                                    0),
            0u)
      << rdzv_.answers[10];
}

}  // namespace
}  // namespace ddpl::launcher
