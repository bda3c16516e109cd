#include "launcher/agent/output.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "launcher/agent/error_report.h"
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
ConsoleOptions console(const Pipe& out, const Pipe& err, const std::string& role,
                       bool live = false) {
  ConsoleOptions c;
  c.out = out.w;
  c.err = err.w;
  c.role = role;
  c.live = live;
  return c;
}
void put(int fd, const std::string& s) { ASSERT_EQ(write(fd, s.data(), s.size()), (ssize_t)s.size()); }
}  // namespace

TEST(OutputRouter, PrefixesWholeLinesAndHoldsPartials) {
  Pipe console_out, console_err, worker;
  OutputRouter router(console(console_out, console_err, "trainer"));
  // torchrun's rule: the prefix shows the local rank (2), not the global one (5).
  router.add(worker.r, {2, 5, StreamKind::kStdout, true, -1});
  put(worker.w, "hello\nwor");
  EXPECT_TRUE(router.onReadable(worker.r));
  EXPECT_EQ(drainFd(console_out.r), "[trainer2]:hello\n");
  put(worker.w, "ld\n");
  router.onReadable(worker.r);
  EXPECT_EQ(drainFd(console_out.r), "[trainer2]:world\n");
  put(worker.w, "tail without newline");
  close(worker.w);
  EXPECT_FALSE(router.onReadable(worker.r));
  EXPECT_EQ(drainFd(console_out.r), "[trainer2]:tail without newline\n");
  EXPECT_EQ(drainFd(console_err.r), "");
  router.remove(worker.r);
}

TEST(OutputRouter, PrefixTemplateAsTorchrunAndPrefixOff) {
  EXPECT_EQ(expandPrefix("[${rank}]:", "trainer", 1, 9), "[9]:");
  EXPECT_EQ(expandPrefix("$role_name/$local_rank/${rank} $rankX $$ $other", "w", 3, 7),
            "w/3/7 $rankX $ $other");
  Pipe console_out, console_err, worker;
  ConsoleOptions c = console(console_out, console_err, "default");
  c.prefix = false;
  OutputRouter router(c);
  router.add(worker.r, {1, 1, StreamKind::kStdout, true, -1});
  put(worker.w, "plain\n");
  router.onReadable(worker.r);
  EXPECT_EQ(drainFd(console_out.r), "plain\n");
  router.remove(worker.r);
}

TEST(OutputRouter, CarriageReturnUpdatesShowLiveOnATerminal) {
  std::string dir = ddpl::testing::makeTempDir("router-cr");
  Pipe console_out, console_err, bar, other;
  OutputRouter router(console(console_out, console_err, "default", /*live=*/true));
  int file = open((dir + "/stderr.log").c_str(), O_WRONLY | O_CREAT, 0644);
  router.add(bar.r, {0, 0, StreamKind::kStderr, true, file});
  router.add(other.r, {1, 1, StreamKind::kStderr, true, -1});
  put(bar.w, "\r 10%|#");
  router.onReadable(bar.r);
  // Shown at once, without waiting for a newline.
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default0]: 10%|#");
  put(bar.w, "\r 50%|#####");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default0]: 50%|#####");
  // Another rank's line scrolls above the status line, which is drawn again below it.
  put(other.w, "rank 1 says hi\n");
  router.onReadable(other.r);
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default1]:rank 1 says hi\n[default0]: 50%|#####");
  put(bar.w, "\r100%|##########\n");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default0]:100%|##########\n");
  put(other.w, "after\n");
  router.onReadable(other.r);
  EXPECT_EQ(drainFd(console_err.r), "[default1]:after\n");
  router.remove(bar.r);
  router.remove(other.r);
  // The file holds the line's final state only.
  EXPECT_EQ(ddpl::testing::readFile(dir + "/stderr.log"), "100%|##########\n");
}

