// The agent's parts through their own interfaces (issue 46): the hang watch, the heartbeat
// channels of a group, the checkpoint keeper when checkpoints in memory are off, the run's
// leftovers, the log base and the end-of-run summary's pure pieces. The agent's loop drives them
// in the integration tests; these pin what each promises on its own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "launcher/agent/containment.h"
#include "launcher/agent/hang_responder.h"
#include "launcher/agent/run_dir.h"
#include "launcher/agent/run_summary.h"
#include "launcher/agent/worker_spec.h"
#include "launcher/checkpoint/checkpoint_keeper.h"
#include "launcher/health/heartbeat_channel.h"

namespace ddpl::launcher {
namespace {

HangOptions quickHangs() {
  HangOptions o;  // no --hang-timeout: ranks that step are watched, with the automatic limit
  o.auto_floor_sec = 2;
  return o;
}

TEST(HangWatch, ARankThatStopsSteppingIsFoundOnceItsLimitPassesOneThatFinishedIsNot) {
  HangWatch watch(quickHangs(), "hostA");
  EXPECT_TRUE(watch.watching());
  watch.startGroup(3, 100);
  EXPECT_TRUE(
      watch.check({{0, 1, 1, 0, false}, {1, 2, 1, 0, false}, {2, 3, 1, 0, false}}, 100.5).empty());
  // Rank 1 steps on, rank 2 reported its last step (teardown has its own, longer limit).
  auto hangs = watch.check({{0, 1, 1, 0, false}, {1, 2, 2, 0, false}, {2, 3, 1, 0, true}}, 103);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].local_rank, 0);
  // Reported once per group.
  EXPECT_TRUE(watch.check({{0, 1, 1, 0, false}}, 104).empty());
}

TEST(HangWatch, HangTimeoutZeroWatchesNothing) {
  HangOptions o = quickHangs();
  o.timeout_sec = 0;
  EXPECT_FALSE(HangWatch(o, "hostA").watching());
}

TEST(HeartbeatChannels, EachRankHasItsOwnChannelUntilTheNextGroup) {
  HeartbeatChannels channels;
  channels.startGroup(2);
  const HeartbeatChannel* c = channels.open(1);
  ASSERT_NE(c, nullptr) << "memfd with sealing refused here";
  EXPECT_GE(fcntl(c->fd(), F_GETFD), 0);
  EXPECT_EQ(channels.step(0), 0u);  // never opened
  EXPECT_EQ(channels.step(1), 0u);
  EXPECT_EQ(channels.step(7), 0u);  // no such rank
  EXPECT_FALSE(channels.finishedStepping(1));
  EXPECT_EQ(channels.longestRestoreMicros(), 0u);
  int fd = c->fd();
  channels.startGroup(1);  // the previous group's channels are closed
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
}

TEST(CheckpointKeeper, OffItAddsNothingToAGroupAndHasNothingToSay) {
  CheckpointKeeperOptions o;
  o.memory = 0;  // --checkpoint-memory=0
  o.nproc = 2;
  // The job's store, as the keeper sees it: it must not be used.
  struct Values : NodeValues {
    void publishNodeValue(const std::string&, const std::string&) override { used = true; }
    std::optional<std::string> nodeValue(const std::string&, int) override {
      used = true;
      return std::nullopt;
    }
    bool used = false;
  } nv;
  CheckpointKeeper keeper(o, nv);
  EXPECT_FALSE(keeper.on());
  rdzv::round_rules::NodePlace place;
  place.group_world_size = 2;
  place.world_size = 4;
  place.round = 1;
  EXPECT_TRUE(keeper.startGroup(place, 1).empty());
  keeper.tick(1e9);
  keeper.onWorkerExit(0, 1234);
  EXPECT_FALSE(keeper.bytesOf(0));
  EXPECT_EQ(keeper.drain(), "");
  EXPECT_FALSE(nv.used);
}

TEST(Leftovers, AChildThatIsNotOursIsAStray) {
  Watchdog watchdog("agent-parts-test", "");
  Leftovers leftovers(watchdog);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  auto strays = leftovers.strays({});
  EXPECT_NE(std::find(strays.begin(), strays.end(), child), strays.end());
  EXPECT_EQ(std::find(strays.begin(), strays.end(), watchdog.pid()), strays.end());
  strays = leftovers.strays({child});
  EXPECT_EQ(std::find(strays.begin(), strays.end(), child), strays.end());
  leftovers.kill(nullptr, /*whole_run=*/false, -1, {});  // kills the stray
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  watchdog.release();
}

