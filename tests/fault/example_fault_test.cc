// Elastic restart of the example: one worker is killed mid-run, `launch --max-restarts=1` stops
// the other and starts the group again, and the new ranks resume from the latest checkpoint in
// launch's memory and finish exactly the planned number of steps.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <regex>

#include "tests/common/subprocess.h"
#include "tests/integration/example_procs.h"

namespace et = ddpl::example::testing;
namespace dt = ddpl::testing;
namespace fs = std::filesystem;

namespace {

// Highest step among complete checkpoints in dir, 0 if none.
int64_t latestCheckpointStep(const std::string& dir) {
  static const std::regex kName("ckpt-step([0-9]+)\\.pt");
  int64_t best = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, kName)) best = std::max<int64_t>(best, std::stoll(m[1]));
  }
  return best;
}

TEST(ExampleFault, KilledWorkerRestartsTheGroupWhichResumesAndFinishesThePlannedSteps) {
  const std::string dir = dt::makeTempDir("ddpl-example-fault");
  const std::string ckpt = dir + "/ckpt";
  // 4096 images, 32 per rank per step on 2 ranks: 64 steps per epoch, 192 in all; a checkpoint
  // every 8 steps. Long enough that the kill lands well before the end on a fast machine too.
  constexpr int64_t kTotalSteps = 192;
  constexpr int64_t kKillAfterCheckpoint = 24;
  dt::RunOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}};
  dt::Background launch({et::binary("launch"),
                         "--standalone",
                         "--nproc-per-node=2",
                         "--max-restarts=1",
                         et::trainer(),
                         "--width",
                         "16",
                         "--train-size",
                         "4096",
                         "--test-size",
                         "256",
                         "--batch-size",
                         "32",
                         "--epochs",
                         "3",
                         "--checkpoint-dir",
                         ckpt,
                         "--checkpoint-every",
                         "8",
                         "--memory-checkpoint-every",
                         "4",
                         "--summary-json",
                         dir + "/summary.json",
                         "--log-every",
                         "16"},
                        o);

  // Wait for a mid-run checkpoint, then SIGKILL rank 1: a crash, no cleanup of its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  pid_t victim = -1;
  int64_t stepAtKill = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    launch.outputSoFar();  // keep the pipes drained
    stepAtKill = latestCheckpointStep(ckpt);
    if (stepAtKill >= kKillAfterCheckpoint) {
      victim = et::findRank(launch.pid(), 1);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(victim, 0) << "no checkpoint at step >= " << kKillAfterCheckpoint
                       << " or no rank 1 found\n"
                       << launch.outputSoFar();
  ASSERT_LT(stepAtKill, kTotalSteps);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  const auto r = launch.wait(std::chrono::seconds(240));
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto s = et::summary(dir + "/summary.json");
  ASSERT_FALSE(s.empty()) << r.all();
  EXPECT_EQ(s["restart_count"], 1);
  EXPECT_EQ(s["total_steps"], kTotalSteps);
  EXPECT_EQ(s["final_step"], kTotalSteps);
  // Resumed from launch's memory (a copy every 4 steps), at a step no older than the durable
  // one seen on disk before the kill.
  const int64_t start = s["start_step"].get<int64_t>();
  EXPECT_GE(start, stepAtKill);
  EXPECT_LT(start, kTotalSteps);
  EXPECT_EQ(start % 4, 0);
  EXPECT_EQ(s["steps_this_run"].get<int64_t>(), kTotalSteps - start);
  char name[64];
  std::snprintf(name, sizeof name, "/ckpt-step%08lld.pt", static_cast<long long>(start));
  const std::string resumed = s["resumed_from"];
  EXPECT_TRUE(resumed.rfind("/dev/shm/ddpl-ckpt-", 0) == 0 &&
              resumed.size() > std::string(name).size() &&
              resumed.compare(resumed.size() - std::string(name).size(), std::string::npos,
                              name) == 0)
      << resumed;
  EXPECT_NE(r.out.find("resumed from step " + std::to_string(start) + " (memory: " + resumed +
                       "), continuing at step " + std::to_string(start) + "/192 (restart 1)"),
            std::string::npos)
      << r.out;
  // The durable copies reached the disk in the background; the newest went there when the
  // worker died.
  EXPECT_GE(latestCheckpointStep(ckpt), start) << r.all();
  EXPECT_NE(r.out.find("final test top-1: "), std::string::npos) << r.out;
  fs::remove_all(dir);
}

}  // namespace