// launch's status line stays below everything: worker lines, a worker's '\r' line (the two
// are redrawn together, the worker's above) and launch's own log lines.
TEST(OutputRouter, StatusLineStaysAtTheBottomBelowWorkerAndLogLines) {
  Pipe console_out, console_err, bar, other;
  ConsoleOptions c = console(console_out, console_err, "default", /*live=*/true);
  c.status_line = true;
  c.columns = 21;  // lines are cut to 20 columns, never wrapped
  OutputRouter router(c);
  router.add(bar.r, {0, 0, StreamKind::kStderr, true, -1});
  router.add(other.r, {1, 1, StreamKind::kStderr, true, -1});
  router.setStatus("ddpl | 2/2 ranks up 1s | step 4");
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[Kddpl | 2/2 ranks up ");
  router.setStatus("ddpl | 2/2 ranks up 1s | step 4");  // unchanged: nothing written
  EXPECT_EQ(drainFd(console_err.r), "");
  put(other.w, "hello\n");
  router.onReadable(other.r);
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default1]:hello\nddpl | 2/2 ranks up ");
  // A worker's progress bar goes above the status line: two lines at the bottom now.
  put(bar.w, "\r 10%|#");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K[default0]: 10%|#\nddpl | 2/2 ranks up ");
  // Both are taken away (clear, up, clear) for a line and drawn again below it.
  put(other.w, "world\n");
  router.onReadable(other.r);
  EXPECT_EQ(drainFd(console_err.r),
            "\r\x1b[K\x1b[1A\r\x1b[K[default1]:world\n[default0]: 10%|#\nddpl | 2/2 ranks up ");
  router.aroundConsoleWrite([&] { put(console_err.w, "[launch] a log line\n"); });
  EXPECT_EQ(drainFd(console_err.r),
            "\r\x1b[K\x1b[1A\r\x1b[K[launch] a log line\n[default0]: 10%|#\nddpl | 2/2 ranks up ");
  // The bar's last state becomes an ordinary line; the status line stays.
  put(bar.w, "\r100%|##########\n");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_err.r),
            "\r\x1b[K\x1b[1A\r\x1b[K[default0]:100%|##########\nddpl | 2/2 ranks up ");
  router.setStatus("");
  EXPECT_EQ(drainFd(console_err.r), "\r\x1b[K");
  put(other.w, "plain again\n");
  router.onReadable(other.r);
  EXPECT_EQ(drainFd(console_err.r), "[default1]:plain again\n");
  router.remove(bar.r);
  router.remove(other.r);
}

TEST(OutputRouter, NoStatusLineUnlessAsked) {
  Pipe console_out, console_err;
  OutputRouter router(console(console_out, console_err, "default", /*live=*/true));
  router.setStatus("ddpl | 1/1 ranks");
  EXPECT_EQ(drainFd(console_err.r), "");
}

TEST(OutputRouter, CarriageReturnsOffATerminalGiveFinalStatesOnly) {
  Pipe console_out, console_err, bar;
  OutputRouter router(console(console_out, console_err, "default"));
  router.add(bar.r, {0, 0, StreamKind::kStdout, true, -1});
  put(bar.w, "\r1/3\r2/3");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_out.r), "");
  put(bar.w, "\r3/3\ndos line\r\n");
  router.onReadable(bar.r);
  EXPECT_EQ(drainFd(console_out.r), "[default0]:3/3\n[default0]:dos line\n");
  router.remove(bar.r);
}

TEST(OutputRouter, FilesGetRawTextAndConsoleCanBeOff) {
  std::string dir = ddpl::testing::makeTempDir("router");
  Pipe console_out, console_err, worker;
  OutputRouter router(console(console_out, console_err, "default"));
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
  OutputRouter router(console(console_out, console_err, "r"));
  router.add(worker.r, {0, 0, StreamKind::kStdout, true, -1});
  // Room for the whole 64 KiB line on the console side (a pipe holds 64 KiB by default).
  ASSERT_GE(fcntl(console_out.w, F_SETPIPE_SZ, 1 << 20), 1 << 20);
  std::string big(OutputRouter::kMaxLine + 10, 'x');
  // The worker's pipe holds 64 KiB: write in two goes, reading in between.
  put(worker.w, big.substr(0, 60000));
  router.onReadable(worker.r);
  // Not a whole line yet and not past the limit: nothing is shown.
  std::string shown = drainFd(console_out.r);
  EXPECT_EQ(shown, "");
  put(worker.w, big.substr(60000));
  router.onReadable(worker.r);
  // Past the limit: the first kMaxLine bytes go out as a line of their own, at once.
  shown = drainFd(console_out.r);
  EXPECT_EQ(shown.size(), OutputRouter::kMaxLine + 6);  // no 64 KiB strings in a failure
  EXPECT_TRUE(shown == "[r0]:" + std::string(OutputRouter::kMaxLine, 'x') + "\n");
  close(worker.w);
  EXPECT_FALSE(router.onReadable(worker.r));
  EXPECT_EQ(drainFd(console_out.r), "[r0]:xxxxxxxxxx\n");
  router.remove(worker.r);
}

