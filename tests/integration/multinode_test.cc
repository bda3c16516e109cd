// Several `launch` agents on this machine form one job through the gRPC rendezvous, running a
// real Gloo job (PyTorch, one worker per agent to keep two cores busy but not drowned).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {

const std::string kBin = DDPL_BIN_DIR;
const std::string kElastic = std::string(DDPL_SOURCE_DIR) + "/tests/python/elastic_gloo.py";
const std::string kFailRank = std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/fail_rank.sh";
const std::string kEnvDump = std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/env_dump.sh";


int stepOf(const std::string& ckpt_dir) {
  std::string s = readFile(ckpt_dir + "/step");
  return s.empty() ? 0 : std::stoi(s);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

class MultiNode : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = freeLoopbackPort();
    ckpt_ = makeTempDir("elastic");
    env_.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"CKPT_DIR", ckpt_}, {"TOTAL_STEPS", "40"},
                {"STEP_SECONDS", "0.15"}, {"OMP_NUM_THREADS", "1"}};
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<Background> agent(const std::string& nnodes, const std::string& program,
                                    std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kBin + "/launch", "--nnodes=" + nnodes,
                                     "--nproc-per-node=1", "--rdzv-backend=c10d",
                                     "--rdzv-endpoint=" + endpoint(), "--rdzv-id=job"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(program);
    return std::make_unique<Background>(args, env_);
  }
  std::unique_ptr<Background> server(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {kBin + "/rdzv-server", "--port", std::to_string(port_)};
    args.insert(args.end(), extra.begin(), extra.end());
    auto s = std::make_unique<Background>(args, env_);
    EXPECT_TRUE(eventually([&] { return s->outputSoFar().find("serving on") != std::string::npos; }, 20s));
    return s;
  }
  int port_ = 0;
  int runs_ = 0;
  std::string ckpt_;
  RunOptions env_;
};

}  // namespace

