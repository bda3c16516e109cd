// Real PyTorch Python scripts, unchanged, under `launch` (the pinned torch from .venv).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/common/subprocess.h"

using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kScripts = std::string(DDPL_SOURCE_DIR) + "/tests/python";
}  // namespace

TEST(LaunchPython, FourRankGlooDdpScriptRunsUnchanged) {
  RunOptions o;
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  o.timeout = 300s;
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=4", kScripts + "/ddp_gloo.py"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  std::string checksum;
  for (int rank = 0; rank < 4; ++rank) {
    std::string tag = "[default" + std::to_string(rank) + "]:DDP OK rank=" + std::to_string(rank) +
                      " world=4 local_rank=" + std::to_string(rank) + " group_rank=0 checksum=";
    auto pos = r.out.find(tag);
    ASSERT_NE(pos, std::string::npos) << r.out;
    std::string sum = r.out.substr(pos + tag.size(), r.out.find('\n', pos) - pos - tag.size());
    if (rank == 0) checksum = sum;
    EXPECT_EQ(sum, checksum) << "ranks disagree after DDP training";
  }
}

// Cold, and forked from the warm template (issue 30: the module imports torch, prewarmed).
TEST(LaunchPython, RecordDecoratorErrorReachesTheReport) {
  for (std::string prewarm : {"", "--prewarm=torch"}) {
    RunOptions o;
    o.env["PYTHON_EXEC"] = DDPL_PYTHON;
    o.timeout = 180s;
    std::vector<std::string> argv = {kLaunch, "--nproc-per-node=2"};
    if (!prewarm.empty()) argv.push_back(prewarm);
    argv.push_back(kScripts + "/record_error.py");
    auto r = run(argv, o);
    EXPECT_EQ(r.exit_code, 1) << r.all();
    EXPECT_EQ(r.err.find("2 of 2 worker(s) forked from the template") != std::string::npos,
              !prewarm.empty())
        << r.all();
    auto pos = r.err.find("Root Cause");
    ASSERT_NE(pos, std::string::npos) << r.err;
    std::string root = r.err.substr(pos);
    EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
    EXPECT_NE(root.find("ValueError: learning rate must be positive, got -0.5"), std::string::npos)
        << root;
    EXPECT_NE(root.find("traceback :"), std::string::npos) << root;
    EXPECT_NE(root.find("record_error.py"), std::string::npos) << root;
    EXPECT_EQ(root.find("warm template"), std::string::npos) << root;
  }
}

// A 4-rank Gloo job where rank 2 stops before an all-reduce and the others wait for it inside
// the collective: launch finds the hang within --hang-timeout, saves every rank's stacks, names
// rank 2 and its Python frame, and restarts the group, which then finishes.
TEST(LaunchHang, HungRankIsFoundWithStacksAndTheGroupRestarts) {
  std::string logs = makeTempDir("hang");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"HANG_RANK", "2"}, {"HANG_STEP", "3"},
           {"OMP_NUM_THREADS", "1"}};
  o.timeout = 240s;
  // 6 s, not less: ranks idle while they bootstrap count toward the timeout (idle by rate,
  // issue 33), and a loaded machine (the sanitizer suite) can take seconds for that. The
  // restarted group's teardown after its last step does not count (issue 44: ddplaunch.done()).
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=4", "--hang-timeout=6",
                "--max-restarts=1", "--log-dir", logs, "--rdzv-id=hang",
                kScripts + "/hang_gloo.py"},
               o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("likely culprit: rank(s) 2 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stuck_in_data_loading (hang_gloo.py:"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("last step of each rank: rank 0: step 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group: restart 1 of 1"), std::string::npos) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string stacks = readFile(logs + "/hang/attempt_0/" + std::to_string(rank) + "/stacks.txt");
    EXPECT_NE(stacks.find("py-spy dump --pid"), std::string::npos) << stacks;
    // The others wait in the collective; rank 2 in its own code.
    EXPECT_NE(stacks.find(rank == 2 ? "stuck_in_data_loading" : "all_reduce"), std::string::npos)
        << rank << ": " << stacks;
  }
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " finished"), std::string::npos) << r.out;
}

TEST(LaunchHang, OutOfRestartsExitsWithTheHangCodeAndReport) {
  RunOptions o;
  // launch keeps the stacks a hang report names (issue 33): in a directory of the test's own.
  std::string tmp = makeTempDir("hang_tmp");
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"HANG_RANK", "1"}, {"HANG_STEP", "2"},
           {"OMP_NUM_THREADS", "1"}, {"TMPDIR", tmp}};
  o.timeout = 240s;
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=2", "--hang-timeout=6",
                kScripts + "/hang_gloo.py"},
               o);
  EXPECT_EQ(r.exit_code, 124) << r.all();
  EXPECT_NE(r.err.find("hung: no step for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank      : 1 (local_rank: 1)"), std::string::npos) << r.err;
  std::filesystem::remove_all(tmp);
}

