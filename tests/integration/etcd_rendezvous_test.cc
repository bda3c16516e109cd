// `launch --rdzv-backend=etcd` against a real etcd (Debian's etcd-server) that each test starts
// on loopback ports of its own, with its data in a temporary directory: agents form rounds,
// re-form when one is SIGKILLed, SIGTERMed or arrives late, jobs sharing one etcd stay apart
// and leave no key behind, bad credentials and unreachable endpoints fail clearly.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <regex>
#include <thread>

#include "tests/common/etcd_cluster.h"
#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
using namespace ddpl::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ddpl::testing::EtcdCluster;

namespace {

const std::string kBin = DDPL_BIN_DIR;
const std::string kElastic = std::string(DDPL_SOURCE_DIR) + "/tests/python/elastic_gloo.py";
const std::string kFailRank =
    std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/fail_rank.sh";
const std::string kEnvDump =
    std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/env_dump.sh";

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

int stepOf(const std::string& ckpt_dir) {
  std::string s = readFile(ckpt_dir + "/step");
  return s.empty() ? 0 : std::stoi(s);
}

class EtcdRendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdCluster::installed())
      GTEST_SKIP() << "etcd is not installed (make setup installs Debian's etcd-server)";
    ckpt_ = makeTempDir("etcd-elastic");
    env_.env = {{"PYTHON_EXEC", DDPL_PYTHON},
                {"CKPT_DIR", ckpt_},
                {"TOTAL_STEPS", "40"},
                {"STEP_SECONDS", "0.15"},
                {"OMP_NUM_THREADS", "1"}};
  }
  void start(int members = 1, std::optional<ddpl::testing::EtcdTls> tls = std::nullopt) {
    etcd_ = std::make_unique<EtcdCluster>(members, tls);
    ASSERT_TRUE(etcd_->healthy()) << "etcd did not become healthy";
  }
  std::unique_ptr<Background> agent(const std::string& nnodes, std::vector<std::string> extra = {},
                                    const std::string& job = "job", RunOptions* env = nullptr,
                                    const std::string& program = kElastic) {
    std::vector<std::string> args = {kBin + "/launch",
                                     "--nnodes=" + nnodes,
                                     "--nproc-per-node=1",
                                     "--rdzv-backend=etcd",
                                     "--rdzv-endpoint=" + etcd_->endpoints(),
                                     "--rdzv-id=" + job};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(program);
    return std::make_unique<Background>(args, env ? *env : env_);
  }
  std::unique_ptr<EtcdCluster> etcd_;
  std::string ckpt_;
  RunOptions env_;
};

}  // namespace

