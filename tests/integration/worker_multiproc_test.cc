// Real processes on loopback with Gloo: the claims of issue 4 that need more than one rank.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/integration/worker_procs.h"

namespace wt = ddpl::worker::testing;

namespace {

void expectAllSucceed(const std::vector<wt::RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(wt::exitedWith(results[r].status, 0)) << "rank " << r << " status " << results[r].status
                                                      << "\n" << results[r].log;
  }
}

class WorkerEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(WorkerEquivalence, MatchesSingleProcessWithGlobalBatch) {
  const auto& [scenario, world] = GetParam();
  expectAllSucceed(wt::runRanks(world, {scenario}, wt::tempDir()));
}

INSTANTIATE_TEST_SUITE_P(Gloo, WorkerEquivalence,
                         ::testing::Values(std::make_tuple("equivalence", 2), std::make_tuple("equivalence", 3),
                                           std::make_tuple("equivalence_nosync", 2),
                                           std::make_tuple("equivalence_batchnorm", 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

TEST(WorkerDdp, FirstBucketAllReduceStartsBeforeBackwardEnds) {
  expectAllSucceed(wt::runRanks(2, {"overlap"}, wt::tempDir()));
}

TEST(WorkerDdp, SmallModelIsReducedInTwoOverlappedBuckets) {
  expectAllSucceed(wt::runRanks(2, {"small_model_split"}, wt::tempDir()));
}

TEST(WorkerDdp, EveryForwardStartsFromRankZerosBuffersWhenOverlapped) {
  expectAllSucceed(wt::runRanks(2, {"buffers", "overlap"}, wt::tempDir()));
}

TEST(WorkerDdp, EveryForwardStartsFromRankZerosBuffersWhenSynchronous) {
  expectAllSucceed(wt::runRanks(3, {"buffers", "sync"}, wt::tempDir()));
}

TEST(WorkerDdp, ShapeMismatchNamesTheFirstDifferentParameter) {
  const auto results = wt::runRanks(2, {"shape_mismatch"}, wt::tempDir());
  for (const auto& r : results) EXPECT_TRUE(wt::exitedWith(r.status, 1)) << r.log;
  const auto rank1 = nlohmann::json::parse(wt::readFile(results[1].error_file));
  EXPECT_EQ(rank1["message"]["message"].get<std::string>(),
            "ddpl::InvalidArgument: DistributedDataParallel: model mismatch: parameter '0.weight' has shape "
            "[5, 8] on rank 1 but [4, 8] on rank 0");
  const auto rank0 = nlohmann::json::parse(wt::readFile(results[0].error_file));
  EXPECT_NE(rank0["message"]["message"].get<std::string>().find("rank 1 holds different parameter shapes"),
            std::string::npos);
}

TEST(WorkerSession, UncaughtExceptionWritesTorchrunErrorFileAndRunsCleanup) {
  const std::string dir = wt::tempDir();
  const long before = static_cast<long>(::time(nullptr));
  const auto results = wt::runRanks(2, {"throw", dir + "/cleanup"}, dir);
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(wt::exitedWith(results[r].status, 1)) << results[r].log;
    const auto json = nlohmann::json::parse(wt::readFile(results[r].error_file));
    EXPECT_EQ(json["message"]["message"].get<std::string>(),
              "ddpl::InvalidArgument: deliberate failure on rank " + std::to_string(r));
    const long ts = std::stol(json["message"]["extraInfo"]["timestamp"].get<std::string>());
    EXPECT_GE(ts, before);
    EXPECT_LE(ts, static_cast<long>(::time(nullptr)));
    // A ddpl::InvalidArgument brings no frames of its own: those recorded at its throw (the
    // report's frames are unwound by then), main among them by name.
    const std::string trace = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
    EXPECT_EQ(trace.rfind("Thrown from (", 0), 0u) << trace;
    EXPECT_EQ(trace.find("describeImpl"), std::string::npos) << trace;
    EXPECT_NE(trace.find(": main at "), std::string::npos) << trace;
  }
  EXPECT_EQ(wt::readFile(dir + "/cleanup"), "cleanup ran\n");
}

// Symbolised frames in error files (issue 18). worker_rank has debug information; the stripped
// library it calls through has none.
std::string rankSource() {
  return std::string(DDPL_SOURCE_DIR) + "/tests/integration/worker_rank_main.cc";
}

int sourceLineOf(const std::string& marker) {
  std::ifstream in(rankSource());
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find(marker) != std::string::npos) return n;
  }
  ADD_FAILURE() << "no '" << marker << "' in " << rankSource();
  return -1;
}

