// The checkpoint directory and its resume rule (worker/checkpoint_manager.h), and the micro-batch
// arithmetic of OOM recovery (worker/auto_batch.h): the parts that need no process group.
//
// libtorch.so exports std::filesystem functions of its own build; its remove_all crashes when
// called from here (a call through a null pointer), so the test cuts, copies and removes files
// with POSIX calls.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "worker/auto_batch.h"
#include "worker/checkpoint_archive.h"
#include "worker/checkpoint_manager.h"

namespace dw = ddpl::worker;
namespace fs = std::filesystem;

namespace {

class CheckpointDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddpl-ckpt-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    removeTree();
    fs::create_directories(dir_);
  }
  void TearDown() override { removeTree(); }
  void removeTree() const { ASSERT_EQ(std::system(("rm -rf '" + dir_.string() + "'").c_str()), 0); }

  // A real checkpoint of a small model, as training writes it.
  std::string write(const dw::CheckpointDirectory& d, int64_t step) {
    auto model = std::make_shared<torch::nn::LinearImpl>(16, 4);
    dw::TrainingProgress progress{0, step, step * 8};
    const std::string path = d.pathFor(step);
    dw::saveCheckpoint(path, {model.get(), nullptr, nullptr, &progress});
    return path;
  }
  static void truncateTo(const std::string& path, uintmax_t size) {
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
  }
  static uintmax_t sizeOf(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return static_cast<uintmax_t>(st.st_size);
  }
  static void copy(const std::string& from, const std::string& to) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }

  fs::path dir_;
};

TEST_F(CheckpointDirectoryTest, ACompleteArchiveHasNoDefectAndEveryCutOneIsTruncated) {
  dw::CheckpointDirectory d(dir_.string());
  const std::string path = write(d, 3);
  EXPECT_EQ(dw::checkpointDefect(path), "");
  const auto size = sizeOf(path);
  // Cut anywhere (inside the data, the central directory, or the end record): truncated.
  for (uintmax_t cut : {size - 1, size - 10, size - 22, size - 100, size / 2, uintmax_t{30}}) {
    copy(path, path + ".cut");
    truncateTo(path + ".cut", cut);
    const std::string defect = dw::checkpointDefect(path + ".cut");
    EXPECT_EQ(defect.rfind("truncated: " + std::to_string(cut) + " bytes, ", 0), 0u)
        << "cut at " << cut << " of " << size << ": " << defect;
  }
  std::ofstream(dir_ / "garbage.pt") << std::string(4096, 'x');
  EXPECT_NE(dw::checkpointDefect((dir_ / "garbage.pt").string()), "");
  EXPECT_EQ(dw::checkpointDefect((dir_ / "absent.pt").string()).rfind("unreadable", 0), 0u);
}

TEST_F(CheckpointDirectoryTest, ListsNewestFirstAndIgnoresTemporariesAndOtherFiles) {
  dw::CheckpointDirectory d(dir_.string(), 2);
  write(d, 8);
  write(d, 120);
  write(d, 16);
  // A dead writer's temporary (a child that exited) and a live one's (this process: launch
  // persisting into the directory while the group restarts).
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const std::string dead_tmp = d.pathFor(200) + ".tmp." + std::to_string(dead);
  const std::string live_tmp = d.pathFor(240) + ".tmp." + std::to_string(getpid());
  std::ofstream(dead_tmp) << "half";
  std::ofstream(live_tmp) << "in flight";
  std::ofstream(dir_ / "notes.txt") << "x";
  const auto all = d.list();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 120);
  EXPECT_EQ(all[1].step, 16);
  EXPECT_EQ(all[2].step, 8);
  d.removeTemporaries();
  EXPECT_FALSE(fs::exists(dead_tmp));
  EXPECT_TRUE(fs::exists(live_tmp)) << "a live writer's file in flight is not touched";
  // Not written for 10 minutes: stale whoever wrote it (another host's pid means nothing here).
  fs::last_write_time(live_tmp, fs::file_time_type::clock::now() - std::chrono::minutes(11));
  d.removeTemporaries();
  EXPECT_FALSE(fs::exists(live_tmp));
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  EXPECT_EQ(d.prune(), 1u);  // keep 2
  EXPECT_FALSE(fs::exists(d.pathFor(8)));
  EXPECT_TRUE(fs::exists(d.pathFor(16)));
  EXPECT_EQ(d.removeAll(), 2u);
  EXPECT_TRUE(d.list().empty());
}