// Issue 44: the teardown after a rank's last step (a final save, destroy_process_group, the
// interpreter's exit) is no hang, however long it takes on a loaded machine. Ranks that
// reported their last step (ddplaunch.done(), or by exiting their interpreter) and then take
// more than twice --hang-timeout to exit are not hung, and the job succeeds. Without that
// report, the same silence is a hang: launch cannot tell the two apart.
TEST(LaunchHang, TeardownAfterTheReportedLastStepIsNoHang) {
  std::string tmp = makeTempDir("teardown_tmp");  // for the stacks launch keeps after a hang
  for (std::string how : {"done", "atexit", "none"}) {
    RunOptions o;
    o.env = {{"PYTHON_EXEC", DDPL_PYTHON},
             {"TEARDOWN", how},
             {"TEARDOWN_SECONDS", "5"},
             {"TMPDIR", tmp}};
    o.timeout = 120s;
    auto r = run({kLaunch, "--nproc-per-node=2", "--hang-timeout=2", "--monitor-interval=0.05",
                  kScripts + "/slow_teardown.py"},
                 o);
    if (how == "none") {
      EXPECT_EQ(r.exit_code, 124) << how << "\n" << r.all();
      EXPECT_NE(r.err.find("hung: no step for"), std::string::npos) << how << "\n" << r.err;
      continue;
    }
    EXPECT_EQ(r.exit_code, 0) << how << "\n" << r.all();
    EXPECT_EQ(r.err.find("hung"), std::string::npos) << how << "\n" << r.err;
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " torn down after 5"),
                std::string::npos)
          << how << "\n"
          << r.out;
  }
  std::filesystem::remove_all(tmp);
}

// A rank stuck in its teardown for good is still found: --hang-finish-timeout after it
// reported its last step (bounded, however long the teardown would take).
TEST(LaunchHang, TeardownStuckForGoodIsHungAtTheFinishTimeout) {
  std::string tmp = makeTempDir("teardown_tmp");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON},
           {"TEARDOWN", "done"},
           {"TEARDOWN_SECONDS", "600"},
           {"TMPDIR", tmp}};
  o.timeout = 120s;
  auto start = std::chrono::steady_clock::now();
  auto r = run({kLaunch, "--nproc-per-node=1", "--hang-timeout=1", "--hang-finish-timeout=3",
                "--monitor-interval=0.05", kScripts + "/slow_teardown.py"},
               o);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_EQ(r.exit_code, 124) << r.all();
  EXPECT_NE(r.err.find("hung: not exited 3."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("after reporting its last step, step 5 (limit 3.0s for teardown)"),
            std::string::npos)
      << r.err;
  EXPECT_LT(took.count(), 60000) << r.err;
  std::filesystem::remove_all(tmp);
}

// Without --hang-timeout, a program that reports no steps is never watched: a silent wait is
// not a hang.
TEST(LaunchHang, SilentProgramWithoutStepsIsNotHungWithoutTheFlag) {
  auto r = run({kLaunch, "--nproc-per-node=2", "--hang-first-timeout=1", "--monitor-interval=0.05",
                "/bin/sh", "-c", "sleep 3"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(r.err.find("hung"), std::string::npos) << r.err;
  // With the flag, the same silence is a hang.
  std::string tmp = makeTempDir("hang_tmp");  // for the stacks launch keeps
  RunOptions o;
  o.env = {{"TMPDIR", tmp}};
  auto flagged = run({kLaunch, "--nproc-per-node=1", "--hang-timeout=1", "--monitor-interval=0.05",
                      "/bin/sh", "-c", "sleep 30"},
                     o);
  EXPECT_EQ(flagged.exit_code, 124) << flagged.all();
  EXPECT_NE(flagged.err.find("no CPU time and no output"), std::string::npos) << flagged.err;
  std::filesystem::remove_all(tmp);
}

// `launch stacks RUN_DIR` snapshots a running job's stacks without stopping it.
TEST(LaunchStacks, OnDemandSnapshotLeavesTheJobRunning) {
  std::string logs = makeTempDir("ondemand");
  std::string dir = makeTempDir("ondemand-out");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"OUT_DIR", dir}};
  Background bg({kLaunch, "--nproc-per-node=2", "--log-dir", logs, "--rdzv-id=od",
                 std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/wait_for_file.py"},
                o);
  ASSERT_TRUE(eventually([&] {
    return bg.outputSoFar().find("launch stacks") != std::string::npos &&
           readFile(dir + "/ready.0") == "ready" && readFile(dir + "/ready.1") == "ready";
  }, 60s)) << bg.outputSoFar();
  auto r = run({kLaunch, "stacks", logs + "/od"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("ok " + logs + "/od/snapshots/"), std::string::npos) << r.out;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " (local rank " + std::to_string(rank) +
                         ", pid "),
              std::string::npos)
        << r.out;
  EXPECT_NE(r.out.find("wait_here (wait_for_file.py:"), std::string::npos) << r.out;
  // Still running: let it finish.
  std::ofstream(dir + "/go") << "";
  auto done = bg.wait(60s);
  EXPECT_EQ(done.exit_code, 0) << done.all();
  EXPECT_EQ(run({kLaunch, "stacks", logs + "/od"}).exit_code, 1);  // nobody answers any more
}