using ::ddpl::testing::frameLines;

// Index of the one frame line that names `function` at worker_rank_main.cc:`line` in worker_rank.
int namedFrame(const std::vector<std::string>& frames, const std::string& function, int line) {
  const std::regex re(
      "frame #\\d+: " + std::regex_replace(function, std::regex(R"([()])"), R"(\$&)") +
      R"( at (\S+):(\d+) \((/\S+/worker_rank) \+ 0x[0-9a-f]+\))");
  int found = -1;
  for (size_t i = 0; i < frames.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(frames[i], m, re)) continue;
    EXPECT_EQ(found, -1) << "two frames name " << function;
    const std::string file = m[1].str(), tail = "/tests/integration/worker_rank_main.cc";
    EXPECT_TRUE(file.size() > tail.size() &&
                file.compare(file.size() - tail.size(), tail.size(), tail) == 0)
        << file;
    EXPECT_EQ(std::stoi(m[2].str()), line) << frames[i];
    char binary[PATH_MAX];
    EXPECT_EQ(m[3].str(), ::realpath(wt::rankBinary().c_str(), binary) ? binary : wt::rankBinary());
    found = static_cast<int>(i);
  }
  return found;
}

nlohmann::json runAlone(const std::string& scenario, const std::string& dir) {
  const pid_t pid =
      wt::spawn({wt::rankBinary(), scenario},
                {{"TORCHELASTIC_ERROR_FILE", dir + "/error.json"}, {"OMP_NUM_THREADS", "1"}},
                dir + "/rank.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(60));
  EXPECT_TRUE(wt::exitedWith(status, 1)) << status << "\n" << wt::readFile(dir + "/rank.log");
  return nlohmann::json::parse(wt::readFile(dir + "/error.json"));
}

TEST(WorkerErrorFile, C10ErrorFramesNameFunctionsAndSourceLines) {
  const auto json = runAlone("throw_named", wt::tempDir());
  EXPECT_EQ(json["message"]["message"].get<std::string>(),
            "c10::Error: deliberate check failure with value 7");
  const std::string trace = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
  const auto frames = frameLines(trace);
  const int thrower = namedFrame(frames, "ddpl_test::throwFromHere(int)",
                                 sourceLineOf("// throw site: throw_named"));
  ASSERT_GE(thrower, 0) << trace;
  // Below it: the library without symbols (module + offset), then its exported entry point.
  ASSERT_LT(thrower + 2, static_cast<int>(frames.size())) << trace;
  EXPECT_TRUE(std::regex_match(
      frames[thrower + 1],
      std::regex(
          R"(frame #\d+: <unknown function> \(/\S+/libddpl_test_stripped\.so \+ 0x[0-9a-f]+\))")))
      << trace;
  EXPECT_TRUE(std::regex_match(
      frames[thrower + 2],
      std::regex(
          R"(frame #\d+: ddpl_test_call_through_stripped \+ 0x[0-9a-f]+ \(/\S+/libddpl_test_stripped\.so \+ 0x[0-9a-f]+\))")))
      << trace;
  EXPECT_EQ(trace.find("(symbolisation stopped"), std::string::npos) << trace;
  EXPECT_EQ(trace.find("(not symbolised"), std::string::npos) << trace;
}

TEST(WorkerErrorFile, ExceptionEscapingAThreadNamesTheThrowingFunction) {
  const auto json = runAlone("throw_in_thread", wt::tempDir());
  EXPECT_EQ(json["message"]["message"].get<std::string>(),
            "std::runtime_error: deliberate failure in a thread, value 7");
  const std::string trace = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
  EXPECT_EQ(trace.rfind("Thrown from (", 0), 0u) << trace;
  EXPECT_GE(namedFrame(frameLines(trace), "ddpl_test::throwInThread(int)",
                       sourceLineOf("// throw site: throw_in_thread")),
            0)
      << trace;
}

TEST(WorkerSession, SigtermRunsCleanupHooksThenDiesBySignal) {
  const std::string dir = wt::tempDir();
  const int port = wt::freePort();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(wt::spawn({wt::rankBinary(), "signal", dir + "/marker"},
                             {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)},
                              {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)},
                              {"DDPL_BACKEND", "gloo"}},
                             dir + "/rank" + std::to_string(r) + ".log"));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(wt::exists(dir + "/marker.ready.0") && wt::exists(dir + "/marker.ready.1"))) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << wt::readFile(dir + "/rank0.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids) ::kill(pid, SIGTERM);
  for (int r = 0; r < 2; ++r) {
    const int status = wt::waitFor(pids[r], std::chrono::seconds(30));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
    EXPECT_EQ(wt::readFile(dir + "/marker." + std::to_string(r)), "cleanup ran\n")
        << wt::readFile(dir + "/rank" + std::to_string(r) + ".log");
  }
}

