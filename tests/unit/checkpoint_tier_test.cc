// Checkpoints in memory (docs/checkpoints.md): the commit protocol and its decisions
// (common/checkpoint_format.h, common/checkpoint_files.h), and launch's side of it
// (launcher/checkpoint/memory_tier.h) with real files, a real inotify and its persister thread.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "common/checkpoint_files.h"
#include "common/errors.h"
#include "launcher/checkpoint/memory_tier.h"
#include "launcher/checkpoint/replica.h"
#include "launcher/cli/values.h"
#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
namespace ck = ddpl::ckpt;
using ddpl::launcher::MemoryTier;
using ddpl::launcher::MemoryTierOptions;

namespace {

void writeFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ck::CommitRecord recordFor(int64_t rank, int64_t world, const std::string& durable) {
  ck::CommitRecord r;
  r.rank = rank;
  r.world_size = world;
  r.durable_path = durable;
  return r;
}

// Begins, writes `files`, commits step `step` of `rank` in `rank_dir`.
std::string commit(const std::string& rank_dir, int64_t rank, int64_t step,
                   const std::map<std::string, std::string>& files, ck::CommitRecord r) {
  std::string partial = ck::beginStep(rank_dir, step);
  for (const auto& [name, bytes] : files) writeFile(partial + "/" + name, bytes);
  r.step = step;
  r.rank = rank;
  return ck::commitStep(rank_dir, partial, r);
}

std::vector<int64_t> steps(const std::vector<ck::StoredStep>& stored) {
  std::vector<int64_t> out;
  for (const auto& s : stored) out.push_back(s.step);
  return out;
}

// Polls `ok` for up to 20 s (the persister runs on its own thread).
template <typename F>
bool eventually(F ok) {
  for (int i = 0; i < 2000; ++i) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ok();
}

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ddpl::testing::makeTempDir("ddpl-ckpt");
    rank_dir_ = dir_ + "/mem/rank-0";
    fs::create_directories(rank_dir_);
    durable_ = dir_ + "/durable";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, rank_dir_, durable_;
};

TEST(CheckpointFormat, NamesParseBackAndNothingElse) {
  EXPECT_EQ(ck::parseStepDirName(ck::stepDirName(40)), 40);
  EXPECT_FALSE(ck::parseStepDirName("step-007"));
  EXPECT_FALSE(ck::parseStepDirName("step-"));
  EXPECT_FALSE(ck::parseStepDirName("step-4x"));
  auto p = ck::parsePartialDirName(ck::partialDirName(12, 345));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->step, 12);
  EXPECT_EQ(p->pid, 345);
  auto m = ck::parseMarkerName(ck::markerName(9, 3));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 9);
  EXPECT_EQ(m->rank, 3);
  EXPECT_FALSE(ck::parseMarkerName(".ddpl-step-9.rank-3.json.tmp.1"));
  EXPECT_TRUE(ck::safeRelativePath("a/b.pt"));
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a"})
    EXPECT_FALSE(ck::safeRelativePath(bad)) << bad;
}

TEST(CheckpointFormat, RecordRoundTripsAndRefusesWhatDoesNotAddUp) {
  ck::CommitRecord r = recordFor(1, 4, "/ckpt/step-8");
  r.step = 8;
  r.files = {{"a.pt", 10}, {"sub/b.pt", 5}};
  r.bytes = 15;
  r.replicated = true;
  ck::CommitRecord back = ck::decodeRecord(ck::encodeRecord(r));
  EXPECT_EQ(back.step, 8);
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.files.size(), 2u);
  EXPECT_TRUE(back.replicated);
  auto refused = [](ck::CommitRecord x, const std::string& word) {
    try {
      ck::decodeRecord(ck::encodeRecord(x));
      ADD_FAILURE() << "accepted a record with " << word;
    } catch (const ddpl::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  auto x = r;
  x.bytes = 16;
  refused(x, "add up");
  x = r;
  x.files[0].path = "../escape";
  refused(x, "unsafe");
  x = r;
  x.rank = 4;
  refused(x, "world size");
  x = r;
  x.durable_path = "relative";
  refused(x, "absolute");
  // Sizes that wrap a 64-bit sum to 0 would pass every budget with 'bytes' 0.
  x = r;
  const uint64_t big = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  x.files = {{"a.pt", big}, {"b.pt", big}, {"c.pt", 2}};
  x.bytes = 0;
  refused(x, "2^63");
  EXPECT_THROW(ck::decodeRecord("[1,2]"), ddpl::InvalidArgument);
  EXPECT_THROW(ck::decodeRecord("{\"version\": 2}"), ddpl::InvalidArgument);
}

// Issue 44: a record is a worker's file or a peer's push. One whose wrong value is a list nested
// 200,000 deep (400 KB, under the record's 4 MiB) was printed into the message recursively and
// overflowed the stack of launch's persister or replica thread: now refused, naming its kind.
TEST(CheckpointFormat, ARecordNestedDeepIsRefusedNotPrinted) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& text :
       {"{\"version\": " + deep + "}",
        R"({"version": 1, "step": 1, "rank": 0, "world_size": 1, "files": [{"path": )" + deep +
            ", \"size\": 1}]}"}) {
    try {
      ck::decodeRecord(text);
      ADD_FAILURE() << "accepted";
    } catch (const ddpl::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("a JSON array"), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 200u);
    }
  }
}

