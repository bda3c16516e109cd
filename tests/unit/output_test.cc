#include "launcher/output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "launcher/error_report.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;

namespace {
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_NONBLOCK), 0);
    r = fds[0];
    w = fds[1];
  }
};
std::string drainFd(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}
void put(int fd, const std::string& s) { ASSERT_EQ(write(fd, s.data(), s.size()), (ssize_t)s.size()); }
}  // namespace

TEST(OutputRouter, PrefixesWholeLinesAndHoldsPartials) {
  Pipe console_out, console_err, worker;
  OutputRouter router("trainer", console_out.w, console_err.w);
  router.add(worker.r, {0, 5, StreamKind::kStdout, true, -1});
  put(worker.w, "hello\nwor");
  EXPECT_TRUE(router.onReadable(worker.r));
  EXPECT_EQ(drainFd(console_out.r), "[trainer5]:hello\n");
  put(worker.w, "ld\n");
  router.onReadable(worker.r);
  EXPECT_EQ(drainFd(console_out.r), "[trainer5]:world\n");
  put(worker.w, "tail without newline");
  close(worker.w);
  EXPECT_FALSE(router.onReadable(worker.r));
  EXPECT_EQ(drainFd(console_out.r), "[trainer5]:tail without newline\n");
  EXPECT_EQ(drainFd(console_err.r), "");
  router.remove(worker.r);
}

TEST(OutputRouter, FilesGetRawTextAndConsoleCanBeOff) {
  std::string dir = ddpl::testing::makeTempDir("router");
  Pipe console_out, console_err, worker;
  OutputRouter router("default", console_out.w, console_err.w);
  int file = open((dir + "/stderr.log").c_str(), O_WRONLY | O_CREAT, 0644);
  router.add(worker.r, {1, 1, StreamKind::kStderr, false, file});
  put(worker.w, "a\nb\n");
  router.onReadable(worker.r);
  EXPECT_EQ(drainFd(console_err.r), "");
  router.remove(worker.r);
  EXPECT_EQ(ddpl::testing::readFile(dir + "/stderr.log"), "a\nb\n");
  auto tail = router.stderrTail(1);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail.back(), "b");
}

TEST(OutputRouter, OverlongLinesAreSplitNotBuffered) {
  Pipe console_out, console_err, worker;
  OutputRouter router("r", console_out.w, console_err.w);
  router.add(worker.r, {0, 0, StreamKind::kStdout, false, -1});
  std::string big(OutputRouter::kMaxLine + 10, 'x');
  // The pipe holds 64 KiB: write in two goes, reading in between.
  put(worker.w, big.substr(0, 60000));
  router.onReadable(worker.r);
  put(worker.w, big.substr(60000));
  router.onReadable(worker.r);
  close(worker.w);
  EXPECT_FALSE(router.onReadable(worker.r));
  router.remove(worker.r);
}

TEST(OutputRouter, StderrTailIsBounded) {
  Pipe console_out, console_err, worker;
  OutputRouter router("r", console_out.w, console_err.w);
  router.add(worker.r, {0, 0, StreamKind::kStderr, false, -1});
  std::string lines;
  for (int i = 0; i < 100; ++i) lines += "line " + std::to_string(i) + "\n";
  put(worker.w, lines);
  router.onReadable(worker.r);
  auto tail = router.stderrTail(0);
  EXPECT_EQ(tail.size(), OutputRouter::kTailLines);
  EXPECT_EQ(tail.back(), "line 99");
  router.remove(worker.r);
}

TEST(ErrorReport, ReadsTorchrunErrorFile) {
  std::string dir = ddpl::testing::makeTempDir("errfile");
  std::string path = dir + "/error.json";
  FILE* f = fopen(path.c_str(), "w");
  fputs(R"({"message": {"message": "ValueError: bad lr", "extraInfo": {"py_callstack": "Traceback...\n  line 3", "timestamp": "1700000000"}}})", f);
  fclose(f);
  auto c = readErrorFile(path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->message, "ValueError: bad lr");
  EXPECT_EQ(c->traceback, "Traceback...\n  line 3");
  EXPECT_EQ(c->timestamp, "1700000000");
  EXPECT_FALSE(readErrorFile(dir + "/missing.json"));
  f = fopen(path.c_str(), "w");
  fputs("not json", f);
  fclose(f);
  EXPECT_NE(readErrorFile(path)->message.find("not json"), std::string::npos);
}

TEST(ErrorReport, FormatsRootCauseAndOthers) {
  FailureDetail root;
  root.exit = {1, 4242, {false, 3}, 1700000000.0, false};
  root.global_rank = 1;
  root.host = "node7";
  root.error_file = "/x/error.json";
  root.error = ErrorFileContents{"RuntimeError: boom", "frame 1\nframe 2", "1700000000"};
  FailureDetail other;
  other.exit = {0, 4241, {true, 15}, 1700000001.0, true};
  other.host = "node7";
  other.stderr_tail = {"last words"};
  std::vector<FailureDetail> all{root, other};
  std::string r = formatFailureReport("train.py", all, all[0]);
  EXPECT_NE(r.find("train.py FAILED"), std::string::npos);
  EXPECT_NE(r.find("Root Cause (first observed failure)"), std::string::npos);
  EXPECT_NE(r.find("rank      : 1 (local_rank: 1)"), std::string::npos);
  EXPECT_NE(r.find("exitcode  : 3 (pid: 4242)"), std::string::npos);
  EXPECT_NE(r.find("RuntimeError: boom"), std::string::npos);
  EXPECT_NE(r.find("    frame 2"), std::string::npos);
  EXPECT_NE(r.find("signal 15 (SIGTERM) received by PID 4241"), std::string::npos);
  EXPECT_NE(r.find("last words"), std::string::npos);
  EXPECT_NE(r.find("host      : node7"), std::string::npos);
}