// The same binary runs unchanged under the launchers users already have.
TEST(WorkerLaunchers, RunsUnderPinnedTorchrun) {
  const std::string torchrun = std::string(DDPL_PYTHON).substr(0, std::string(DDPL_PYTHON).rfind('/')) + "/torchrun";
  if (!wt::exists(torchrun)) GTEST_SKIP() << "no torchrun next to " << DDPL_PYTHON;
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({torchrun, "--standalone", "--nproc-per-node=2", "--no-python", wt::rankBinary(),
                               "equivalence"},
                              {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}}, dir + "/torchrun.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  EXPECT_TRUE(wt::exitedWith(status, 0)) << wt::readFile(dir + "/torchrun.log");
}

TEST(WorkerLaunchers, RunsUnderLaunch) {
  const std::string launch = std::string(DDPL_BIN_DIR) + "/launch";
  ASSERT_TRUE(wt::exists(launch)) << launch << " not built (the test target depends on it)";
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({launch, "--standalone", "--nproc-per-node=2", wt::rankBinary(), "equivalence"},
                              {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}}, dir + "/launch.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  const std::string log = wt::readFile(dir + "/launch.log");
  EXPECT_TRUE(wt::exitedWith(status, 0)) << log;
  // DistributedDataParallel beats once per synchronised backward, with no user code: the
  // scenario's 5 steps on each rank reach launch's end-of-run summary.
  const auto at = log.find("per-rank summary of attempt");
  ASSERT_NE(at, std::string::npos) << log;
  std::istringstream rows(log.substr(at));
  std::string line;
  int ranks_with_five = 0;
  while (std::getline(rows, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.size() >= 8 && (w[0] == "0" || w[0] == "1") && w[3] == "5") ++ranks_with_five;
  }
  EXPECT_EQ(ranks_with_five, 2) << log;
}