TEST(CheckpointFormat, AgreementIsTheNewestStepEveryRankOffers) {
  EXPECT_EQ(ck::agreeOnStep({{10, 20, 30}, {20, 30}, {30, 10, 20}}), 30);
  // Rank 1 lost its newest (its worker died mid-commit): everyone goes back to 20.
  EXPECT_EQ(ck::agreeOnStep({{10, 20, 30}, {10, 20}, {20, 30}}), 20);
  EXPECT_EQ(ck::agreeOnStep({{10}, {20}}), std::nullopt);
  EXPECT_EQ(ck::agreeOnStep({{}, {20}}), std::nullopt);
  EXPECT_EQ(ck::agreeOnStep({{5}}), 5);
}

TEST(CheckpointFormat, RetentionKeepsTheNewestAndTheBudgetNeverGoesNegative) {
  EXPECT_EQ(ck::stepsToRetire({30, 10, 20, 40}, 2), (std::vector<int64_t>{10, 20}));
  EXPECT_TRUE(ck::stepsToRetire({30, 10}, 2).empty());
  EXPECT_TRUE(ck::stepsToRetire({30, 10, 20}, 0).empty());
  EXPECT_EQ(ck::writeAllowance(100, 30), 70u);
  EXPECT_EQ(ck::writeAllowance(100, 130), 0u);
}

TEST_F(CheckpointFiles, CommitIsTheRenameAndListsTheFilesWithTheirSizes) {
  commit(rank_dir_, 0, 4, {{"model.pt", "abcd"}, {"opt/state.pt", "xy"}}, recordFor(0, 2, ""));
  auto steps = ck::listCommitted(rank_dir_, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 4);
  EXPECT_EQ(steps[0].record.bytes, 6u);
  EXPECT_EQ(steps[0].record.files.size(), 2u);
  EXPECT_EQ(steps[0].record.world_size, 2);
  // A committed step of the same number again (a restarted attempt) replaces the first.
  commit(rank_dir_, 0, 4, {{"model.pt", "abcdef"}}, recordFor(0, 2, ""));
  steps = ck::listCommitted(rank_dir_, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].record.bytes, 6u);
  EXPECT_EQ(steps[0].record.files.size(), 1u);
}