TEST_F(CheckpointDirectoryTest, ATruncatedNewestIsSkippedForTheNewestCompleteOne) {
  dw::CheckpointDirectory d(dir_.string());
  write(d, 10);
  write(d, 20);
  const std::string newest = write(d, 30);
  truncateTo(newest, sizeOf(newest) / 3);
  dw::CheckpointFile chosen;
  std::vector<std::string> skipped;
  ASSERT_TRUE(d.newestComplete(chosen, &skipped));
  EXPECT_EQ(chosen.step, 20);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].rfind(newest + ": truncated: ", 0), 0u) << skipped[0];

  // Every one truncated: nothing to resume from, each named.
  for (const auto& f : d.list()) truncateTo(f.path, 100);
  skipped.clear();
  EXPECT_FALSE(d.newestComplete(chosen, &skipped));
  EXPECT_EQ(skipped.size(), 3u);

  // The one chosen loads: it is the real thing, not just a file with the right end.
  dw::CheckpointDirectory d2((dir_ / "again").string());
  fs::create_directories(d2.dir());
  write(d2, 5);
  ASSERT_TRUE(d2.newestComplete(chosen));
  auto model = std::make_shared<torch::nn::LinearImpl>(16, 4);
  dw::TrainingProgress progress;
  EXPECT_TRUE(dw::loadCheckpoint(chosen.path, {model.get(), nullptr, nullptr, &progress}));
  EXPECT_EQ(progress.step, 5);
}

TEST_F(CheckpointDirectoryTest, RunIdIsStoredAndReadBack) {
  dw::CheckpointDirectory d(dir_.string());
  EXPECT_EQ(d.storedRunId(), "");
  d.storeRunId("job-7");
  EXPECT_EQ(d.storedRunId(), "job-7");
  d.storeRunId("");  // no run id (a plain start): the recorded one stays
  EXPECT_EQ(d.storedRunId(), "job-7");
}

TEST(ResumeRule, RestartThenSameRunThenTheFlagThenFresh) {
  using R = dw::ResumeReason;
  EXPECT_EQ(dw::chooseResume(1, "a", "b", false), R::kRestart);
  EXPECT_EQ(dw::chooseResume(2, "", "", false), R::kRestart);
  EXPECT_EQ(dw::chooseResume(0, "a", "a", false), R::kSameRun);
  EXPECT_EQ(dw::chooseResume(0, "a", "a", true), R::kSameRun);
  EXPECT_EQ(dw::chooseResume(0, "a", "b", true), R::kResumeFlag);
  EXPECT_EQ(dw::chooseResume(0, "", "", true), R::kResumeFlag);
  EXPECT_EQ(dw::chooseResume(0, "a", "b", false), R::kFresh);
  // No run id at all is not "the same run" as a directory without one.
  EXPECT_EQ(dw::chooseResume(0, "", "", false), R::kFresh);
}

TEST(MicroBatching, ShrinksBySmallestPrimeFactorKeepingSamplesPerStep) {
  struct Case {
    int64_t micro, accumulation, want_micro, want_accumulation;
  };
  for (const Case c : {Case{8, 1, 4, 2}, Case{6, 2, 3, 4}, Case{9, 1, 3, 3}, Case{7, 3, 1, 21},
                       Case{2, 5, 1, 10}, Case{64, 1, 32, 2}}) {
    dw::MicroBatching next;
    ASSERT_TRUE(dw::shrinkMicroBatching({c.micro, c.accumulation}, 1, next)) << c.micro;
    EXPECT_EQ(next.micro_batch, c.want_micro) << c.micro;
    EXPECT_EQ(next.accumulation, c.want_accumulation) << c.micro;
    EXPECT_EQ(next.micro_batch * next.accumulation, c.micro * c.accumulation);
  }
  dw::MicroBatching next{99, 99};
  EXPECT_FALSE(dw::shrinkMicroBatching({1, 4}, 1, next));
  EXPECT_FALSE(dw::shrinkMicroBatching({8, 1}, 5, next));  // 4 would be below the minimum
  EXPECT_EQ(next.micro_batch, 99);                         // untouched when it cannot shrink
}

}  // namespace
