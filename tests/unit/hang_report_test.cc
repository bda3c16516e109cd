// Issue 48: the hang report's reading of the ranks' stacks and flight recorders
// (launcher/health/hang_report.h, flight_recorder.h), without processes; and the recorder's
// socket and the program's frames against real sockets and files.
#include "launcher/health/hang_report.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/health/flight_recorder.h"
#include "tests/common/subprocess.h"

namespace ddpl::launcher {
namespace {

const char kAllReduce[] = "all_reduce (torch/distributed/distributed_c10d.py:2942)";
const char kWrapper[] = "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:81)";

StackFrame own(const std::string& text, const std::string& source = "") {
  return StackFrame{text, true, source};
}
StackFrame lib(const std::string& text) { return StackFrame{text, false, ""}; }

// A rank waiting in all_reduce, called from train.py:41.
StackSummary inAllReduce(const std::string& c10d_line = "2942") {
  StackSummary s;
  s.frames = {lib("all_reduce (torch/distributed/distributed_c10d.py:" + c10d_line + ")"),
              lib(kWrapper), own("main (train.py:41)", "dist.all_reduce(t)"),
              own("<module> (train.py:60)")};
  return s;
}
StackSummary inBarrier() {
  StackSummary s;
  s.frames = {lib("barrier (torch/distributed/distributed_c10d.py:4888)"), lib(kWrapper),
              own("main (train.py:44)", "dist.barrier()"), own("<module> (train.py:60)")};
  return s;
}
StackSummary sleeping(int line = 57) {
  StackSummary s;
  s.frames = {own("main (train.py:" + std::to_string(line) + ")", "time.sleep(60)"),
              own("<module> (train.py:60)")};
  return s;
}

// torch 2.9.1's dump of a Gloo rank (c10d::dump_fr_trace_json's layout, cut to what is read)
// whose newest collective of the default group is `newest`, an `op` with `sizes`.
std::string dump(uint64_t newest, const std::string& op = "all_reduce",
                 const std::string& sizes = "[[4]]", const std::string& more_status = "") {
  std::string entries;
  for (uint64_t s = newest > 2 ? newest - 2 : 1; s <= newest; ++s)
    entries += std::string(entries.empty() ? "" : ",") +
               "{\"collective_seq_id\":" + std::to_string(s) +
               ",\"input_sizes\":" + (s == newest ? sizes : "[[4]]") +
               ",\"is_p2p\":false,\"op_id\":" + std::to_string(s) +
               ",\"pg_id\":0,\"process_group\":[\"0\",\"default_pg\"],\"profiling_name\":\"gloo:" +
               (s == newest ? op : "all_reduce") + "\",\"state\":\"scheduled\"}";
  return "{\"pid\":7,\"fr\":{\"entries\":[" + entries +
         "],\"pg_config\":{\"\":{\"desc\":\"\",\"name\":\"\",\"ranks\":\"[]\"}},"
         "\"pg_status\":{\"0\":{\"last_completed_collective\":\"" +
         std::to_string(newest - 1) + "\",\"last_enqueued_collective\":\"" +
         std::to_string(newest) + "\",\"last_started_collective\":\"-1\"}" + more_status +
         "},\"version\":\"2.10\"},\"nccl\":{\"pg_config\":{},\"pg_status\":{},\"version\":\"2.10\"}"
         ","
         "\"error\":\"\"}";
}

RankEvidence rank(int r, StackSummary s, std::optional<std::string> fr = std::nullopt) {
  RankEvidence e;
  e.global_rank = r;
  e.local_rank = r;
  e.stack = std::move(s);
  if (fr) e.fr = parseFlightRecord(*fr);
  return e;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(FlightRecord, ReadsTorchsDumpPerGroupAndKeepsNcclApart) {
  FlightRecord r = parseFlightRecord(dump(21, "all_reduce", "[[256, 256]]"));
  ASSERT_TRUE(r.answered) << r.error;
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.last_enqueued, (std::map<std::string, uint64_t>{{"0", 21}}));
  ASSERT_EQ(r.entries.size(), 3u);
  const FlightEntry* e = r.find("0", 21);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->op, "all_reduce");
  EXPECT_EQ(e->backend, "gloo");
  EXPECT_EQ(e->sizes, "[[256,256]]");
  EXPECT_EQ(e->group_name, "default_pg");
  EXPECT_EQ(r.find("0", 22), nullptr);
  EXPECT_EQ(r.find("1", 21), nullptr);
  // A subgroup ("undefined" description: named by its id) and NCCL's recorder beside Gloo's.
  FlightRecord two = parseFlightRecord(
      "{\"fr\":{\"entries\":[{\"collective_seq_id\":1,\"pg_id\":1,\"process_group\":[\"1\","
      "\"undefined\"],\"profiling_name\":\"gloo:broadcast\",\"input_sizes\":[[5]]}],"
      "\"pg_status\":{\"1\":{\"last_enqueued_collective\":\"1\"}}},\"nccl\":{\"entries\":[{"
      "\"collective_seq_id\":9,\"pg_id\":1,\"profiling_name\":\"nccl:all_gather\"}],"
      "\"pg_status\":{\"1\":{\"last_enqueued_collective\":\"9\"}}},\"error\":\"\"}");
  EXPECT_EQ(two.last_enqueued, (std::map<std::string, uint64_t>{{"1", 1}, {"nccl/1", 9}}));
  ASSERT_NE(two.find("1", 1), nullptr);
  EXPECT_EQ(two.find("1", 1)->group_name, "pg 1");
  ASSERT_NE(two.find("nccl/1", 9), nullptr);
  EXPECT_EQ(two.find("nccl/1", 9)->backend, "nccl");
}

TEST(FlightRecord, MalformedDeepOrOutOfRangeAnswersAreNotTrusted) {
  for (const std::string& bad :
       std::vector<std::string>{"", "not json", "[1,2]", "{\"fr\":" + std::string(100, '[')})
    EXPECT_FALSE(parseFlightRecord(bad).answered) << bad;
  EXPECT_TRUE(has(parseFlightRecord("{oops").error, "unreadable answer (5 bytes)"));
  // Numbers that are no sequence numbers are left out, not wrapped or guessed.
  FlightRecord r = parseFlightRecord(
      "{\"fr\":{\"pg_status\":{\"0\":{\"last_enqueued_collective\":\"-1\"},"
      "\"1\":{\"last_enqueued_collective\":\"99999999999999999999\"},"
      "\"2\":{\"last_enqueued_collective\":\"12x\"},\"3\":{\"last_enqueued_collective\":7}},"
      "\"entries\":[{\"collective_seq_id\":-4,\"pg_id\":0},{\"collective_seq_id\":1.5,\"pg_id\":0}]"
      "}}");
  EXPECT_TRUE(r.answered);
  EXPECT_EQ(r.last_enqueued, (std::map<std::string, uint64_t>{{"3", 7}}));
  EXPECT_TRUE(r.entries.empty());
  // A rank whose torch records nothing (TORCH_FR_BUFFER_SIZE=0) says so.
  EXPECT_TRUE(has(parseFlightRecord("{\"fr\":{\"pg_status\":{}},\"error\":\"\"}").error,
                  "no collective recorded"));
  EXPECT_EQ(parseFlightRecord("{\"fr\":null,\"error\":\"torch.distributed is not loaded\"}").error,
            "torch.distributed is not loaded");
}

TEST(HangReport, TheRankThatNeverEnteredTheCollectiveIsNamedWithItsNumber) {
  auto report =
      analyzeHang({rank(0, inAllReduce(), dump(21)), rank(1, inAllReduce("2950"), dump(21)),
                   rank(2, sleeping(), dump(20)), rank(3, inAllReduce(), dump(21))});
  EXPECT_EQ(report.culprits, std::vector<int>{2});
  EXPECT_EQ(report.why,
            "never entered all_reduce #21 of default_pg (sizes [[4]]), where ranks 0, 1, 3 wait; "
            "last collective #20 (all_reduce)");
  // Ranks 0, 1 and 3 stand in one place: torch's own line numbers do not tell them apart.
  ASSERT_EQ(report.groups.size(), 2u);
  EXPECT_EQ(report.groups[0],
            "ranks 0, 1, 3 wait in all_reduce #21 of default_pg (sizes [[4]]) at "
            "distributed_c10d.py:2942 <- train.py:41 `dist.all_reduce(t)`");
  EXPECT_EQ(report.groups[1],
            "rank 2 in main (train.py:57) `time.sleep(60)`, last collective #20 (all_reduce)");
  EXPECT_EQ(report.note, "");
}

TEST(HangReport, AnotherOperationAsTheSameCollectiveIsAMismatch) {
  auto report = analyzeHang({rank(0, inAllReduce(), dump(4)), rank(1, inAllReduce(), dump(4)),
                             rank(2, inBarrier(), dump(4, "barrier", "[]"))});
  EXPECT_EQ(report.culprits, std::vector<int>{2});
  EXPECT_EQ(report.why,
            "in barrier #4 of default_pg while ranks 0, 1 are in all_reduce #4 of default_pg: "
            "mismatched collectives");
  ASSERT_EQ(report.groups.size(), 2u);
  EXPECT_EQ(report.groups[1],
            "rank 2 waits in barrier #4 of default_pg at distributed_c10d.py:4888 <- train.py:44 "
            "`dist.barrier()`");
  // Two against two: nobody can say which side is wrong, so nobody is named.
  auto tie = analyzeHang({rank(0, inAllReduce(), dump(4)), rank(1, inAllReduce(), dump(4)),
                          rank(2, inBarrier(), dump(4, "barrier", "[]")),
                          rank(3, inBarrier(), dump(4, "barrier", "[]"))});
  EXPECT_TRUE(tie.culprits.empty()) << tie.why;
  EXPECT_EQ(tie.note,
            "mismatched collectives as #4 of default_pg: ranks 0, 1 in all_reduce, ranks 2, 3 in "
            "barrier");
}

TEST(HangReport, EveryRankInsideTheSameCollectiveNamesNoneAndSaysSo) {
  auto report = analyzeHang({rank(0, inAllReduce(), dump(9)), rank(1, inAllReduce(), dump(9))});
  EXPECT_TRUE(report.culprits.empty()) << report.why;
  EXPECT_EQ(report.groups,
            std::vector<std::string>{"ranks 0, 1 wait in all_reduce #9 of default_pg (sizes "
                                     "[[4]]) at distributed_c10d.py:2942 <- train.py:41 "
                                     "`dist.all_reduce(t)`"});
  EXPECT_TRUE(has(report.note, "every rank that answered entered all_reduce #9 of default_pg"));
}

TEST(HangReport, TwoRanksBehindAreBothNamed) {
  StackSummary lock;
  lock.frames = {own("deadlock (train.py:56)", "fcntl.flock(wanted, fcntl.LOCK_EX)"),
                 own("main (train.py:30)"), own("<module> (train.py:60)")};
  auto report = analyzeHang(
      {rank(0, inAllReduce(), dump(4)), rank(1, lock, dump(3)), rank(2, lock, dump(3))});
  EXPECT_EQ(report.culprits, (std::vector<int>{1, 2}));
  EXPECT_TRUE(has(report.why,
                  "never entered all_reduce #4 of default_pg (sizes [[4]]), where "
                  "rank 0 waits; last collective #3"));
  EXPECT_EQ(report.groups[1],
            "ranks 1, 2 in deadlock (train.py:56) `fcntl.flock(wanted, fcntl.LOCK_EX)`, last "
            "collective #3 (all_reduce)");
}

TEST(HangReport, WithoutTheRecorderTheStacksDecide) {
  // One rank outside any collective while the others wait in one.
  auto outside = analyzeHang({rank(0, inAllReduce()), rank(1, sleeping()), rank(2, inAllReduce())});
  EXPECT_EQ(outside.culprits, std::vector<int>{1});
  EXPECT_EQ(outside.why, "not inside a collective, while ranks 0, 2 wait in all_reduce");
  // One rank in another collective than the others: a mismatch.
  auto other = analyzeHang({rank(0, inAllReduce()), rank(1, inAllReduce()), rank(2, inBarrier())});
  EXPECT_EQ(other.culprits, std::vector<int>{2});
  EXPECT_EQ(other.why, "in barrier, while ranks 0, 1 wait in all_reduce: mismatched collectives");
  // Nobody in a collective, or no stack at all: no culprit.
  EXPECT_TRUE(analyzeHang({rank(0, sleeping()), rank(1, sleeping(58))}).culprits.empty());
  EXPECT_TRUE(analyzeHang({rank(0, StackSummary{}), rank(1, StackSummary{})}).culprits.empty());
  // A rank without a stack is never named, nor a rank where the recorder's answer is missing.
  auto partial = analyzeHang({rank(0, inAllReduce(), dump(5)), rank(1, StackSummary{}),
                              rank(2, sleeping(), std::string("{\"error\":\"x\"}"))});
  EXPECT_EQ(partial.culprits, std::vector<int>{2});
  EXPECT_TRUE(has(partial.why, "all_reduce #5 of default_pg")) << partial.why;
}

TEST(HangReport, AStoppedRankThatCannotAnswerIsNamedBesideTheNumberedCollective) {
  StackSummary stopped = sleeping();
  stopped.frames[0] = own("main (train.py:55)", "os.kill(os.getpid(), signal.SIGSTOP)");
  stopped.stopped = true;
  FlightRecord none;
  none.error = "stopped: it cannot answer";
  RankEvidence r2 = rank(2, stopped);
  r2.fr = none;
  auto report = analyzeHang({rank(0, inAllReduce(), dump(4)), rank(1, inAllReduce(), dump(4)), r2});
  EXPECT_EQ(report.culprits, std::vector<int>{2});
  EXPECT_EQ(report.why,
            "stopped (SIGSTOP or a debugger) outside any collective, while ranks 0, 1 wait in "
            "all_reduce #4 of default_pg");
  EXPECT_EQ(report.groups[1],
            "rank 2 stopped (SIGSTOP or a debugger) in main (train.py:55) `os.kill(os.getpid(), "
            "signal.SIGSTOP)`");
}

TEST(HangReport, ARankInAnotherGroupsCollectiveNeverEnteredTheDefaultGroups) {
  StackSummary bcast;
  bcast.frames = {lib("broadcast (torch/distributed/distributed_c10d.py:2800)"), lib(kWrapper),
                  own("main (train.py:47)")};
  std::string sub =
      ",\"1\":{\"last_enqueued_collective\":\"1\"}";  // rank 2 is in group 1's broadcast #1
  std::string r2 = dump(7, "all_reduce", "[[4]]", sub);
  r2.replace(r2.find("\"entries\":["), 11,
             "\"entries\":[{\"collective_seq_id\":1,\"pg_id\":1,\"process_group\":[\"1\","
             "\"undefined\"],\"profiling_name\":\"gloo:broadcast\",\"input_sizes\":[[5]]},");
  auto report = analyzeHang(
      {rank(0, inAllReduce(), dump(8)), rank(1, inAllReduce(), dump(8)), rank(2, bcast, r2)});
  EXPECT_EQ(report.culprits, std::vector<int>{2});
  EXPECT_TRUE(has(report.why, "never entered all_reduce #8 of default_pg")) << report.why;
  EXPECT_EQ(report.groups[1],
            "rank 2 waits in broadcast #1 of pg 1 (sizes [[5]]) at distributed_c10d.py:2800 <- "
            "train.py:47");
}

TEST(HangReport, TheCollectiveIsTheProgramsCallIntoTheApi) {
  // all_gather_object is what the program called; all_gather is what it waits in inside.
  auto c = collectiveOf(
      {lib("all_gather (torch/distributed/distributed_c10d.py:3700)"), lib(kWrapper),
       lib("all_gather_object (torch/distributed/distributed_c10d.py:3100)"), lib(kWrapper),
       own("gather_metrics (train.py:12)", "dist.all_gather_object(out, m)"),
       own("<module> (train.py:60)")});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->op, "all_gather_object");
  EXPECT_EQ(c->site, "distributed_c10d.py:3100");
  EXPECT_EQ(c->caller, "train.py:12");
  EXPECT_EQ(c->caller_source, "dist.all_gather_object(out, m)");
  // A store wait inside torch.distributed is no collective; a Gloo wait in native frames is.
  EXPECT_FALSE(collectiveOf(
      {lib("get (torch/distributed/elastic/utils/store.py:80)"), own("main (train.py:3)")}));
  EXPECT_FALSE(collectiveOf({lib("#0  0x00007f c10d::TCPStore::get"), lib("#1  0x0 main")}));
  auto native = collectiveOf({lib("#0  0x00007f clock_nanosleep@GLIBC_2.2.5"),
                              lib("#1  0x00007f c10d::ProcessGroupGloo::AsyncWork::wait")});
  ASSERT_TRUE(native.has_value());
  EXPECT_EQ(native->op, "");
}