TEST_F(CheckpointFiles, AWriterKilledBeforeItsCommitLeavesNothingThatIsOffered) {
  commit(rank_dir_, 0, 4, {{"model.pt", "good"}}, recordFor(0, 1, ""));
  pid_t child = fork();
  if (child == 0) {
    std::string partial = ck::beginStep(rank_dir_, 8);
    writeFile(partial + "/model.pt", std::string(1000, 'h'));
    _exit(0);  // dies between the write and the commit
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  auto steps = ck::listCommitted(rank_dir_, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 4);
  EXPECT_EQ(ck::rankUsage(rank_dir_).partial, 1000u);
  ck::removePartials(rank_dir_, child);
  EXPECT_EQ(ck::rankUsage(rank_dir_).partial, 0u);
}

TEST_F(CheckpointFiles, TornOrForgedStepsAreNotOffered) {
  std::string torn = commit(rank_dir_, 0, 4, {{"model.pt", "1234"}}, recordFor(0, 1, ""));
  std::string why;
  ASSERT_TRUE(ck::readCommitted(torn, 4, 0, &why)) << why;
  fs::resize_file(torn + "/model.pt", 2);  // cut short after the commit
  EXPECT_FALSE(ck::readCommitted(torn, 4, 0, &why));
  EXPECT_NE(why.find("2 bytes, the record says 4"), std::string::npos) << why;
  // A record moved under another step's name does not count for that step.
  std::string moved = commit(rank_dir_, 0, 8, {{"model.pt", "5678"}}, recordFor(0, 1, ""));
  fs::rename(moved, rank_dir_ + "/step-12");
  EXPECT_FALSE(ck::readCommitted(rank_dir_ + "/step-12", 12, 0, &why));
  EXPECT_NE(why.find("step 8"), std::string::npos) << why;
  // A symlink inside a step is refused at commit.
  std::string partial = ck::beginStep(rank_dir_, 16);
  fs::create_symlink("/etc/passwd", partial + "/model.pt");
  ck::CommitRecord r = recordFor(0, 1, "");
  r.step = 16;
  EXPECT_THROW(ck::commitStep(rank_dir_, partial, r), ddpl::InvalidArgument);
  EXPECT_TRUE(ck::listCommitted(rank_dir_, 0).empty());
}

TEST_F(CheckpointFiles, TrimKeepsTheNewest) {
  for (int64_t s : {4, 8, 12}) commit(rank_dir_, 0, s, {{"m", "x"}}, recordFor(0, 1, ""));
  ck::trimCommitted(rank_dir_, 1);
  auto steps = ck::listCommitted(rank_dir_, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 12);
}

TEST_F(CheckpointFiles, PersistedStepsAreReadableByTheirRankAndRetired) {
  for (int64_t s : {4, 8, 12}) {
    auto r = recordFor(1, 2, durable_ + "/step-" + std::to_string(s));
    r.keep = 2;
    std::string step_dir = commit(rank_dir_, 1, s, {{"shard-1.pt", "s" + std::to_string(s)}}, r);
    auto rec = ck::readCommitted(step_dir, s, 1);
    ASSERT_TRUE(rec);
    EXPECT_EQ(ck::persistStep(step_dir, *rec, false), rec->bytes);
    ck::retireDurable(ck::durableRoot(*rec), 1, rec->keep);
  }
  auto on_disk = ck::listDurable(durable_, 1);
  ASSERT_EQ(on_disk.size(), 2u);
  EXPECT_EQ(on_disk[0].step, 12);
  EXPECT_EQ(readFile(durable_ + "/step-12/shard-1.pt"), "s12");
  EXPECT_FALSE(fs::exists(durable_ + "/step-4"));
  // Not replicated: rank 0 cannot read rank 1's steps.
  EXPECT_TRUE(ck::listDurable(durable_, 0).empty());
  // A file lost on disk: that step is no longer offered.
  fs::remove(durable_ + "/step-12/shard-1.pt");
  on_disk = ck::listDurable(durable_, 1);
  ASSERT_EQ(on_disk.size(), 1u);
  EXPECT_EQ(on_disk[0].step, 8);
}

// Issue 46: persisting a step again (a restarted attempt committed it anew) removes the earlier
// attempt's marker before it replaces the files, as the Python module's disk writer does: a copy
// that stops halfway leaves no marker over a mixture of the two attempts' files.
TEST_F(CheckpointFiles, APersistThatStopsHalfwayLeavesNoMarkerOverMixedFiles) {
  const std::string target = durable_ + "/step-5";
  auto r = recordFor(0, 1, target);
  std::string first = commit(rank_dir_, 0, 5, {{"a.pt", "AAAA"}, {"z.pt", "ZZZZ"}}, r);
  ck::persistStep(first, *ck::readCommitted(first, 5, 0), false);
  ASSERT_EQ(steps(ck::listDurable(durable_, 0)), std::vector<int64_t>{5});
  // The second attempt's files: a.pt of the same size, then sub/b.pt, which cannot be placed (a
  // file stands where its directory goes): the copy stops after a.pt.
  std::string second = commit(rank_dir_, 0, 5, {{"a.pt", "aaaa"}, {"sub/b.pt", "b"}}, r);
  writeFile(target + "/sub", "in the way");
  EXPECT_THROW(ck::persistStep(second, *ck::readCommitted(second, 5, 0), false), ddpl::Error);
  EXPECT_EQ(readFile(target + "/a.pt"), "aaaa");
  EXPECT_TRUE(ck::listDurable(durable_, 0).empty());  // not the first attempt's marker over it
}

TEST_F(CheckpointFiles, AReplicatedStepOfRankZeroServesEveryRank) {
  auto r = recordFor(0, 4, durable_);
  r.replicated = true;
  std::string step_dir = commit(rank_dir_, 0, 6, {{"ckpt-step6.pt", "state"}}, r);
  ck::persistStep(step_dir, *ck::readCommitted(step_dir, 6, 0), false);
  EXPECT_EQ(readFile(durable_ + "/ckpt-step6.pt"), "state");  // flat: the user's own names
  for (int64_t rank : {0, 1, 3}) {
    auto steps = ck::listDurable(durable_, rank);
    ASSERT_EQ(steps.size(), 1u) << rank;
    EXPECT_EQ(steps[0].step, 6);
  }
}

class Tier : public CheckpointFiles {
 protected:
  MemoryTierOptions options() {
    MemoryTierOptions o;
    o.budget_per_rank = 1 << 20;
    o.base = dir_;
    o.durable_dir = durable_;
    return o;
  }
};

TEST_F(Tier, PersistsCommitsInTheBackgroundAndRemovesItsRootAtTheEnd) {
  std::string root;
  {
    MemoryTier tier(options());
    root = tier.root();
    auto env = tier.startGroup({2, 3});
    EXPECT_EQ(env[ck::kMemoryEnv], root);
    EXPECT_EQ(env[ck::kBudgetEnv], std::to_string(1 << 20));
    EXPECT_EQ(env[ck::kDirEnv], durable_);
    // The worker's first write makes the root and its rank's directory; the next tick watches.
    ck::makeRankDir(root, 3);
    struct stat st {};
    ASSERT_EQ(lstat(root.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    auto r = recordFor(3, 4, durable_ + "/step-5");
    commit(root + "/rank-3", 3, 5, {{"w.pt", "weights"}}, r);
    tier.tick();
    ASSERT_TRUE(
        eventually([&] { return fs::exists(durable_ + "/step-5/" + ck::markerName(5, 3)); }));
    EXPECT_EQ(readFile(durable_ + "/step-5/w.pt"), "weights");
    // A step committed with persist=false stays in memory only, until its worker dies.
    r = recordFor(3, 4, durable_ + "/step-6");
    r.persist = false;
    commit(root + "/rank-3", 3, 6, {{"w.pt", "newer"}}, r);
    ASSERT_EQ(tier.status().size(), 1u);  // rank 2 never wrote
    EXPECT_TRUE(eventually([&] {
      for (const auto& s : tier.status())
        if (s.rank == 3) return s.newest_step == 6 && s.persisted_step == 5;
      return false;
    }));
    EXPECT_FALSE(fs::exists(durable_ + "/step-6"));
    // The worker dies mid-write of step 7: its partial goes, step 6 is persisted first.
    std::string partial = root + "/rank-3/" + ck::partialDirName(7, 4242);
    fs::create_directories(partial);
    writeFile(partial + "/w.pt", "half");
    tier.onWorkerExit(3, 4242);
    EXPECT_FALSE(fs::exists(partial));
    ASSERT_TRUE(
        eventually([&] { return fs::exists(durable_ + "/step-6/" + ck::markerName(6, 3)); }));
    EXPECT_EQ(readFile(durable_ + "/step-6/w.pt"), "newer");
    ASSERT_TRUE(eventually([&] {
      for (const auto& s : tier.status())
        if (s.rank == 3) return s.persisted_step == 6;
      return false;
    }));
    EXPECT_EQ(tier.drain(10), "");  // everything already on disk
  }
  EXPECT_FALSE(fs::exists(root));
}

TEST_F(Tier, DrainPersistsTheNewestAndADiskThatRefusesKeepsTheMemory) {
  std::string root;
  {
    MemoryTier tier(options());
    root = tier.root();
    tier.startGroup({0});
    // Its durable place is under a regular file: every write there fails (ENOTDIR).
    writeFile(dir_ + "/not-a-dir", "x");
    auto r = recordFor(0, 1, dir_ + "/not-a-dir/step-3");
    commit(ck::makeRankDir(root, 0), 0, 3, {{"w.pt", "w"}}, r);
    tier.tick();
    ASSERT_TRUE(eventually([&] { return !tier.status()[0].error.empty(); }));
    std::string line = tier.drain(5);
    EXPECT_NE(line.find("not persisted"), std::string::npos) << line;
    EXPECT_NE(line.find("rank 0 step 3"), std::string::npos) << line;
    EXPECT_NE(line.find(root), std::string::npos) << line;
  }
  // Not on disk, so not deleted: the line named where it is.
  EXPECT_TRUE(fs::exists(root + "/rank-0/step-3/w.pt"));
  fs::remove_all(root);
}

TEST_F(Tier, RanksThatLeaveTheNodeArePersistedThenRemoved) {
  MemoryTier tier(options());
  tier.startGroup({0, 1});
  auto r = recordFor(1, 2, durable_ + "/step-2");
  r.persist = false;
  // Committed after the last tick: the next group's start finds it.
  commit(ck::makeRankDir(tier.root(), 1), 1, 2, {{"w.pt", "w1"}}, r);
  tier.startGroup({0});  // re-formed: rank 1 is elsewhere now
  ASSERT_TRUE(eventually([&] { return !fs::exists(tier.root() + "/rank-1"); }));
  EXPECT_EQ(readFile(durable_ + "/step-2/w.pt"), "w1");
}

TEST(CheckpointFlags, SizesParse) {
  using ddpl::launcher::cli::parseSize;
  EXPECT_EQ(parseSize("--checkpoint-memory", "0"), 0u);
  EXPECT_EQ(parseSize("--checkpoint-memory", "512M"), 512ull << 20);
  EXPECT_EQ(parseSize("--checkpoint-memory", "4G"), 4ull << 30);
  EXPECT_EQ(parseSize("--checkpoint-memory", "1.5GiB"), 3ull << 29);
  EXPECT_EQ(parseSize("--checkpoint-memory", "100kb"), 100ull << 10);
  for (const char* bad : {"", "M", "-1G", "4X", "1e30"})
    EXPECT_THROW(parseSize("--checkpoint-memory", bad), ddpl::UsageError) << bad;
}

}  // namespace

namespace {

using ddpl::launcher::ReplicaEndpoint;
using ddpl::launcher::ReplicaServer;

TEST_F(CheckpointFiles, ReplicaPushListGetRoundTripAndRefusals) {
  ReplicaServer server(dir_ + "/replicas", /*budget_per_rank=*/1000, /*total=*/3000, /*keep=*/1);
  ReplicaEndpoint to{"127.0.0.1", server.port(), server.secret()};
  ASSERT_EQ(ddpl::launcher::parseEndpoint(ddpl::launcher::encodeEndpoint(to))->port, to.port);
  std::string step_dir =
      commit(rank_dir_, 0, 6, {{"w.pt", "weights"}, {"sub/o.pt", "opt"}}, recordFor(0, 2, ""));
  ddpl::launcher::pushStep(to, step_dir, *ck::readCommitted(step_dir, 6, 0), 10);
  EXPECT_EQ(ddpl::launcher::listSteps(to, 0, 2, 10), (std::vector<int64_t>{6}));
  EXPECT_TRUE(ddpl::launcher::listSteps(to, 0, 4, 10).empty());  // another world size
  // A replacement node fetches it as a committed step of its own, marked as a peer's copy.
  std::string fresh = dir_ + "/other/rank-0";
  fs::create_directories(fresh);
  EXPECT_EQ(ddpl::launcher::fetchStep(to, 0, 6, fresh, 10), 10u);
  auto got = ck::listCommitted(fresh, 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(readFile(got[0].dir + "/sub/o.pt"), "opt");
  EXPECT_TRUE(fs::exists(got[0].dir + "/" + ddpl::launcher::kOriginFile));
  // Refused, saying why, and nothing stored: a wrong secret, a step over the budget, a GET of
  // a step it does not hold.
  ReplicaEndpoint wrong = to;
  wrong.secret = std::string(32, '0');
  try {
    ddpl::launcher::listSteps(wrong, 0, 2, 10);
    ADD_FAILURE() << "a wrong secret was served";
  } catch (const ddpl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("wrong secret"), std::string::npos) << e.what();
  }
  std::string big =
      commit(rank_dir_, 0, 9, {{"w.pt", std::string(1500, 'x')}}, recordFor(0, 2, ""));
  try {
    ddpl::launcher::pushStep(to, big, *ck::readCommitted(big, 9, 0), 10);
    ADD_FAILURE() << "a step over the budget was taken";
  } catch (const ddpl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("1500 bytes, over the 1000"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ddpl::launcher::listSteps(to, 0, 2, 10), (std::vector<int64_t>{6}));
  EXPECT_THROW(ddpl::launcher::fetchStep(to, 0, 7, fresh, 10), ddpl::Error);
}

// Issue 48: a node cut off for 20 s re-joined with its memory as old as its leaving, and the
// job resumed ~110 steps back (the newest step every rank offered): only a node with nothing in
// memory fetched the peers' copies. Now a node fetches any step newer than its own.
TEST_F(Tier, ANodeWithOlderStepsFetchesThePeersNewerOneAndNothingOlder) {
  ReplicaServer newer(dir_ + "/replicas-newer", 1000, 3000, 1);
  ReplicaServer older(dir_ + "/replicas-older", 1000, 3000, 1);
  ReplicaEndpoint at_newer{"127.0.0.1", newer.port(), newer.secret()};
  ReplicaEndpoint at_older{"127.0.0.1", older.port(), older.secret()};
  std::string peer_dir = dir_ + "/peer/rank-0";
  fs::create_directories(peer_dir);
  auto push = [&](const ReplicaEndpoint& to, int64_t step, const std::string& bytes) {
    std::string d = commit(peer_dir, 0, step, {{"w.pt", bytes}}, recordFor(0, 2, ""));
    ddpl::launcher::pushStep(to, d, *ck::readCommitted(d, step, 0), 10);
  };
  push(at_older, 2, "two");
  push(at_newer, 8, "eight");
  MemoryTier tier(options());
  tier.startGroup({0});
  std::string mine = ck::makeRankDir(tier.root(), 0);
  commit(mine, 0, 3, {{"w.pt", "three"}}, recordFor(0, 2, ""));
  ASSERT_FALSE(tier.missing({0}, 2));  // what the old rule asked: it fetched nothing here

  auto lines = tier.pullNewer({0}, 2, {at_older, at_newer}, 10);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(
      lines[0].find("step 8 copied from the replica on 127.0.0.1:" + std::to_string(newer.port())),
      std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("step 3 here"), std::string::npos) << lines[0];
  EXPECT_EQ(steps(ck::listCommitted(mine, 0)), (std::vector<int64_t>{8, 3}));  // newest first
  EXPECT_EQ(readFile(mine + "/" + ck::stepDirName(8) + "/w.pt"), "eight");
  // Now the newest is here: nothing to fetch, and nothing older ever replaces it.
  EXPECT_TRUE(tier.pullNewer({0}, 2, {at_older, at_newer}, 10).empty());
  // Another world size's steps are not this one's.
  EXPECT_TRUE(tier.pullNewer({0}, 4, {at_older, at_newer}, 10).empty());
}

// Issue 48: a push to a successor that stopped answering (cut off mid-push) waited out its 60 s
// timeout on the persister's thread, and nothing was persisted meanwhile: the chaos soak's job
// resumed 111 steps back. The copies now have a thread of their own; the persister goes on,
// and the end abandons the push instead of waiting for it.
TEST_F(Tier, APeerThatStopsAnsweringHoldsNeitherPersistenceNorTheEnd) {
  // A peer that takes connections (the kernel's backlog) and never answers one.
  int port = 0;
  int silent = ddpl::testing::listenLoopback(&port);
  ASSERT_GE(silent, 0);
  ReplicaEndpoint black_hole{"127.0.0.1", port, std::string(32, 'a')};
  auto start_end = std::chrono::steady_clock::now();
  {
    MemoryTier tier(options());
    tier.startGroup({0});
    tier.setSuccessorLookup([&]() -> std::optional<ReplicaEndpoint> { return black_hole; });
    std::string mine = ck::makeRankDir(tier.root(), 0);
    commit(mine, 0, 1, {{"w.pt", "one"}}, recordFor(0, 1, durable_ + "/step-1"));
    tier.tick();
    ASSERT_TRUE(
        eventually([&] { return fs::exists(durable_ + "/step-1/" + ck::markerName(1, 0)); }));
    // The push of step 1 (or 2) now waits for an answer that never comes; step 2 is persisted
    // all the same.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    commit(mine, 0, 2, {{"w.pt", "two"}}, recordFor(0, 1, durable_ + "/step-2"));
    auto committed = std::chrono::steady_clock::now();
    ASSERT_TRUE(eventually([&] {
      return fs::exists(durable_ + "/step-2/" + ck::markerName(2, 0));
    })) << "step 2 not persisted while a push to a silent peer was in flight";
    EXPECT_LT(std::chrono::steady_clock::now() - committed, std::chrono::seconds(5));
    start_end = std::chrono::steady_clock::now();
  }
  // The end did not wait out the push's 60 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start_end, std::chrono::seconds(5));
  close(silent);
}

// Issue 44 (fuzz_replica): a peer's answer to GET is "OK <record bytes>". A bare "OK" made
// std::stoul throw std::out_of_range, "OK x" std::invalid_argument: neither a ddpl::Error, nor a
// message that names the peer. Now both are refused as malformed answers from that peer.
TEST(Replica, AnAnswerWithoutItsRecordSizeIsRefusedNamingThePeer) {
  int port = 0;
  int listener = ddpl::testing::listenLoopback(&port);
  ASSERT_GE(listener, 0);
  ReplicaEndpoint peer{"127.0.0.1", port, std::string(32, 'a')};
  std::string dir = ddpl::testing::makeTempDir("replica_answer") + "/rank-0";
  for (const std::string answer : {"OK\n", "OK x\n", "OK 12x\n", "OK \n"}) {
    std::thread serve([&] {
      int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      char ch;
      while (recv(c, &ch, 1, 0) == 1 && ch != '\n') {
      }
      (void)!send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(c);
    });
    try {
      ddpl::launcher::fetchStep(peer, 0, 7, dir, 5);
      ADD_FAILURE() << "took " << answer;
    } catch (const ddpl::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("without its record's size"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(peer.describe()), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "for " << answer << ": " << e.what();
    }
    serve.join();
  }
  close(listener);
}

// The replica endpoint listens on every interface and reads a request before it knows the
// secret: connections that send nothing, or a byte now and then, must not hold it. The server
// used to serve one connection to its end at a time, with 30 s per read: the first idle one
// held it past the real client's 3 s.
TEST_F(CheckpointFiles, ReplicaServerIsNotHeldByConnectionsThatSendNothing) {
  ReplicaServer server(dir_ + "/replicas", 1000, 3000, 1);
  ReplicaEndpoint to{"127.0.0.1", server.port(), server.secret()};
  auto connectRaw = [&] {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(to.port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(connectRaw());  // past the 32 kept waiting
  int dribbler = connectRaw();
  ASSERT_EQ(send(dribbler, "DDPL", 4, MSG_NOSIGNAL), 4);
  std::string step_dir = commit(rank_dir_, 0, 6, {{"w.pt", "weights"}}, recordFor(0, 2, ""));
  ddpl::launcher::pushStep(to, step_dir, *ck::readCommitted(step_dir, 6, 0), 3);
  EXPECT_EQ(ddpl::launcher::listSteps(to, 0, 2, 3), (std::vector<int64_t>{6}));
  // A line that never ends is cut at its limit.
  int longline = connectRaw();
  std::string junk(600, 'x');
  ASSERT_EQ(send(longline, junk.data(), junk.size(), MSG_NOSIGNAL), 600);
  char buf[256] = {0};
  timeval tv{5, 0};
  setsockopt(longline, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ASSERT_GT(recv(longline, buf, sizeof(buf) - 1, 0), 0);
  EXPECT_NE(std::string(buf).find("ERR a request line over 512 bytes"), std::string::npos) << buf;
  // The dribbler's 5 s run out; the oldest idle ones went for newer ones before that.
  setsockopt(dribbler, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char why[256] = {0};
  ASSERT_GT(recv(dribbler, why, sizeof(why) - 1, 0), 0);
  EXPECT_NE(std::string(why).find("ERR no request within 5 s of connecting"), std::string::npos)
      << why;
  char first[256] = {0};
  setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ASSERT_GT(recv(idle[0], first, sizeof(first) - 1, 0), 0);
  EXPECT_NE(std::string(first).find("ERR closed for a newer connection: 32 were waiting"),
            std::string::npos)
      << first;
  for (int fd : idle) close(fd);
  close(dribbler);
  close(longline);
}

}  // namespace

namespace {

// A launch SIGKILLed with its watchdog leaves its root; the next launch removes it when it
// holds nothing, never one with a checkpoint in it or a live launch's.
TEST_F(Tier, EmptyRootsOfDeadLaunchesAreSweptOthersStay) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead = dir_ + "/ddpl-ckpt-" + std::to_string(child) + "-abc123";
  const std::string kept = dir_ + "/ddpl-ckpt-" + std::to_string(child) + "-def456";
  const std::string live = dir_ + "/ddpl-ckpt-" + std::to_string(getpid()) + "-ghi789";
  for (const auto& d : {dead, kept, live}) fs::create_directories(d + "/rank-0");
  writeFile(kept + "/rank-0/step-4/w.pt", "unpersisted");
  {
    MemoryTier tier(options());
    EXPECT_NE(tier.root().find("/ddpl-ckpt-" + std::to_string(getpid()) + "-"), std::string::npos);
    tier.startGroup({0});
    tier.tick();
    EXPECT_TRUE(fs::exists(dead));  // nothing runs before a worker writes
    ck::makeRankDir(tier.root(), 0);
    tier.tick();  // the persister sweeps when it starts
    EXPECT_TRUE(eventually([&] { return !fs::exists(dead); }));
    EXPECT_TRUE(fs::exists(kept + "/rank-0/step-4/w.pt"));
    EXPECT_TRUE(fs::exists(live));
  }
}

int countTasks(const std::string& comm = "") {
  int n = 0;
  for (const auto& t : fs::directory_iterator("/proc/self/task"))
    if (comm.empty() || readFile(t.path().string() + "/comm") == comm + "\n") ++n;
  return n;
}

int countInotifyFds() {
  int n = 0;
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator("/proc/self/fd"))
    if (fs::read_symlink(fd.path(), ec) == "anon_inode:inotify") ++n;
  return n;
}

// Issue 44: the root, its inotify watches and the persister thread made every start ~16 ms
// slower, most of it at the exit, where closing an inotify descriptor that held watches waits
// for an SRCU grace period. A job that never writes now has none of them: no directory, no
// descriptor, no thread, nothing for the drain or the destructor to wait on. The first write
// starts them all (checked here as well, so that the looks above could see them).
TEST_F(Tier, NothingRunsUntilAWorkerWritesAndThenAllOfIt) {
  const int tasks = countTasks(), inotify = countInotifyFds();
  std::string root;
  {
    MemoryTier tier(options());
    root = tier.root();
    tier.startGroup({0, 1});
    for (int i = 0; i < 3; ++i) tier.tick();
    tier.onWorkerExit(1, 4242);
    tier.startGroup({0, 1});  // a restart
    EXPECT_FALSE(fs::exists(root));
    EXPECT_EQ(countTasks(), tasks);
    EXPECT_EQ(countInotifyFds(), inotify);
    EXPECT_TRUE(tier.status().empty());
    EXPECT_EQ(tier.drain(10), "");
    EXPECT_FALSE(fs::exists(root));
  }
  {
    MemoryTier tier(options());
    root = tier.root();
    tier.startGroup({0});
    commit(ck::makeRankDir(root, 0), 0, 1, {{"w.pt", "w"}}, recordFor(0, 1, durable_ + "/step-1"));
    tier.tick();
    EXPECT_EQ(countTasks("ckpt-persister"), 1);
    EXPECT_EQ(countInotifyFds(), inotify + 1);
    ASSERT_TRUE(
        eventually([&] { return fs::exists(durable_ + "/step-1/" + ck::markerName(1, 0)); }));
  }
  EXPECT_FALSE(fs::exists(root));
  EXPECT_EQ(countTasks(), tasks);
}

// A rank's worker commits and dies between two ticks: its exit finds the step (its partial of
// the next goes), and a commit right before the end is persisted by the drain.
TEST_F(Tier, ACommitBetweenTicksIsFoundAtTheWorkersExitAndAtTheEnd) {
  MemoryTier tier(options());
  tier.startGroup({0, 1});
  const std::string rank0 = ck::makeRankDir(tier.root(), 0);
  commit(rank0, 0, 2, {{"w.pt", "w2"}}, recordFor(0, 2, durable_ + "/step-2"));
  std::string partial = rank0 + "/" + ck::partialDirName(3, 4242);
  fs::create_directories(partial);
  tier.onWorkerExit(0, 4242);
  EXPECT_FALSE(fs::exists(partial));
  ASSERT_TRUE(eventually([&] { return fs::exists(durable_ + "/step-2/" + ck::markerName(2, 0)); }));
  // Rank 1 writes its first step after the watching started and just before the end.
  commit(ck::makeRankDir(tier.root(), 1), 1, 5, {{"w.pt", "w5"}},
         recordFor(1, 2, durable_ + "/step-5"));
  std::string line = tier.drain(10);
  EXPECT_EQ(line.find("not persisted"), std::string::npos) << line;
  EXPECT_EQ(readFile(durable_ + "/step-5/w.pt"), "w5");
}

TEST_F(Tier, ARootAnotherUserMadeFirstIsNeverWrittenInto) {
  MemoryTier tier(options());
  fs::create_directories(tier.root());
  fs::permissions(tier.root(),
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  EXPECT_THROW(ck::makeRankDir(tier.root(), 0), ddpl::Error);
  ASSERT_EQ(chmod(tier.root().c_str(), 0700), 0);
  const std::string elsewhere = dir_ + "/elsewhere";
  fs::create_directories(elsewhere);
  const std::string link = dir_ + "/link-root";
  fs::create_symlink(elsewhere, link);
  EXPECT_THROW(ck::makePrivateDir(link), ddpl::Error);
  if (geteuid() == 0) {  // a directory of nobody's under the name
    const std::string foreign = dir_ + "/foreign";
    fs::create_directories(foreign);
    ASSERT_EQ(chmod(foreign.c_str(), 0700), 0);
    ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
    EXPECT_THROW(ck::makeRankDir(foreign, 0), ddpl::Error);
  }
}

}  // namespace

// The fence (docs/network-faults.md): a write from a round older than the newest that committed
// to a directory is refused, naming both; another run's fence, or no token, refuses nothing.
TEST(CheckpointFence, OlderEpochOrRoundOfTheSameRunIsRefused) {
  ck::FenceToken newest{"job", 1000, 4};
  EXPECT_TRUE(ck::fenceRefuses(newest, {"job", 1000, 3}));
  EXPECT_TRUE(ck::fenceRefuses(newest, {"job", 999, 9}));  // a restarted server counts anew
  EXPECT_FALSE(ck::fenceRefuses(newest, {"job", 1000, 4}));
  EXPECT_FALSE(ck::fenceRefuses(newest, {"job", 1001, 0}));
  EXPECT_FALSE(ck::fenceRefuses(newest, {"other", 1000, 0}));  // a new job into the directory
  EXPECT_FALSE(ck::fenceRefuses(newest, {"job", 0, 0}));       // no epoch: nothing to fence
  auto back = ck::decodeFence(ck::encodeFence(newest));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->run_id, "job");
  EXPECT_EQ(back->epoch, 1000);
  EXPECT_EQ(back->round, 4);
  EXPECT_FALSE(ck::decodeFence(""));
  EXPECT_FALSE(ck::decodeFence("{\"run_id\": 1, \"epoch\": 2, \"round\": 3}"));
  EXPECT_FALSE(ck::decodeFence("{\"run_id\": \"j\", \"epoch\": -2, \"round\": 3}"));
  EXPECT_FALSE(ck::decodeFence(std::string(ck::kMaxFenceBytes + 1, ' ')));
}

TEST_F(CheckpointFiles, StaleRoundCannotCommitOrPersistAfterANewerOne) {
  ck::CommitRecord newer = recordFor(0, 1, durable_ + "/step-6");
  newer.writer = {"job", 1000, 5};
  std::string committed = commit(rank_dir_, 0, 6, {{"a", "new"}}, newer);
  newer = *ck::readCommitted(committed, 6, 0);
  EXPECT_EQ(newer.writer.round, 5);  // the record carries its writer
  ck::persistStep(committed, newer, false);

  ck::CommitRecord stale = recordFor(0, 1, durable_ + "/step-7");
  stale.writer = {"job", 1000, 4};
  try {
    commit(rank_dir_, 0, 7, {{"a", "old"}}, stale);
    FAIL() << "a commit from round 4 after round 5 committed must be refused";
  } catch (const ck::StaleRoundError& e) {
    EXPECT_NE(std::string(e.what()).find("round 4 (epoch 1000) of run 'job'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("round 5 (epoch 1000)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(rank_dir_ + "/step-7"));
  // The agent persisting a stale round's step that did reach memory (committed before the
  // fence moved there) is refused on the durable side too, and nothing of it lands.
  std::string other = dir_ + "/mem2/rank-0";
  fs::create_directories(other);
  stale.step = 7;
  std::string stale_dir = commit(other, 0, 7, {{"a", "old"}}, stale);
  stale = *ck::readCommitted(stale_dir, 7, 0);
  EXPECT_THROW(ck::persistStep(stale_dir, stale, false), ck::StaleRoundError);
  EXPECT_FALSE(fs::exists(durable_ + "/step-7"));
  EXPECT_EQ(readFile(durable_ + "/step-6/a"), "new");
  // A later round, and another job, write on.
  ck::CommitRecord later = recordFor(0, 1, durable_ + "/step-8");
  later.writer = {"job", 1000, 6};
  EXPECT_NO_THROW(commit(rank_dir_, 0, 8, {{"a", "later"}}, later));
  ck::CommitRecord job2 = recordFor(0, 1, durable_ + "/step-1");
  job2.writer = {"job2", 900, 0};
  EXPECT_NO_THROW(commit(rank_dir_, 0, 1, {{"a", "2"}}, job2));
}

TEST_F(CheckpointFiles, FenceFileIsNotFollowedThroughASymlink) {
  fs::create_symlink(dir_ + "/elsewhere", rank_dir_ + "/" + ck::kFenceName);
  ck::CommitRecord r = recordFor(0, 1, "");
  r.writer = {"job", 1000, 1};
  EXPECT_THROW(commit(rank_dir_, 0, 1, {{"a", "x"}}, r), ddpl::Error);
  EXPECT_FALSE(fs::exists(dir_ + "/elsewhere"));
}