TEST(LogBase, WithoutLogDirAPrivateTemporaryOneThatGoesAtExit) {
  LogBase base = makeLogBase("", "/tmp");
  EXPECT_TRUE(base.temporary);
  struct stat st {};
  ASSERT_EQ(stat(base.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u);
  std::string run_dir = makeRunDir(base.path, "job");
  removeTemporaryBase(base, run_dir, {});
  EXPECT_FALSE(std::filesystem::exists(base.path));
}

TEST(LogBase, ALogDirIsMadeAndItsRunStays) {
  LogBase tmp = makeLogBase("", "/tmp");
  LogBase base = makeLogBase(tmp.path + "/a/b", "/tmp");
  EXPECT_FALSE(base.temporary);
  std::string run_dir = makeRunDir(base.path, "job");
  removeTemporaryBase(base, run_dir, {});
  EXPECT_TRUE(std::filesystem::is_directory(run_dir));
  removeAfterFailedStart(base, run_dir);  // a start that failed leaves nothing of its run
  EXPECT_FALSE(std::filesystem::exists(run_dir));
  EXPECT_TRUE(std::filesystem::is_directory(base.path));
  removeTemporaryBase(tmp, "", {});
}

TEST(RunSummary, TheRootCauseParagraphNamesTheRankAndItsLastWords) {
  FailureDetail d;
  d.exit.local_rank = 1;
  d.exit.pid = 4242;
  d.exit.status = ExitStatus::fromWaitStatus(3 << 8);
  d.global_rank = 5;
  d.stderr_tail = {"first", "ValueError: bad batch"};
  EXPECT_EQ(failureSummary(&d, "hostA"),
            "host hostA, rank 5 (local rank 1, pid 4242): " + d.exit.status.describe() +
                "; last stderr line: ValueError: bad batch");
  d.error = ErrorFileContents{"bad batch", "", ""};
  EXPECT_EQ(failureSummary(&d, "hostA"), "host hostA, rank 5 (local rank 1, pid 4242): " +
                                             d.exit.status.describe() + ": bad batch");
  EXPECT_EQ(failureSummary(nullptr, "hostA"), "a worker group failed on hostA");
  WorkerExit root;
  root.pid = 4242;
  std::vector<FailureDetail> failures = {FailureDetail{}, d};
  EXPECT_EQ(rootDetail(&root, failures), &failures[1]);
  EXPECT_EQ(rootDetail(nullptr, failures), nullptr);
}

TEST(RunSummary, WorkerThreadsAreLaunchsOwnSettingOrWhatLaunchSets) {
  EXPECT_EQ(workerThreads({{"OMP_NUM_THREADS", "6"}}, 4), 6);
  EXPECT_EQ(workerThreads({}, 4), 1);
  EXPECT_EQ(workerThreads({}, 1), 0);
}

TEST(RankStreams, RedirectedStreamsLeaveTheConsoleUnlessTeedAndTheFilterHidesRanks) {
  LaunchOptions o;
  o.redirects.all = {true, true};  // -r 3
  o.tee.per_rank[1] = {true, false};
  o.local_ranks_filter = {0, 1};
  RankStreams r0 = rankStreams(o, 0), r1 = rankStreams(o, 1), r2 = rankStreams(o, 2);
  EXPECT_TRUE(r0.outFile() && r0.errFile());
  EXPECT_FALSE(r0.out_console || r0.err_console);
  EXPECT_TRUE(r1.out_console);
  EXPECT_FALSE(r1.err_console);
  EXPECT_FALSE(r2.out_console || r2.err_console);  // not in --local-ranks-filter
}

// Issue 44: a run's folders on a disk file system cost launch more than the rest of its start
// and exit; when they hold only small files they go to the user's memory file system.
TEST(LogBase, SmallFilesGoToTheUsersMemoryFileSystemLogsAndTmpdirDoNot) {
  LogBase own = makeLogBase("", "/tmp");
  chmod(own.path.c_str(), 0700);
  auto tmpfs = [](const std::string&) { return true; };
  auto disk = [](const std::string&) { return false; };
  Environment env{{"XDG_RUNTIME_DIR", own.path}};
  EXPECT_EQ(temporaryLogParent(env, true, tmpfs), own.path);
  EXPECT_EQ(temporaryLogParent(env, false, tmpfs), "/tmp");  // logs never go to memory
  EXPECT_EQ(temporaryLogParent(env, true, disk), "/tmp");
  env["TMPDIR"] = "/var/tmp";  // the user's choice wins
  EXPECT_EQ(temporaryLogParent(env, true, tmpfs), "/var/tmp");
  EXPECT_EQ(temporaryLogParent(env, false, tmpfs), "/var/tmp");
  // A runtime folder others can enter, or that is not there, is not used: /dev/shm then.
  chmod(own.path.c_str(), 0755);
  EXPECT_EQ(temporaryLogParent({{"XDG_RUNTIME_DIR", own.path}}, true, tmpfs), "/dev/shm");
  EXPECT_EQ(temporaryLogParent({{"XDG_RUNTIME_DIR", "/nonexistent"}}, true, tmpfs), "/dev/shm");
  EXPECT_EQ(temporaryLogParent({{"XDG_RUNTIME_DIR", "relative"}}, true, tmpfs), "/dev/shm");
  removeTemporaryBase(own, "", {});
}

TEST(LogBase, OnlyARunWithoutOutputFilesWritesOnlySmallFiles) {
  LaunchOptions o;
  EXPECT_TRUE(writesOnlySmallFiles(o));
  o.tee.per_rank[1].stderr_ = true;
  EXPECT_FALSE(writesOnlySmallFiles(o));
  o = {};
  o.redirects.all.stdout_ = true;
  EXPECT_FALSE(writesOnlySmallFiles(o));
  o = {};
  o.duplicate_stderr_filters = {"loss"};
  EXPECT_FALSE(writesOnlySmallFiles(o));
}

}  // namespace
}  // namespace ddpl::launcher