TEST(HangReport, ProgramFramesAreTheScriptFoldersFilesWithTheirLines) {
  std::string dir = ddpl::testing::makeTempDir("hang_report_src");
  std::filesystem::create_directories(dir + "/pkg");
  std::ofstream(dir + "/train.py") << "import time\n  time.sleep(60)  # why\n";
  std::ofstream(dir + "/pkg/model.py") << "x = 1\n";
  StackSummary s = summarizeStack(
      "Thread 9 (idle): \"MainThread\"\n"
      "    select (selectors.py:415)\n"
      "    all_reduce (torch/distributed/distributed_c10d.py:2942)\n"
      "    forward (pkg/model.py:1)\n"
      "    main (train.py:2)\n"
      "    <module> (<string>:1)\n",
      9);
  markProgramFrames(s, dir);
  ASSERT_EQ(s.frames.size(), 5u);
  EXPECT_FALSE(s.frames[0].user);
  EXPECT_FALSE(s.frames[1].user);
  EXPECT_TRUE(s.frames[2].user);
  EXPECT_EQ(s.frames[2].source, "x = 1");
  EXPECT_TRUE(s.frames[3].user);
  EXPECT_EQ(s.frames[3].source, "time.sleep(60)");  // the comment left out
  EXPECT_FALSE(s.frames[4].user);
  EXPECT_TRUE(s.in_collective);
  std::filesystem::remove_all(dir);
}