TEST_F(MultiNode, ThreeNodesFormOneWorldAndFinish) {
  std::vector<std::unique_ptr<Background>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(agent("3", kElastic));  // the first hosts
  std::string all;
  for (auto& a : agents) {
    auto r = a->wait(180s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(all.find("done rank=" + std::to_string(rank) + " world=3 step=40"), std::string::npos)
        << all;
  EXPECT_EQ(count(all, "hosted by this agent"), 1) << all;
}

// A node stopped (SIGSTOP) past the heartbeat window is evicted; its worker dies when the
// others re-form. Continued, it must re-join as a newcomer: no node uses a restart (there are
// none to use here) and the job finishes on all three.
TEST_F(MultiNode, StoppedNodeEvictedThenContinuedRejoinsWithoutARestart) {
  env_.env["TOTAL_STEPS"] = "150";
  const std::vector<std::string> extra = {"--rdzv-conf=heartbeat_timeout=3", "--max-restarts=0"};
  auto a0 = agent("2:3", kElastic, extra);
  ASSERT_TRUE(eventually(
      [&] { return a0->outputSoFar().find("hosted by this agent") != std::string::npos; }, 30s))
      << a0->outputSoFar();
  auto a1 = agent("2:3", kElastic, extra);
  auto a2 = agent("2:3", kElastic, extra);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  kill(a2->pid(), SIGSTOP);
  // Stopped until the other two train again without it: by then its worker has died of the
  // re-formed group, and the agent finds that exit before anything else when it continues.
  bool reformed = eventually(
      [&] {
        std::string out = a0->outputSoFar();
        return out.find("evicted") != std::string::npos &&
               out.find("start rank=0 world=2") != std::string::npos;
      },
      60s);
  std::this_thread::sleep_for(1s);
  kill(a2->pid(), SIGCONT);
  ASSERT_TRUE(reformed) << a0->outputSoFar();
  auto r0 = a0->wait(180s), r1 = a1->wait(180s), r2 = a2->wait(180s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  EXPECT_EQ(r2.exit_code, 0) << r2.all();
  std::string all = r0.all() + r1.all() + r2.all();
  EXPECT_EQ(all.find("restarting the worker group"), std::string::npos) << all;
  EXPECT_EQ(all.find("elastic_gloo.py FAILED"), std::string::npos) << all;
  EXPECT_EQ(count(all, "done rank="), 3) << all;
  EXPECT_EQ(count(all, "world=3 step=150"), 3) << all;
}

TEST_F(MultiNode, SigkillOfOneAgentTheOthersReformAndFinish) {
  env_.env["TOTAL_STEPS"] = "60";
  // a0 hosts the rendezvous (the first agent to bind its port does): killing a2 must not take
  // the service down, so a2 starts only once a0 serves.
  auto a0 = agent("2:3", kElastic);
  ASSERT_TRUE(eventually(
      [&] { return a0->outputSoFar().find("hosted by this agent") != std::string::npos; }, 30s))
      << a0->outputSoFar();
  auto a1 = agent("2:3", kElastic);
  auto a2 = agent("2:3", kElastic);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  kill(a2->pid(), SIGKILL);
  auto r0 = a0->wait(180s), r1 = a1->wait(180s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.all() + r1.all();
  EXPECT_NE(both.find("evicted"), std::string::npos) << both;
  EXPECT_EQ(count(both, "done rank="), 2) << both;
  EXPECT_EQ(count(both, "world=2 step=60"), 2) << both;
  // Resumed from the checkpoint, and a membership change does not consume a restart.
  std::smatch m;
  std::regex resumed("start rank=\\d world=2 step=(\\d+) restart=0");
  ASSERT_TRUE(std::regex_search(both, m, resumed)) << both;
  EXPECT_GE(std::stoi(m[1]), 5);
}

TEST_F(MultiNode, LateAgentJoinsTheNextRound) {
  env_.env["TOTAL_STEPS"] = "60";
  auto a0 = agent("2:3", kElastic, {"--rdzv-conf=last_call_timeout=1"});
  auto a1 = agent("2:3", kElastic, {"--rdzv-conf=last_call_timeout=1"});
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  auto a2 = agent("2:3", kElastic, {"--rdzv-conf=last_call_timeout=1"});
  std::string all;
  for (auto* a : {a0.get(), a1.get(), a2.get()}) {
    auto r = a->wait(180s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_NE(all.find("wants to join"), std::string::npos) << all;
  EXPECT_EQ(count(all, "world=3 step=60"), 3) << all;
}

TEST_F(MultiNode, SigtermToOneAgentDoesNotCloseTheJob) {
  env_.env["TOTAL_STEPS"] = "60";
  auto srv = server();
  auto a0 = agent("2:3", kElastic);
  auto a1 = agent("2:3", kElastic);
  auto a2 = agent("2:3", kElastic);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  kill(a0->pid(), SIGTERM);
  auto r0 = a0->wait(60s);
  EXPECT_EQ(r0.exit_code, 128 + SIGTERM) << r0.all();
  auto r1 = a1->wait(180s), r2 = a2->wait(180s);
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  EXPECT_EQ(r2.exit_code, 0) << r2.all();
  EXPECT_EQ(count(r1.all() + r2.all(), "world=2 step=60"), 2) << r1.all() << r2.all();
}

TEST_F(MultiNode, HungAgentIsEvictedAfterTheHeartbeatWindow) {
  env_.env["TOTAL_STEPS"] = "60";
  auto srv = server({"--heartbeat-window", "2"});
  auto a0 = agent("2:3", kElastic);
  auto a1 = agent("2:3", kElastic);
  auto a2 = agent("2:3", kElastic);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  kill(a2->pid(), SIGSTOP);
  auto r0 = a0->wait(180s), r1 = a1->wait(180s);
  kill(a2->pid(), SIGKILL);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.all() + r1.all();
  EXPECT_NE(both.find("no heartbeat"), std::string::npos) << both;
  EXPECT_EQ(count(both, "world=2 step=60"), 2) << both;
}

// Issue 48: a node cut from the service whose hang limit fired first was stopping its workers
// the hang's way (SIGTERM, then --shutdown-timeout) when its fence came, and the fence left that
// grace alone: a worker blocked in a collective with a SIGTERM handler (most training scripts)
// outlived the heartbeat window, after which the others may form a round without the node. Here
// the worker ignores SIGTERM and the grace is 60 s; the service goes silent (SIGSTOP) once the
// hang's stop has begun: the fence must SIGKILL the worker W/6 after it fires, within the window.
TEST_F(MultiNode, AFenceCutsShortAStopThatAHangBegan) {
  const std::string dir = makeTempDir("mn-fence-hang");
  const std::string prog = dir + "/hang_ignoring_sigterm.py";
  std::ofstream(prog) << "import os, signal, time\n"
                         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                         "hb = int(os.environ['DDPL_HEARTBEAT_FD'])\n"
                         "os.pwrite(hb, (1).to_bytes(8, 'little'), 0)  # step 1, then none\n"
                         "time.sleep(600)\n";
  constexpr int kWindow = 3;  // W: fenced 2 s after the last answered heartbeat, SIGKILL 0.5 s on
  auto srv = server({"--heartbeat-window", std::to_string(kWindow)});
  auto a = agent("1", prog, {"--hang-timeout=1", "--shutdown-timeout=60", "--max-restarts=0"});
  ASSERT_TRUE(eventually(
      [&] {
        return a->outputSoFar().find("stopping 1 worker(s) with SIGTERM") != std::string::npos;
      },
      60s))
      << a->outputSoFar();
  kill(srv->pid(), SIGSTOP);
  auto silent = std::chrono::steady_clock::now();
  std::string out;
  bool gone = eventually(
      [&] {
        out = a->outputSoFar();
        return out.find("every worker of attempt 0 has exited") != std::string::npos;
      },
      std::chrono::seconds(kWindow + 10));
  auto after = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - silent);
  kill(srv->pid(), SIGCONT);
  std::cout << "worker gone " << after.count() << " ms after the service went silent (window "
            << kWindow << " s, shutdown grace 60 s)\n";
  ASSERT_TRUE(gone) << out;
  EXPECT_NE(out.find("its workers were already stopping"), std::string::npos) << out;
  EXPECT_NE(out.find("fencing: workers still running in 0.5s get SIGKILL"), std::string::npos)
      << out;
  // Within the window (plus a second for a loaded machine), not the 60 s grace.
  EXPECT_LT(after.count(), (kWindow + 1) * 1000) << out;
}

// Were the second agent still starting when the first (hosting) agent gave up and closed the
// rendezvous, it would no longer wait for the closed port for its 60 s read timeout (issue 44:
// the next test), and the test's wait would not end first, as it once did here.
// The join timeout is 6 s so that the second agent, started right after the first, has joined
// before the first gives up even when the suite's load delays its start by seconds (with 2 s it
// sometimes had not, and the first then reported 1/3). What a late agent does then, which a
// longer timeout used to hide here, is pinned by the next test.
TEST_F(MultiNode, FewerThanMinNodesFailEveryAgentAfterTheJoinTimeout) {
  auto a0 = agent("3", kEnvDump, {"--rdzv-conf=join_timeout=6"});
  auto a1 = agent("3", kEnvDump, {"--rdzv-conf=join_timeout=6"});
  for (auto* a : {a0.get(), a1.get()}) {
    auto r = a->wait(60s);
    EXPECT_EQ(r.exit_code, 1) << r.all();
    EXPECT_NE(r.err.find("2/3 nodes joined"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("join timeout"), std::string::npos) << r.err;
  }
}

// Issue 44: an agent on the endpoint's machine finds its port taken (another agent hosts the
// rendezvous) and then the service closed: that agent gave up (at its join timeout, say) and
// closed it just after this one looked. Started 1.99 s after a first agent with a 2 s join
// timeout, the second tried the closed port for its whole read timeout (60 s). It gives up
// within its join timeout now, saying what happened. The port held by a socket that does not
// listen (a closing host's port between this agent's two looks) makes the race deterministic.
TEST_F(MultiNode, AgentWhoseLocalHostClosedTheRendezvousGivesUpWithinTheJoinTimeout) {
  int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(held, 0) << strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // No SO_REUSEADDR and no listen(): the agent cannot bind the port, and connecting is refused.
  ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  auto start = std::chrono::steady_clock::now();
  auto a = agent("3", kEnvDump, {"--rdzv-conf=join_timeout=2,read_timeout=20"});
  auto r = a->wait(60s);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  close(held);
  std::cout << "agent exited " << took.count() << " ms after its start (join timeout 2000 ms, "
            << "read timeout 20000 ms)\n";
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.err.find("the rendezvous at " + endpoint() +
                       " was hosted by another agent on this machine"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("no answer for 2.0s, the join timeout"), std::string::npos) << r.err;
  EXPECT_LT(took.count(), 12000) << r.err;  // the join timeout and launch's start, not 20 s
}

TEST_F(MultiNode, UnreachableRendezvousFailsWithinTheDeadlineNamingIt) {
  auto a = agent("2", kEnvDump, {"--rdzv-conf=is_host=0,read_timeout=2"});
  auto r = a->wait(60s);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.err.find(endpoint()), std::string::npos) << r.err;
}

// Issue 33: the rendezvous server SIGKILLed under a running job. The agents used to log the
// loss at the read timeout and exit only after about 4x it (leave, the job's outcome and
// "gone" each waited out the read timeout again: 40.7 s for 10 s). Once the server is known
// lost, the way out makes no more calls: each agent exits, naming the endpoint, within about
// one read timeout of the loss. A bound against a hang, not a performance figure.
TEST_F(MultiNode, LostServerEveryAgentExitsWithinAboutOneReadTimeout) {
  constexpr auto kReadTimeout = 3s;
  auto srv = server();
  auto sleeper = [&] {
    return std::make_unique<Background>(
        std::vector<std::string>{kBin + "/launch", "--nnodes=2", "--nproc-per-node=1",
                                 "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint(),
                                 "--rdzv-id=lost", "--rdzv-conf=read_timeout=3", "--no-python",
                                 "/bin/sleep", "300"},
        env_);
  };
  auto a0 = sleeper(), a1 = sleeper();
  for (auto* a : {a0.get(), a1.get()})
    ASSERT_TRUE(eventually(
        [&] { return a->outputSoFar().find("attempt 0: starting") != std::string::npos; }, 60s))
        << a->outputSoFar();
  kill(srv->pid(), SIGKILL);
  auto killed = std::chrono::steady_clock::now();
  for (auto* a : {a0.get(), a1.get()}) {
    auto r = a->wait(120s);
    auto after = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - killed);
    std::cout << "agent exited " << after.count() << " ms after the server's SIGKILL (read timeout "
              << std::chrono::milliseconds(kReadTimeout).count() << " ms)\n";
    EXPECT_NE(r.exit_code, 0) << r.all();
    EXPECT_NE(r.err.find(endpoint()), std::string::npos) << r.err;
    EXPECT_LT(after.count(), std::chrono::milliseconds(kReadTimeout).count() * 5 / 2) << r.err;
  }
}

// Issue 33: a node stopped by --preflight=strict in a job of a fixed 2 nodes. The other used to
// wait out the whole join timeout and then say "1/2 nodes joined", without the reason. The
// stopped node tells the rendezvous, which fails the round at once on the node waiting in it
// (and refuses a node that comes later), naming the stopped node and its failed check. Both
// orders: the good node hosting the service and waiting when the other stops, and the stopped
// node hosting it (it keeps serving until the other has heard).
TEST_F(MultiNode, PreflightStrictStopOfOneNodeOfAFixedSizeJobFailsTheOtherAtOnce) {
  auto launch = [&](bool bad) {
    RunOptions o = env_;
    if (bad) o.env["NCCL_SOCKET_IFNAME"] = "ddpl-no-such-nic";
    return std::make_unique<Background>(
        std::vector<std::string>{kBin + "/launch", "--nnodes=2", "--nproc-per-node=1",
                                 "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint(),
                                 "--rdzv-id=pf-fixed", "--preflight=strict",
                                 "--rdzv-conf=join_timeout=120", kEnvDump},
        o);
  };
  for (bool bad_first : {false, true}) {
    SCOPED_TRACE(bad_first ? "the stopped node hosts" : "the good node hosts");
    port_ = freeLoopbackPort();
    auto first = launch(bad_first);
    ASSERT_TRUE(eventually(
        [&] { return first->outputSoFar().find("hosted by this agent") != std::string::npos; },
        30s))
        << first->outputSoFar();
    auto second = launch(!bad_first);
    auto started = std::chrono::steady_clock::now();
    Background& good = bad_first ? *second : *first;
    Background& bad = bad_first ? *first : *second;
    pid_t bad_pid = bad.pid();
    auto rg = good.wait(60s);
    auto after = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - started);
    auto rb = bad.wait(60s);
    std::cout << "the good node exited " << after.count() << " ms after the other started\n";
    EXPECT_EQ(rb.exit_code, 1) << rb.all();
    EXPECT_NE(rb.err.find("not joining"), std::string::npos) << rb.all();
    EXPECT_NE(rg.exit_code, 0) << rg.all();
    EXPECT_LT(after.count(), 20000) << rg.all();
    EXPECT_EQ(rg.out.find("RANK="), std::string::npos) << "no worker may start: " << rg.all();
    // The stopped node (its id is host-pid), what stopped it, and the numbers.
    EXPECT_TRUE(std::regex_search(
        rg.err, std::regex("node '[^']+-" + std::to_string(bad_pid) +
                           "' stopped before joining: preflight on \\S+ failed "
                           "\\(--preflight=strict\\): fail .*NCCL_SOCKET_IFNAME: "
                           "'ddpl-no-such-nic'")))
        << rg.err;
    EXPECT_NE(rg.err.find("needs at least 2 of 2 nodes and at most 1 can still come"),
              std::string::npos)
        << rg.err;
    EXPECT_EQ(rg.err.find("join timeout"), std::string::npos) << rg.err;
  }
}

TEST_F(MultiNode, WorkerFailureRestartsEveryNodeAndCountsPerJob) {
  env_.env.insert({{"FAIL_RANK", "1"}, {"FAILS", "1"}, {"SLEEP", "0.5"}});
  auto a0 = agent("2", kFailRank, {"--max-restarts=1", "--rdzv-conf=exit_barrier_timeout=30"});
  auto a1 = agent("2", kFailRank, {"--max-restarts=1", "--rdzv-conf=exit_barrier_timeout=30"});
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.out + r1.out;
  EXPECT_NE(both.find("rank 0 done in attempt 1"), std::string::npos) << both;
  EXPECT_NE(both.find("rank 1 done in attempt 1"), std::string::npos) << both;
}

TEST_F(MultiNode, FailureElsewhereIsReportedOnEveryNode) {
  env_.env.insert({{"FAIL_RANK", "1"}, {"FAILS", "9"}, {"FAIL_CODE", "7"}, {"SLEEP", "300"}});
  auto a0 = agent("2", kFailRank);
  auto a1 = agent("2", kFailRank);
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  // One node had the root cause (exit code 7 and the full report); the other names it.
  std::string both = r0.err + r1.err;
  EXPECT_TRUE((r0.exit_code == 7 && r1.exit_code == 1) || (r0.exit_code == 1 && r1.exit_code == 7))
      << r0.all() << r1.all();
  EXPECT_NE(both.find("Root Cause (first observed failure)"), std::string::npos) << both;
  EXPECT_NE(both.find("the job failed on another node; root cause: host"), std::string::npos)
      << both;
  EXPECT_NE(both.find("rank 1 (local rank 0"), std::string::npos) << both;
  EXPECT_NE(both.find("exit code 7"), std::string::npos) << both;
}

TEST_F(MultiNode, AFailedJobRerunUnderTheSameIdStartsFresh) {
  // A long-lived rdzv-server, as in deploy/k8s, where a Job's pods re-run with the same id.
  auto srv = server();
  env_.env.insert({{"FAIL_RANK", "1"}, {"FAILS", "9"}, {"FAIL_CODE", "7"}, {"SLEEP", "300"}});
  {
    auto a0 = agent("2", kFailRank), a1 = agent("2", kFailRank);
    auto r0 = a0->wait(120s), r1 = a1->wait(120s);
    ASSERT_NE(r0.exit_code, 0) << r0.all();
    ASSERT_NE(r1.exit_code, 0) << r1.all();
  }
  env_.env["FAILS"] = "0";
  env_.env["SLEEP"] = "0.2";
  auto b0 = agent("2", kFailRank), b1 = agent("2", kFailRank);
  auto r0 = b0->wait(120s), r1 = b1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  EXPECT_NE((r0.out + r1.out).find("rank 1 done in attempt 0"), std::string::npos) << r0.all() << r1.all();
}

TEST_F(MultiNode, StaticRendezvousAcrossNodes) {
  std::vector<std::unique_ptr<Background>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(std::make_unique<Background>(
        std::vector<std::string>{kBin + "/launch", "--nnodes=2", "--node-rank=" + std::to_string(node),
                                 "--nproc-per-node=2", "--master-port=" + std::to_string(port_),
                                 kEnvDump},
        env_));
  std::string all;
  for (auto& a : agents) {
    auto r = a->wait(60s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.out;
  }
  // torchrun's prefix shows the local rank: node 1's ranks 2 and 3 print as [default0]/[default1].
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(all.find("[default" + std::to_string(rank % 2) + "]:RANK=" + std::to_string(rank)),
              std::string::npos)
        << all;
  EXPECT_EQ(count(all, "]:WORLD_SIZE=4"), 4) << all;
  EXPECT_EQ(count(all, "GROUP_WORLD_SIZE=2"), 4) << all;
  EXPECT_EQ(count(all, "MASTER_PORT=" + std::to_string(port_)), 4) << all;
}

// Issue 18 across nodes. Rank 3 (on the node with ranks 2..3) hangs: that node asks the other
// through the rendezvous service, so node 0's ranks' stacks are saved in node 0's own log
// directory before anything is stopped, and the hung node's report carries them. The group
// then restarts on both nodes and finishes.
TEST_F(MultiNode, HangOnOneNodeCollectsTheOtherNodesStacksToo) {
  std::string logs0 = makeTempDir("mn-hang0"), logs1 = makeTempDir("mn-hang1");
  env_.env.insert({{"HANG_RANK", "3"}, {"HANG_STEP", "3"}, {"STEPS", "5"}});
  const std::string hang = std::string(DDPL_SOURCE_DIR) + "/tests/python/hang_gloo.py";
  auto a0 = agent("2", hang, {"--nproc-per-node=2", "--hang-timeout=5", "--max-restarts=1",
                              "--log-dir", logs0});
  auto a1 = agent("2", hang, {"--nproc-per-node=2", "--hang-timeout=5", "--max-restarts=1",
                              "--log-dir", logs1});
  auto r0 = a0->wait(240s), r1 = a1->wait(240s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  // Which agent got ranks 2..3 depends on who joined first.
  bool first_hung = r0.err.find("rank 3 (local rank 1) is hung") != std::string::npos;
  const RunResult& hung = first_hung ? r0 : r1;
  const RunResult& other = first_hung ? r1 : r0;
  const std::string& other_logs = first_hung ? logs1 : logs0;
  ASSERT_NE(hung.err.find("rank 3 (local rank 1) is hung"), std::string::npos)
      << r0.all() << r1.all();
  // Ranks 0..2 wait for rank 3 inside the all-reduce: both nodes find the hang at once, each
  // asks the other, and each names rank 3 as the one outside any collective.
  EXPECT_NE(other.err.find("another node asks for every worker's stack (hang: rank(s) 2, 3 on "
                           "node 1"),
            std::string::npos)
      << other.all();
  EXPECT_NE(other.err.find("stacks on another node: node 1 ("), std::string::npos) << other.all();
  EXPECT_NE(other.err.find("outside any collective: stuck_in_data_loading"), std::string::npos)
      << other.all();
  // The hung node's report shows the other node's ranks, waiting in the collective.
  EXPECT_NE(hung.err.find("stacks on another node: node 0 ("), std::string::npos) << hung.all();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(hung.err.find("rank " + std::to_string(rank) + " (local rank " +
                            std::to_string(rank) + ", pid "),
              std::string::npos)
        << hung.err;
    std::string stacks =
        readFile(other_logs + "/job/attempt_0/" + std::to_string(rank) + "/stacks.txt");
    EXPECT_NE(stacks.find("all_reduce"), std::string::npos) << rank << ": " << stacks;
  }
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE((r0.out + r1.out).find("rank " + std::to_string(rank) + " finished"),
              std::string::npos)
        << r0.out << r1.out;
}

// `launch status RUN_DIR` on one node shows every node's view; `launch stacks RUN_DIR` saves
// the stacks of every node's workers, each on its own node, and lists them all.
TEST_F(MultiNode, StatusAndOnDemandStacksCoverEveryNode) {
  std::string logs0 = makeTempDir("mn-st0"), logs1 = makeTempDir("mn-st1");
  std::string out = makeTempDir("mn-st-out");
  env_.env.insert({{"OUT_DIR", out}});
  const std::string wait = std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/wait_for_file.py";
  auto a0 = agent("2", wait, {"--nproc-per-node=2", "--log-dir", logs0});
  auto a1 = agent("2", wait, {"--nproc-per-node=2", "--log-dir", logs1});
  ASSERT_TRUE(eventually([&] {
    for (int r = 0; r < 4; ++r)
      if (readFile(out + "/ready." + std::to_string(r)) != "ready") return false;
    return true;
  }, 90s)) << a0->outputSoFar() << a1->outputSoFar();
  RunResult status;
  // Statuses are published every few seconds: wait for the other node's first one.
  EXPECT_TRUE(eventually([&] {
    status = run({kBin + "/launch", "status", logs0 + "/job"});
    return status.out.find("ranks up") != std::string::npos &&
           status.out.find("no status published") == std::string::npos &&
           count(status.out, "2/2 ranks up") == 2;
  }, 30s)) << status.all();
  EXPECT_EQ(status.exit_code, 0) << status.all();
  auto stacks = run({kBin + "/launch", "stacks", logs0 + "/job"});
  EXPECT_EQ(stacks.exit_code, 0) << stacks.all();
  EXPECT_NE(stacks.out.find("ok " + logs0 + "/job/snapshots/"), std::string::npos) << stacks.out;
  EXPECT_NE(stacks.out.find("2 stack(s) saved in " + logs1 + "/job/snapshots/"),
            std::string::npos)
      << stacks.out;
  EXPECT_EQ(count(stacks.out, "wait_here"), 4) << stacks.out;
  std::ofstream(out + "/go") << "go";
  EXPECT_EQ(a0->wait(60s).exit_code, 0);
  EXPECT_EQ(a1->wait(60s).exit_code, 0);
}

// Issue 13: preflight across nodes. Three agents (2 to 3 nodes); one is given a bogus
// NCCL_SOCKET_IFNAME. Under --preflight=strict that node stops before joining, and group rank
// 0's job-wide table names it; the other two form the job and finish. Under warn all three run
// and the table shows the finding.
TEST_F(MultiNode, PreflightTableNamesTheBadNodeStrictStopsItWarnLetsItRun) {
  auto run3 = [&](const std::string& mode) {
    std::vector<std::unique_ptr<Background>> agents;
    for (int i = 0; i < 3; ++i) {
      RunOptions o = env_;
      if (i == 2) o.env["NCCL_SOCKET_IFNAME"] = "ddpl-no-such-nic";
      std::vector<std::string> args = {kBin + "/launch", "--nnodes=2:3", "--nproc-per-node=1",
                                       "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint(),
                                       "--rdzv-id=pf-" + mode, "--preflight=" + mode,
                                       "--rdzv-conf=last_call_timeout=3", kEnvDump};
      agents.push_back(std::make_unique<Background>(args, o));
      // The host first, the bad node last, so that the table is the host's to print.
      if (i == 0) {
        EXPECT_TRUE(eventually([&] {
          return agents[0]->outputSoFar().find("rendezvous") != std::string::npos;
        }, 30s));
      }
    }
    std::vector<RunResult> results;
    for (auto& a : agents) results.push_back(a->wait(120s));
    return results;
  };
  auto strict = run3("strict");
  EXPECT_EQ(strict[2].exit_code, 1) << strict[2].all();
  EXPECT_NE(strict[2].err.find("not joining"), std::string::npos) << strict[2].all();
  EXPECT_EQ(strict[2].out.find("RANK="), std::string::npos) << "no worker may start there";
  std::string all = strict[0].err + strict[1].err;
  EXPECT_NE(all.find("preflight of the job"), std::string::npos) << all;
  EXPECT_NE(all.find("STOPPED before joining (--preflight=strict)"), std::string::npos) << all;
  EXPECT_NE(all.find("NCCL_SOCKET_IFNAME: 'ddpl-no-such-nic'"), std::string::npos) << all;
  EXPECT_EQ(strict[0].exit_code, 0) << strict[0].all();
  EXPECT_EQ(strict[1].exit_code, 0) << strict[1].all();

  auto warn = run3("warn");
  for (auto& r : warn) EXPECT_EQ(r.exit_code, 0) << r.all();
  std::string logs = warn[0].err + warn[1].err + warn[2].err;
  EXPECT_NE(logs.find("preflight of the job, 3 node(s) reporting, 1 with findings"),
            std::string::npos)
      << logs;
  EXPECT_EQ(logs.find("STOPPED"), std::string::npos) << logs;
}

// The rendezvous token has one name for both programs, DDPL_RDZV_TOKEN; the name rdzv-server
// read before, DDPL_STORE_TOKEN, still works in both, with a warning naming the two.
TEST_F(MultiNode, RdzvTokenHasOneNameForServerAndLaunchTheOldOneWarns) {
  const std::string kNew = "set DDPL_RDZV_TOKEN instead";
  auto one_node = [&](std::map<std::string, std::string> env) {
    RunOptions o = env_;
    o.unset_env = {"DDPL_RDZV_TOKEN", "DDPL_STORE_TOKEN", "DDPL_STORE_ADDR"};
    for (auto& [k, v] : env) o.env[k] = v;
    o.timeout = 90s;
    return run({kBin + "/launch", "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=" + endpoint(), "--rdzv-id=token-" + std::to_string(++runs_),
                "--rdzv-conf=join_timeout=20", kEnvDump},
               o);
  };
  {
    // The old name on the server side.
    env_.unset_env = {"DDPL_RDZV_TOKEN", "DDPL_STORE_ADDR"};
    env_.env["DDPL_STORE_TOKEN"] = "s3cret";
    auto s = server();
    env_.env.erase("DDPL_STORE_TOKEN");
    EXPECT_TRUE(eventually([&] { return s->outputSoFar().find(kNew) != std::string::npos; }, 5s))
        << s->outputSoFar();
    auto good = one_node({{"DDPL_RDZV_TOKEN", "s3cret"}});
    EXPECT_EQ(good.exit_code, 0) << good.all();
    EXPECT_EQ(good.all().find(kNew), std::string::npos) << good.all();
    // The old name on launch's side: accepted, with the warning.
    auto old = one_node({{"DDPL_STORE_TOKEN", "s3cret"}});
    EXPECT_EQ(old.exit_code, 0) << old.all();
    EXPECT_NE(old.all().find(kNew), std::string::npos) << old.all();
    // The token is really checked: a wrong one is refused.
    auto wrong = one_node({{"DDPL_RDZV_TOKEN", "wrong"}});
    EXPECT_NE(wrong.exit_code, 0) << wrong.all();
    EXPECT_NE(wrong.all().find("token"), std::string::npos) << wrong.all();
  }
  {
    // The new name on the server: no warning, and the old name on launch's side still works.
    port_ = freeLoopbackPort();
    env_.env["DDPL_RDZV_TOKEN"] = "fresh";
    auto s = server();
    env_.env.erase("DDPL_RDZV_TOKEN");
    auto old = one_node({{"DDPL_STORE_TOKEN", "fresh"}});
    EXPECT_EQ(old.exit_code, 0) << old.all();
    EXPECT_EQ(s->outputSoFar().find(kNew), std::string::npos) << s->outputSoFar();
  }
}

// Issue 28: the hosting agent serves the job's TCPStore (torch's protocol) on the rendezvous
// port, a namespace per round, admitting the round's nodes. Two nodes on loopback run a Gloo
// job through it whose worker is SIGKILLed once after its group formed: the next round forms
// its group through the same store, seeing nothing of the round before.
TEST_F(MultiNode, AgentStoreServesEveryNodeAndARestartSeesNoStaleKey) {
  env_.env["KILLS"] = "1";
  const std::string script = std::string(DDPL_SOURCE_DIR) + "/tests/python/agent_store_restarts.py";
  std::vector<std::unique_ptr<Background>> agents;
  for (int i = 0; i < 2; ++i) agents.push_back(agent("2", script, {"--max-restarts=1"}));
  std::string all;
  for (auto& a : agents) {
    auto r = a->wait(240s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_EQ(all.find("STALE"), std::string::npos) << all;
  EXPECT_EQ(count(all, "ATTEMPT OK attempt=1 "), 2) << all;
  EXPECT_EQ(count(all, "sum=24"), 2) << all;
  EXPECT_EQ(count(all, "hosted by this agent"), 1) << all;
  EXPECT_NE(all.find("torch TCPStore: attempt"), std::string::npos) << all;
  EXPECT_EQ(all.find("refused a torch TCPStore client"), std::string::npos) << all;
}

// Behind a standalone rdzv-server nobody hosts an agent store: rank 0 hosts torch's own, as
// before, and plain clients of MASTER_ADDR:MASTER_PORT then find it.
TEST_F(MultiNode, BehindAStandaloneServerRankZeroHostsTheStore) {
  auto s = server();
  std::vector<std::unique_ptr<Background>> agents;
  for (int i = 0; i < 2; ++i)
    agents.push_back(agent("2", kEnvDump));
  std::string all;
  for (auto& a : agents) {
    auto r = a->wait(120s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_EQ(count(all, "TORCHELASTIC_USE_AGENT_STORE=False"), 2) << all;
}