TEST_F(EtcdRendezvous, ThreeAgentsFormOneWorldFinishAndLeaveNoKeys) {
  start();
  std::vector<std::unique_ptr<Background>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(agent("3"));
  std::string all;
  for (auto& a : agents) {
    auto r = a->wait(180s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(all.find("done rank=" + std::to_string(rank) + " world=3 step=40"), std::string::npos)
        << all;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

TEST_F(EtcdRendezvous, SigkilledAgentIsDroppedWithinTheLeaseTtlAndTheOthersFinish) {
  start();
  env_.env["TOTAL_STEPS"] = "80";
  // TTL 5 s: the survivors fence after 3.3 s without an answered keep-alive (issue 31), and a
  // loaded CI machine must not stall etcd that long.
  const std::vector<std::string> extra = {"--rdzv-conf=lease_ttl=5"};
  auto a0 = agent("2:3", extra), a1 = agent("2:3", extra), a2 = agent("2:3", extra);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  ASSERT_TRUE(
      eventually([&] { return a0->outputSoFar().find("world=3") != std::string::npos; }, 60s));
  kill(a2->pid(), SIGKILL);
  auto killed = Clock::now();
  ASSERT_TRUE(eventually(
      [&] {
        return (a0->outputSoFar() + a1->outputSoFar()).find("lease expired") != std::string::npos;
      },
      30s));
  auto noticed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  std::cout << "SIGKILLed node dropped after " << noticed.count() << " ms (lease TTL 5 s)\n";
  // The lease was renewed at most TTL/6 before the kill (a fencing keeper's interval), then
  // runs out within TTL, and etcd checks for expired leases every 500 ms: 4.2-5.5 s, plus the
  // watch's way to the survivors and their log under load. 8 s leaves 2.5 s for that and still
  // fails a lease of the default TTL (10 s: 9.2 s at least), the --rdzv-conf left unheard.
  EXPECT_LE(noticed.count(), 5000 + 3000) << "noticed after " << noticed.count() << " ms";
  auto r0 = a0->wait(180s), r1 = a1->wait(180s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.all() + r1.all();
  EXPECT_EQ(count(both, "world=2 step=80"), 2) << both;
  // Resumed from the checkpoint, and a membership change does not consume a restart.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(both, m, std::regex("start rank=\\d world=2 step=(\\d+) restart=0")))
      << both;
  EXPECT_GE(std::stoi(m[1]), 5);
  // The dead node's lease took its keys; the survivors took the rest.
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

TEST_F(EtcdRendezvous, SigtermMakesAnAgentLeaveAtOnce) {
  start();
  env_.env["TOTAL_STEPS"] = "60";
  // A long lease: the others must learn from the leave itself, not from the lease.
  const std::vector<std::string> extra = {"--rdzv-conf=lease_ttl=60"};
  auto a0 = agent("2:3", extra), a1 = agent("2:3", extra), a2 = agent("2:3", extra);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  ASSERT_TRUE(
      eventually([&] { return a0->outputSoFar().find("world=3") != std::string::npos; }, 60s));
  kill(a2->pid(), SIGTERM);
  auto r2 = a2->wait(60s);
  EXPECT_EQ(r2.exit_code, 128 + SIGTERM) << r2.all();
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.all() + r1.all();
  EXPECT_NE(both.find(" left"), std::string::npos) << both;
  EXPECT_EQ(both.find("lease expired"), std::string::npos) << both;
  EXPECT_EQ(count(both, "world=2 step=60"), 2) << both;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

TEST_F(EtcdRendezvous, LateAgentJoinsTheNextRound) {
  start();
  env_.env["TOTAL_STEPS"] = "60";
  const std::vector<std::string> extra = {"--rdzv-conf=last_call_timeout=1"};
  auto a0 = agent("2:3", extra), a1 = agent("2:3", extra);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  auto a2 = agent("2:3", extra);
  std::string all;
  for (auto* a : {a0.get(), a1.get(), a2.get()}) {
    auto r = a->wait(180s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_NE(all.find("wants to join"), std::string::npos) << all;
  EXPECT_EQ(count(all, "world=3 step=60"), 3) << all;
  EXPECT_EQ(all.find("restarting the worker group"), std::string::npos) << all;
}

TEST_F(EtcdRendezvous, TwoJobsOnOneEtcdStayIsolatedAndLeaveNoKeys) {
  start();
  RunOptions env_b = env_;
  env_b.env["CKPT_DIR"] = makeTempDir("etcd-elastic-b");
  env_.env["TOTAL_STEPS"] = env_b.env["TOTAL_STEPS"] = "30";
  // Same node count and etcd: a mix-up would give a world of 4 or a failed all_reduce.
  auto a0 = agent("2", {}, "job-a"), a1 = agent("2", {}, "job-a");
  auto b0 = agent("2", {}, "job-b", &env_b), b1 = agent("2", {}, "job-b", &env_b);
  ASSERT_TRUE(eventually(
      [&] { return etcd_->keys("/ddplaunch/job-b/").find("state") != std::string::npos; }, 60s));
  EXPECT_NE(etcd_->keys("/ddplaunch/job-a/"), "");
  std::string all;
  for (auto* a : {a0.get(), a1.get(), b0.get(), b1.get()}) {
    auto r = a->wait(180s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_EQ(count(all, "world=2 step=30"), 4) << all;
  EXPECT_EQ(count(all, "world=4"), 0) << all;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

TEST_F(EtcdRendezvous, CredentialsAreCheckedAndWrongOnesFailClearly) {
  start();
  ASSERT_EQ(etcd_->ctl({"user", "add", "root:s3cret"}).exit_code, 0);
  ASSERT_EQ(etcd_->ctl({"auth", "enable"}).exit_code, 0);
  std::string dir = makeTempDir("etcd-secrets");
  {
    std::ofstream(dir + "/good") << "s3cret\n";
    std::ofstream(dir + "/bad") << "wrong\n";
  }
  env_.env["TOTAL_STEPS"] = "5";
  // No credentials.
  auto r = agent("1")->wait(60s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.all().find("user="), std::string::npos) << r.all();
  // Wrong password, from a file: named as such, and never printed.
  r = agent("1", {"--rdzv-conf=user=root,password_file=" + dir + "/bad"})->wait(60s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.all().find("authentication failed"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("as user 'root'"), std::string::npos) << r.all();
  EXPECT_EQ(r.all().find("wrong"), std::string::npos) << r.all();
  // The right one: every call (KV, lease, watch) carries the token; two nodes form a round.
  auto a0 = agent("2", {"--rdzv-conf=user=root,password_file=" + dir + "/good"});
  RunOptions env_pw = env_;
  env_pw.env["DDPL_ETCD_PASSWORD"] = "s3cret";
  auto a1 = agent("2", {"--rdzv-conf=user=root"}, "job", &env_pw);
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  EXPECT_EQ(count(r0.all() + r1.all(), "world=2 step=5"), 2) << r0.all() << r1.all();
  EXPECT_EQ(etcd_->keys("/ddplaunch/", {"--user=root:s3cret"}), "");
}

TEST_F(EtcdRendezvous, UnreachableEtcdFailsWithinTheConnectTimeoutNamingEveryEndpoint) {
  std::string a = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  std::string b = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  auto t0 = Clock::now();
  auto r =
      run({kBin + "/launch", "--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + a + "," + b,
           "--rdzv-id=job", "--rdzv-conf=connect_timeout=2", "/bin/true"},
          env_);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.all().find(a), std::string::npos) << r.all();
  EXPECT_NE(r.all().find(b), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("within 2.0s"), std::string::npos) << r.all();
  EXPECT_LT(took.count(), 5000) << r.all();
}

// The store of the job is etcd's: losing etcd's leader (a new one is elected in about a
// second) must not stop the job, nor cost it a restart.
TEST_F(EtcdRendezvous, EtcdLeaderSigkilledMidTrainingTheJobCarriesOn) {
  start(3);
  env_.env["TOTAL_STEPS"] = "60";
  // TTL 12 s: a keep-alive in flight to the killed leader is answered only once a new leader is
  // elected, and an agent fences (issue 31) after 8 s without an answer.
  auto a0 = agent("2", {"--rdzv-conf=lease_ttl=12"}), a1 = agent("2", {"--rdzv-conf=lease_ttl=12"});
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  int leader = etcd_->leader();
  ASSERT_GE(leader, 0);
  etcd_->kill9(leader);
  auto r0 = a0->wait(180s), r1 = a1->wait(180s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  std::string both = r0.all() + r1.all();
  EXPECT_EQ(count(both, "world=2 step=60"), 2) << both;
  EXPECT_EQ(count(both, "start rank=0"), 1) << both;  // one round, no re-formation
  EXPECT_EQ(both.find("restarting the worker group"), std::string::npos) << both;
}

// Issue 33, as with the gRPC service (multinode_test): etcd SIGKILLed under a running job.
// The round's watch finds it lost within the connect timeout; the re-join tries for the join
// timeout (etcd may come back: a slow or re-electing etcd must not end the job, issue 14).
// Then the way out makes no more calls: before, leaving, the outcome, "gone" and the lease
// each waited out the call timeout once more (about 5 of them).
TEST_F(EtcdRendezvous, LostEtcdTheWayOutAddsNoCallTimeouts) {
  start();
  // call timeout = max(read_timeout, connect_timeout) = 2 s
  auto sleeper = [&] {
    return std::make_unique<Background>(
        std::vector<std::string>{kBin + "/launch", "--nnodes=2", "--nproc-per-node=1",
                                 "--rdzv-backend=etcd", "--rdzv-endpoint=" + etcd_->endpoints(),
                                 "--rdzv-id=lost",
                                 "--rdzv-conf=read_timeout=2,connect_timeout=2,join_timeout=5",
                                 "--no-python", "/bin/sleep", "300"},
        env_);
  };
  auto a0 = sleeper(), a1 = sleeper();
  for (auto* a : {a0.get(), a1.get()})
    ASSERT_TRUE(eventually(
        [&] { return a->outputSoFar().find("attempt 0: starting") != std::string::npos; }, 60s))
        << a->outputSoFar();
  etcd_->kill9(0);
  auto killed = Clock::now();
  for (auto* a : {a0.get(), a1.get()}) {
    auto r = a->wait(120s);
    auto after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
    std::cout << "agent exited " << after.count() << " ms after etcd's SIGKILL\n";
    EXPECT_NE(r.exit_code, 0) << r.all();
    EXPECT_NE(r.err.find(etcd_->endpoint(0)), std::string::npos) << r.err;
    // connect timeout (the watch) + join timeout + one call in flight at its end + 4 s (the
    // way out used to add about 5 call timeouts: 16-17 s here)
    EXPECT_LT(after.count(), 2000 + 5000 + 2000 + 4000) << r.err;
  }
}

// Issue 33, as with the gRPC service: a node stopped by --preflight=strict tells the others
// through the round's state in etcd. With a fixed 2 nodes the node waiting fails at once,
// naming the stopped node and its reason; with 2:3 the two others form at once without it
// (no last call for a node that will not come).
TEST_F(EtcdRendezvous, PreflightStrictStopFailsAFixedSizeJobAtOnceAnElasticOneGoesOn) {
  start();
  RunOptions bad_env = env_;
  bad_env.env["NCCL_SOCKET_IFNAME"] = "ddpl-no-such-nic";
  const std::vector<std::string> extra = {"--preflight=strict",
                                          "--rdzv-conf=join_timeout=120,last_call_timeout=60"};
  {
    auto good = agent("2", extra, "fixed", nullptr, kEnvDump);
    ASSERT_TRUE(eventually(
        [&] { return good->outputSoFar().find("rendezvous in etcd") != std::string::npos; }, 30s));
    auto bad = agent("2", extra, "fixed", &bad_env, kEnvDump);
    auto started = Clock::now();
    pid_t bad_pid = bad->pid();
    auto rg = good->wait(60s);
    auto after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    auto rb = bad->wait(60s);
    EXPECT_EQ(rb.exit_code, 1) << rb.all();
    EXPECT_NE(rg.exit_code, 0) << rg.all();
    EXPECT_LT(after.count(), 20000) << rg.all();
    EXPECT_TRUE(std::regex_search(
        rg.err, std::regex("node '[^']+-" + std::to_string(bad_pid) +
                           "' stopped before joining: preflight on \\S+ failed "
                           "\\(--preflight=strict\\): fail .*NCCL_SOCKET_IFNAME: "
                           "'ddpl-no-such-nic'")))
        << rg.err;
    EXPECT_NE(rg.err.find("needs at least 2 of 2 nodes and at most 1 can still come"),
              std::string::npos)
        << rg.err;
  }
  {
    auto t0 = Clock::now();
    auto g0 = agent("2:3", extra, "elastic", nullptr, kEnvDump);
    auto g1 = agent("2:3", extra, "elastic", nullptr, kEnvDump);
    auto bad = agent("2:3", extra, "elastic", &bad_env, kEnvDump);
    auto rb = bad->wait(60s), r0 = g0->wait(60s), r1 = g1->wait(60s);
    EXPECT_EQ(rb.exit_code, 1) << rb.all();
    EXPECT_EQ(r0.exit_code, 0) << r0.all();
    EXPECT_EQ(r1.exit_code, 0) << r1.all();
    EXPECT_EQ(count(r0.out + r1.out, "]:WORLD_SIZE=2"), 2) << r0.all() << r1.all();
    EXPECT_LT(Clock::now() - t0, 30s) << "the last call (60 s) was waited out";
  }
}

TEST_F(EtcdRendezvous, FewerThanMinNodesFailEveryAgentAfterTheJoinTimeout) {
  start();
  auto t0 = Clock::now();
  auto a0 = agent("3", {"--rdzv-conf=join_timeout=2"}, "job", nullptr, kEnvDump);
  auto a1 = agent("3", {"--rdzv-conf=join_timeout=2"}, "job", nullptr, kEnvDump);
  auto r0 = a0->wait(60s), r1 = a1->wait(60s);
  EXPECT_NE(r0.exit_code, 0) << r0.all();
  EXPECT_NE(r1.exit_code, 0) << r1.all();
  EXPECT_NE(r0.all().find("2/3 nodes joined"), std::string::npos)
      << r0.all() << "\n--- the other agent:\n"
      << r1.all();
  EXPECT_LT(Clock::now() - t0, 20s);
  EXPECT_EQ(etcd_->keys("/ddplaunch/job/joins/"), "");  // nobody holds a place
}

TEST_F(EtcdRendezvous, WorkerFailureRestartsEveryNodeAndCountsPerJob) {
  start();
  env_.env.insert({{"FAIL_RANK", "1"}, {"FAILS", "1"}, {"SLEEP", "0.5"}});
  const std::vector<std::string> extra = {"--max-restarts=1",
                                          "--rdzv-conf=exit_barrier_timeout=30"};
  auto a0 = agent("2", extra, "job", nullptr, kFailRank),
       a1 = agent("2", extra, "job", nullptr, kFailRank);
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  // TORCHELASTIC_RESTART_COUNT is the job's, not each agent's: both ranks ran attempt 1.
  std::string both = r0.out + r1.out;
  EXPECT_NE(both.find("rank 0 done in attempt 1"), std::string::npos) << both;
  EXPECT_NE(both.find("rank 1 done in attempt 1"), std::string::npos) << both;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

TEST_F(EtcdRendezvous, FailureElsewhereIsReportedOnEveryNodeAndTheJobLeavesNoKeys) {
  start();
  env_.env.insert({{"FAIL_RANK", "1"}, {"FAILS", "9"}, {"FAIL_CODE", "7"}, {"SLEEP", "300"}});
  auto a0 = agent("2", {}, "job", nullptr, kFailRank),
       a1 = agent("2", {}, "job", nullptr, kFailRank);
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  std::string both = r0.err + r1.err;
  EXPECT_TRUE((r0.exit_code == 7 && r1.exit_code == 1) || (r0.exit_code == 1 && r1.exit_code == 7))
      << r0.all() << r1.all();
  EXPECT_NE(both.find("the job failed on another node; root cause: host"), std::string::npos)
      << both;
  EXPECT_NE(both.find("exit code 7"), std::string::npos) << both;
  // A failed job's count must not outlive it: the same id runs again from zero.
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

// `launch status` and `launch stacks` on one node reach the other node through etcd.
TEST_F(EtcdRendezvous, StatusAndOnDemandStacksCoverEveryNode) {
  start();
  std::string logs0 = makeTempDir("etcd-st0"), logs1 = makeTempDir("etcd-st1");
  std::string out = makeTempDir("etcd-st-out");
  env_.env.insert({{"OUT_DIR", out}});
  const std::string wait =
      std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/wait_for_file.py";
  auto a0 = agent("2", {"--nproc-per-node=2", "--log-dir", logs0}, "job", nullptr, wait);
  auto a1 = agent("2", {"--nproc-per-node=2", "--log-dir", logs1}, "job", nullptr, wait);
  ASSERT_TRUE(eventually(
      [&] {
        for (int r = 0; r < 4; ++r)
          if (readFile(out + "/ready." + std::to_string(r)) != "ready") return false;
        return true;
      },
      90s))
      << a0->outputSoFar() << a1->outputSoFar();
  RunResult status;
  EXPECT_TRUE(eventually(
      [&] {
        status = run({kBin + "/launch", "status", logs0 + "/job"});
        return status.out.find("no status published") == std::string::npos &&
               count(status.out, "2/2 ranks up") == 2;
      },
      30s))
      << status.all();
  auto stacks = run({kBin + "/launch", "stacks", logs0 + "/job"});
  EXPECT_EQ(stacks.exit_code, 0) << stacks.all();
  EXPECT_NE(stacks.out.find("2 stack(s) saved in " + logs1 + "/job/snapshots/"), std::string::npos)
      << stacks.out;
  EXPECT_EQ(count(stacks.out, "wait_here"), 4) << stacks.out;
  std::ofstream(out + "/go") << "go";
  EXPECT_EQ(a0->wait(60s).exit_code, 0);
  EXPECT_EQ(a1->wait(60s).exit_code, 0);
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

// etcd with TLS and client certificates (--client-cert-auth), given as torchrun's keys.
TEST_F(EtcdRendezvous, TlsWithClientCertificates) {
  auto tls = ddpl::testing::makeTestTls(makeTempDir("etcd-tls"), true);
  if (!tls) GTEST_SKIP() << "openssl could not make test certificates";
  start(1, tls);
  env_.env.insert({{"FAILS", "0"}, {"SLEEP", "0.2"}});
  std::vector<std::string> extra = {"--rdzv-conf=protocol=https,cacert=" + tls->ca +
                                    ",cert=" + tls->cert + ",key=" + tls->key};
  auto a0 = agent("2", extra, "job", nullptr, kFailRank),
       a1 = agent("2", extra, "job", nullptr, kFailRank);
  auto r0 = a0->wait(120s), r1 = a1->wait(120s);
  EXPECT_EQ(r0.exit_code, 0) << r0.all();
  EXPECT_EQ(r1.exit_code, 0) << r1.all();
  EXPECT_EQ(count(r0.out + r1.out, "done in attempt 0"), 2) << r0.all() << r1.all();
  // Without the client certificate etcd refuses the connection, and launch says where.
  auto r = agent("2", {"--rdzv-conf=cacert=" + tls->ca + ",connect_timeout=2"}, "job2", nullptr,
                 kFailRank)
               ->wait(60s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.all().find("no endpoint answered within 2.0s"), std::string::npos) << r.all();
}

// A node stopped (SIGSTOP) past its lease TTL is dropped; its worker dies when the others
// re-form. Continued, it finds its lease expired and re-joins as a newcomer: no node uses a
// restart (there are none to use here) and the job finishes on all three.
TEST_F(EtcdRendezvous, StoppedNodeDroppedThenContinuedRejoinsWithoutARestart) {
  start();
  env_.env["TOTAL_STEPS"] = "150";
  const std::vector<std::string> extra = {"--rdzv-conf=lease_ttl=5", "--max-restarts=0"};
  auto a0 = agent("2:3", extra), a1 = agent("2:3", extra), a2 = agent("2:3", extra);
  ASSERT_TRUE(eventually([&] { return stepOf(ckpt_) >= 5; }, 120s)) << a0->outputSoFar();
  ASSERT_TRUE(
      eventually([&] { return a0->outputSoFar().find("world=3") != std::string::npos; }, 60s));
  kill(a2->pid(), SIGSTOP);
  bool reformed = eventually(
      [&] {
        std::string out = a0->outputSoFar() + a1->outputSoFar();
        return out.find("lease expired") != std::string::npos &&
               out.find("world=2 step=") != std::string::npos;
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
  EXPECT_EQ(count(all, "world=3 step=150"), 3) << all;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

// Issue 31: a member of the ended round that neither re-joined nor left holds the next round
// while its place lives, kept by its lease: it may be cut off from etcd with its workers
// training on (its agent fences before the lease can run out). A node whose agent is stopped
// (SIGSTOP: its workers run on, its lease runs out) stands for it here; a fourth node arriving
// ends the round, the two others re-join at once, and the round forms with the newcomer only
// once the stopped node's place is gone.
TEST_F(EtcdRendezvous, TheNextRoundWaitsForAMemberOfTheEndedRoundThatStillHoldsItsPlace) {
  start();
  env_.env["TOTAL_STEPS"] = "150";
  const std::vector<std::string> extra = {"--rdzv-conf=lease_ttl=8,last_call_timeout=1",
                                          "--max-restarts=0"};
  auto a0 = agent("2:4", extra), a1 = agent("2:4", extra), a2 = agent("2:4", extra);
  ASSERT_TRUE(eventually([&] { return a0->outputSoFar().find("world=3 step=") != std::string::npos; },
                         120s))
      << a0->outputSoFar();
  kill(a2->pid(), SIGSTOP);
  auto a3 = agent("2:4", extra);
  bool held = eventually(
      [&] {
        std::string out = a0->outputSoFar() + a1->outputSoFar() + a3->outputSoFar();
        return out.find("waits up to 8s for node(s) ") != std::string::npos &&
               out.find("(after: node ") != std::string::npos;
      },
      60s);
  std::this_thread::sleep_for(1s);
  kill(a2->pid(), SIGCONT);
  ASSERT_TRUE(held) << a0->outputSoFar() << a3->outputSoFar();
  std::string during = a0->outputSoFar() + a1->outputSoFar() + a3->outputSoFar();
  // The node it waited for is the stopped one (its node id ends with its launch pid).
  size_t w = during.find("waits up to 8s for node(s) ");
  EXPECT_NE(during.substr(w, during.find('\n', w) - w).find("-" + std::to_string(a2->pid())),
            std::string::npos)
      << during;
  auto r0 = a0->wait(180s), r1 = a1->wait(180s), r2 = a2->wait(180s), r3 = a3->wait(180s);
  for (auto* r : {&r0, &r1, &r2, &r3}) EXPECT_EQ(r->exit_code, 0) << r->all();
  std::string all = r0.all() + r1.all() + r2.all() + r3.all();
  EXPECT_EQ(all.find("restarting the worker group"), std::string::npos) << all;
  EXPECT_EQ(count(all, "world=4 step=150"), 4) << all;
  EXPECT_EQ(etcd_->keys("/ddplaunch/"), "");
}