// launch's failure report shows a C++ rank's innermost frames by name, past the frames that
// build and throw the c10::Error (the error file keeps those).
TEST(WorkerLaunchers, FailureReportNamesTheThrowingFunction) {
  const std::string launch = std::string(DDPL_BIN_DIR) + "/launch";
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({launch, "--standalone", "--nproc-per-node=1", "--log-dir",
                               dir + "/logs", "--rdzv-id=t", wt::rankBinary(), "throw_named"},
                              {{"OMP_NUM_THREADS", "1"}}, dir + "/launch.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  const std::string log = wt::readFile(dir + "/launch.log");
  EXPECT_TRUE(wt::exitedWith(status, 1)) << log;
  const auto root = log.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << log;
  const std::string report = log.substr(root);
  const std::string throwSite =
      "worker_rank_main.cc:" + std::to_string(sourceLineOf("// throw site: throw_named"));
  const auto thrower = report.find("    frame #2: ddpl_test::throwFromHere(int) at ");
  ASSERT_NE(thrower, std::string::npos) << report;
  EXPECT_NE(report.substr(thrower, report.find('\n', thrower) - thrower).find(throwSite + " ("),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("    Exception raised from throwFromHere at "), std::string::npos)
      << report;
  EXPECT_EQ(report.find("c10::Error::Error("), std::string::npos) << report;
  EXPECT_NE(report.find("(not shown: 2 frame(s) that build and throw the exception"),
            std::string::npos)
      << report;
}

// A C++ rank that blocks in its own code while the other waits in DDP's all-reduce: launch
// names it, with the function it blocks in (demangled, from its native stack), as the root
// cause, and exits 124 (no restarts left).
TEST(WorkerLaunchers, HungRankUnderLaunchIsNamedWithItsNativeFrame) {
  const std::string launch = std::string(DDPL_BIN_DIR) + "/launch";
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({launch, "--standalone", "--nproc-per-node=2", "--hang-timeout=3",
                               "--log-dir", dir + "/logs", "--rdzv-id=h", wt::rankBinary(), "hang", "1"},
                              {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}}, dir + "/launch.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  const std::string log = wt::readFile(dir + "/launch.log");
  EXPECT_TRUE(wt::exitedWith(status, 124)) << log;
  EXPECT_NE(log.find("likely culprit: rank(s) 1 "), std::string::npos) << log;
  const auto root = log.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << log;
  EXPECT_NE(log.find("rank      : 1 (local_rank: 1)", root), std::string::npos) << log;
  EXPECT_NE(log.find("blockInUserCode()", root), std::string::npos) << log;
  EXPECT_NE(wt::readFile(dir + "/logs/h/attempt_0/0/stacks.txt").find("DdpReducer"), std::string::npos);
}

// Issue 44: a C++ rank whose teardown after its last step (here a cleanup hook of 5 s) outlasts
// --hang-timeout is finishing, not hung: the Session marks its end in the heartbeat, and the job
// exits 0. Before, launch reported "no step for 2.0s after step 5" and exited 124.
TEST(WorkerLaunchers, TeardownAfterTheLastStepIsNoHang) {
  const std::string launch = std::string(DDPL_BIN_DIR) + "/launch";
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({launch, "--standalone", "--nproc-per-node=2", "--hang-timeout=2",
                               "--rdzv-id=t", wt::rankBinary(), "slow_teardown", "5"},
                              {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}}, dir + "/launch.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  const std::string log = wt::readFile(dir + "/launch.log");
  EXPECT_TRUE(wt::exitedWith(status, 0)) << log;
  EXPECT_NE(log.find("tearing down for 5.0s"), std::string::npos) << log;
  EXPECT_EQ(log.find("hung"), std::string::npos) << log;
}

// A C++ rank that is 30 ms slower per step makes every rank step at its pace (the others wait
// in DDP's all-reduce); DDP reports the time each rank waited, so launch names the slow one.
TEST(WorkerLaunchers, StragglerUnderLaunchIsNamedAndNoOtherRank) {
  const std::string launch = std::string(DDPL_BIN_DIR) + "/launch";
  const std::string dir = wt::tempDir();
  const pid_t pid = wt::spawn({launch, "--standalone", "--nproc-per-node=3", "--monitor-interval=0.01",
                               wt::rankBinary(), "straggler", "2"},
                              {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}}, dir + "/launch.log");
  const int status = wt::waitFor(pid, std::chrono::seconds(120));
  const std::string log = wt::readFile(dir + "/launch.log");
  EXPECT_TRUE(wt::exitedWith(status, 0)) << log;
  EXPECT_NE(log.find("straggler on "), std::string::npos) << log;
  EXPECT_NE(log.find("rank 2 (local rank 2) takes"), std::string::npos) << log;
  EXPECT_EQ(log.find("rank 0 (local rank 0) takes"), std::string::npos) << log;
  EXPECT_EQ(log.find("rank 1 (local rank 1) takes"), std::string::npos) << log;
}

}  // namespace