// A listening socket that answers each connection with `answer`, or never (empty).
struct FakeRank {
  std::string path;
  int fd = -1;
  std::thread thread;
  FakeRank(const std::string& p, std::string answer) : path(p) {
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    if (answer.empty()) return;  // the kernel queues the connection; nobody accepts it
    thread = std::thread([this, answer] {
      int c = accept(fd, nullptr, nullptr);
      if (c < 0) return;
      EXPECT_EQ(write(c, answer.data(), answer.size()), static_cast<ssize_t>(answer.size()));
      close(c);
    });
  }
  ~FakeRank() {
    shutdown(fd, SHUT_RDWR);
    if (thread.joinable()) thread.join();
    close(fd);
  }
};

TEST(FlightRecord, AskingTheRanksBoundsTheWaitAndSaysWhoDidNotAnswer) {
  std::string dir = ddpl::testing::makeTempDir("fr_ask");
  FakeRank answers(dir + "/0.sock", dump(3));
  FakeRank silent(dir + "/1.sock", "");
  auto got = askFlightRecorders({{0, dir + "/0.sock"},
                                 {1, dir + "/1.sock"},
                                 {2, dir + "/none.sock"},
                                 {3, dir + "/" + std::string(120, 'x')}},
                                0.5);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0].answered) << got[0].error;
  EXPECT_EQ(got[0].last_enqueued.at("0"), 3u);
  EXPECT_FALSE(got[1].answered);
  EXPECT_EQ(got[1].error, "no answer in 0.5s");
  EXPECT_TRUE(has(got[2].error, "no flight recorder served")) << got[2].error;
  EXPECT_TRUE(has(got[3].error, "too long")) << got[3].error;
  std::filesystem::remove_all(dir);
}

TEST(FlightRecord, WorkersGetTheSocketAndABufferUnlessTheUserChoseOne) {
  Environment env;
  addFlightRecorderBuffer(env, {});
  EXPECT_TRUE(addFlightRecorderSocket(env, "/run/attempt_0/2"));
  EXPECT_EQ(env["DDPL_FLIGHT_RECORDER_SOCKET"], "/run/attempt_0/2/fr.sock");
  EXPECT_EQ(env["TORCH_FR_BUFFER_SIZE"], std::to_string(kFlightRecorderEntries));
  for (const char* users : {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}) {
    Environment e;
    addFlightRecorderBuffer(e, {{users, "0"}});
    EXPECT_TRUE(e.empty()) << users;
  }
  Environment none;
  EXPECT_FALSE(addFlightRecorderSocket(none, "/" + std::string(120, 'd')));
  EXPECT_TRUE(none.empty());
}

}  // namespace
}  // namespace ddpl::launcher