TEST(OutputRouter, StderrTailIsBounded) {
  Pipe console_out, console_err, worker;
  OutputRouter router(console(console_out, console_err, "r"));
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

// Issue 44: a worker's error file whose message is a list nested 200,000 deep (400 KB) parsed,
// then printing the message recursed once per level and overflowed launch's stack, killing it.
// Now it reads as a file that cannot be parsed: its first bytes, and the report is made.
TEST(ErrorReport, AnErrorFileNestedDeepReadsAsUnparseable) {
  std::string dir = ddpl::testing::makeTempDir("error_deep");
  std::string path = dir + "/error.json";
  FILE* f = fopen(path.c_str(), "w");
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  fputs(("{\"message\": {\"message\": " + deep + "}}").c_str(), f);
  fclose(f);
  auto c = readErrorFile(path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->message.rfind("(unparseable error file) {\"message\": {\"message\": [[[", 0), 0u)
      << c->message.substr(0, 100);
  FailureDetail d;
  d.error = c;
  EXPECT_NE(formatFailureReport("train.py", {d}, d).find("unparseable"), std::string::npos);
  // What torchrun writes, a few levels deep, is read as before.
  f = fopen(path.c_str(), "w");
  fputs(R"({"message": {"message": {"a": [[["b"]]]}, "extraInfo": {"timestamp": "1"}}})", f);
  fclose(f);
  EXPECT_EQ(readErrorFile(path)->message, R"({"a":[[["b"]]]})");
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

// A C++ worker's symbolised trace (worker/native_trace.h): the report shows the frames that lead
// to the cause, not the ones that build and throw the exception, nor all 64.
TEST(ErrorReport, NativeTraceShowsItsInnermostFramesPastTheThrow) {
  std::string trace =
      "Exception raised from inner at /src/a.cc:10 (most recent call first):\n"
      "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x80 (/t/libc10.so + "
      "0x9db80)\n"
      "frame #1: c10::ValueError::ValueError(c10::SourceLocation, std::string) + 0x10 "
      "(/t/libc10.so + 0x1000)\n"
      "frame #2: c10::detail::torchCheckFail(char const*, char const*, unsigned int, std::string "
      "const&) + 0x65 "
      "(/t/libc10.so + 0x2ffbf)\n"
      "frame #3: ns::inner(int) at /src/a.cc:10 (/bin/prog + 0x1000)\n"
      "    inlined into ns::outer() at /src/a.cc:20\n"
      "frame #4: <unknown function> (/lib/libvendor.so + 0x110c)\n";
  for (int k = 5; k <= 14; ++k)
    trace += fmt::format("frame #{}: f{}() at /src/b.cc:{} (/bin/prog + 0x{:x})\n", k, k, k, k);
  FailureDetail root;
  root.exit = {0, 4242, {false, 1}, 1700000000.0, false};
  root.error_file = "/x/error.json";
  root.error = ErrorFileContents{"c10::Error: boom", trace, "1700000000"};
  const std::string r = formatFailureReport("train", {root}, root);
  EXPECT_NE(r.find("  traceback :\n    Exception raised from inner at /src/a.cc:10 (most recent "
                   "call first):\n"
                   "    frame #3: ns::inner(int) at /src/a.cc:10 (/bin/prog + 0x1000)\n"
                   "        inlined into ns::outer() at /src/a.cc:20\n"
                   "    frame #4: <unknown function> (/lib/libvendor.so + 0x110c)\n"
                   "    frame #5: f5() at /src/b.cc:5"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("    frame #10: f10()"), std::string::npos) << r;  // the 8th frame shown
  EXPECT_EQ(r.find("frame #11:"), std::string::npos) << r;
  EXPECT_EQ(r.find("c10::", r.find("traceback :")), std::string::npos) << r;
  EXPECT_NE(
      r.find(
          "    (not shown: 3 frame(s) that build and throw the exception, 4 outer frame(s); all in "
          "/x/error.json)\n"),
      std::string::npos)
      << r;
  root.error_file_kept = false;  // launch's temporary log directory: gone when the report is read
  EXPECT_NE(formatFailureReport("train", {root}, root)
                .find("    (not shown: 3 frame(s) that build and throw the exception, 4 outer "
                      "frame(s); launch "
                      "keeps the error file that has them with --log-dir)\n"),
            std::string::npos);
}

// An exception libstdc++ throws for the caller (vector::at, std::stoi): its helper is machinery
// too, and the caller leads.
TEST(ErrorReport, NativeTraceOfALibstdcxxThrowStartsAtItsCaller) {
  const std::string trace =
      "Thrown from (most recent call first):\n"
      "frame #0: std::__throw_out_of_range_fmt(char const*, ...) + 0x56 (/usr/lib/libstdc++.so.6 "
      "+ 0xa6e5c)\n"
      "frame #1: ns::lookup(int) at /src/a.cc:7 (/bin/prog + 0x1000)\n";
  FailureDetail root;
  root.exit = {0, 4242, {false, 1}, 1700000000.0, false};
  root.error_file = "/x/error.json";
  root.error = ErrorFileContents{"std::out_of_range: vector::_M_range_check", trace, "1"};
  const std::string r = formatFailureReport("train", {root}, root);
  EXPECT_NE(r.find("    Thrown from (most recent call first):\n"
                   "    frame #1: ns::lookup(int) at /src/a.cc:7"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("__throw_out_of_range", r.find("traceback :")), std::string::npos) << r;
}

// An exception that escaped a thread: the terminate machinery runs through libstdc++ frames that
// have no names; they go with it, and the throwing function leads.
TEST(ErrorReport, NativeTraceOfAnEscapedExceptionStartsAtTheThrower) {
  const std::string trace =
      "Uncaught, in the thread that threw it (most recent call first):\n"
      "frame #0: ddpl::worker::(anonymous "
      "namespace)::describeImpl(std::__exception_ptr::exception_ptr const&) "
      "[clone .cold] at ../worker/error_report.cc:60 (/bin/prog + 0x804a2)\n"
      "frame #1: ddpl::worker::(anonymous namespace)::onTerminate() at "
      "../worker/error_report.cc:120 (/bin/prog + 0xa63d8)\n"
      "frame #2: <unknown function> (/usr/lib/libstdc++.so.6 + 0xa8e1a)\n"
      "frame #3: std::terminate() + 0x15 (/usr/lib/libstdc++.so.6 + 0xa8e85)\n"
      "frame #4: __cxa_throw + 0x48 (/usr/lib/libstdc++.so.6 + 0xa90d8)\n"
      "frame #5: ddpl_test::throwInThread(int) at x.cc:36 (/bin/prog + 0x7ce3b)\n"
      "frame #6: <unknown function> (/usr/lib/libstdc++.so.6 + 0xd44a3)\n";
  FailureDetail root;
  root.exit = {0, 4242, {false, 1}, 1700000000.0, false};
  root.error_file = "/x/error.json";
  root.error = ErrorFileContents{"std::runtime_error: boom", trace, "1700000000"};
  const std::string r = formatFailureReport("train", {root}, root);
  EXPECT_NE(
      r.find(
          "  traceback :\n    Uncaught, in the thread that threw it (most recent call first):\n"
          "    frame #5: ddpl_test::throwInThread(int) at x.cc:36 (/bin/prog + 0x7ce3b)\n"
          "    frame #6: <unknown function> (/usr/lib/libstdc++.so.6 + 0xd44a3)\n"
          "    (not shown: 5 frame(s) that build and throw the exception; all in /x/error.json)\n"),
      std::string::npos)
      << r;
}

#include "launcher/health/stacks.h"

TEST(Stacks, PySpyMainThreadAndCollectives) {
  const std::string dump =
      "Process 42: python train.py\nPython v3.11.7\n\n"
      "Thread 43 (idle): \"loader\"\n    wait (threading.py:320)\n\n"
      "Thread 42 (idle): \"MainThread\"\n"
      "    all_reduce (torch/distributed/distributed_c10d.py:2942)\n"
      "    main (train.py:31)\n    <module> (train.py:39)\n";
  auto s = summarizeStack(dump, 42, 2);
  EXPECT_TRUE(s.in_collective);
  EXPECT_EQ(s.innermost, (std::vector<std::string>{
                             "all_reduce (torch/distributed/distributed_c10d.py:2942)",
                             "main (train.py:31)"}));
  auto own = summarizeStack("Thread 7 (idle)\n    stuck (a.py:3)\n", 7);
  EXPECT_FALSE(own.in_collective);
  EXPECT_EQ(own.innermost, std::vector<std::string>{"stuck (a.py:3)"});
}

TEST(Stacks, EuStackNativeFrames) {
  const std::string dump =
      "PID 9 - process\nTID 9:\n#0  0x00007f clock_nanosleep@GLIBC_2.2.5\n"
      "#1  0x00007f c10d::ProcessGroupGloo::AsyncWork::wait\n#2  0x0000 main\n";
  auto s = summarizeStack(dump, 9);
  EXPECT_TRUE(s.in_collective);
  ASSERT_EQ(s.innermost.size(), 3u);
  EXPECT_NE(s.innermost[0].find("clock_nanosleep"), std::string::npos);
}

// Python workers get py-spy (Python frames) whether launch added the interpreter or the
// command names one.
TEST(Stacks, RunsPythonKnowsInterpretersAndScripts) {
  EXPECT_TRUE(runsPython({"python", "train.py"}));
  EXPECT_TRUE(runsPython({"/work/.venv/bin/python3", "train.py"}));
  EXPECT_TRUE(runsPython({"python3.11", "-m", "mod"}));
  EXPECT_TRUE(runsPython({"./train.py"}));
  EXPECT_FALSE(runsPython({"/usr/bin/pythonista"}));
  EXPECT_FALSE(runsPython({"./ddp_resnet", "--epochs", "1"}));
  EXPECT_FALSE(runsPython({"/bin/sh", "-c", "python3 x.py"}));
  EXPECT_FALSE(runsPython({}));
}

// torchrun 2.15's ${hostname} (socket.gethostname()) beside the other three names.
TEST(OutputRouter, PrefixTemplateHostname) {
  EXPECT_EQ(expandPrefix("${hostname}:${rank}: ", "default", 0, 3, "r12i0n8"), "r12i0n8:3: ");
  EXPECT_EQ(expandPrefix("$hostname|", "default", 0, 3), nodeName() + "|");
  EXPECT_FALSE(nodeName().empty());
}

// torchrun's --duplicate-*-filters: a tee'd line (file and console) holding any needle goes,
// prefixed, to the attempt's filtered_<stream>.log, every rank into one file; lines only
// redirected, only on the console, or of the other stream do not; --no-prefix changes the
// console only.
TEST(OutputRouter, DuplicateFiltersCopyTeedLinesThatMatch) {
  std::string dir = ddpl::testing::makeTempDir("router-dup");
  Pipe console_out, console_err, teed, redirected, console_only, err_teed;
  ConsoleOptions c = console(console_out, console_err, "default");
  c.prefix = false;
  c.duplicate_stdout_filters = {"apple", "or,ange"};
  c.duplicate_stderr_filters = {"kiwi"};
  OutputRouter router(c);
  router.openDuplicateFiles(dir);
  auto file = [&](const std::string& name) {
    return open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  };
  router.add(teed.r, {0, 4, StreamKind::kStdout, true, file("0.out")});
  router.add(redirected.r, {1, 5, StreamKind::kStdout, false, file("1.out")});
  router.add(console_only.r, {2, 6, StreamKind::kStdout, true, -1});
  router.add(err_teed.r, {3, 7, StreamKind::kStderr, true, file("3.err")});
  put(teed.w, "an apple\nbanana\nor,ange juice\n");
  put(redirected.w, "apple from a redirect\n");
  put(console_only.w, "apple on the console\n");
  put(err_teed.w, "kiwi\napple on stderr\n");
  for (int fd : {teed.r, redirected.r, console_only.r, err_teed.r}) router.onReadable(fd);
  EXPECT_EQ(ddpl::testing::readFile(dir + "/filtered_stdout.log"),
            "[default0]:an apple\n[default0]:or,ange juice\n");
  EXPECT_EQ(ddpl::testing::readFile(dir + "/filtered_stderr.log"), "[default3]:kiwi\n");
  EXPECT_EQ(drainFd(console_out.r), "an apple\nbanana\nor,ange juice\napple on the console\n");
  // The next attempt writes its own files; streams without filters get none.
  std::string next = ddpl::testing::makeTempDir("router-dup-next");
  ConsoleOptions none = console(console_out, console_err, "default");
  OutputRouter quiet(none);
  quiet.openDuplicateFiles(next);
  EXPECT_FALSE(std::filesystem::exists(next + "/filtered_stdout.log"));
  EXPECT_FALSE(std::filesystem::exists(next + "/filtered_stderr.log"));
  router.openDuplicateFiles(next);
  EXPECT_EQ(ddpl::testing::readFile(next + "/filtered_stdout.log"), "");
  put(teed.w, "apple again\n");
  router.onReadable(teed.r);
  EXPECT_EQ(ddpl::testing::readFile(next + "/filtered_stdout.log"), "[default0]:apple again\n");
  EXPECT_EQ(ddpl::testing::readFile(dir + "/filtered_stdout.log"),
            "[default0]:an apple\n[default0]:or,ange juice\n");
}
