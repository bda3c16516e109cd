// Issue 48: the hang report names the culprit and the collective, for six ways a rank hangs a
// 3-rank Gloo job under the real `launch` (tests/python/hang_kinds.py, one test per kind). Each
// run must name exactly the culprit rank(s) in its "likely culprit" line, with the collective
// the others wait in (operation and number), and show the others waiting in it. How soon the
// report comes is measured by bench/hang_report_bench.py, not asserted here.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include "tests/common/subprocess.h"

using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kScript = std::string(DDPL_SOURCE_DIR) + "/tests/python/hang_kinds.py";

struct Report {
  RunResult run;
  int collective = -1;              // the collective the culprits hung before (the script says)
  std::set<int> culprits;           // named in the "likely culprit" line
  std::vector<std::string> lines;   // "likely culprit" lines (one expected)
  std::vector<std::string> groups;  // "hang report: ..." lines
};

// `warm`: the workers fork from launch's template (--prewarm=torch), which saves the tests
// two imports of torch each; the flight recorder's setting must not make them start cold.
Report hang(const std::string& kind, bool warm) {
  RunOptions o;
  // The stacks launch keeps after a hang, and the lock files, go to the test's own directory.
  std::string tmp = makeTempDir("hang_report_" + kind);
  o.env = {
      {"PYTHON_EXEC", DDPL_PYTHON}, {"OMP_NUM_THREADS", "1"}, {"TMPDIR", tmp}, {"HANG_DIR", tmp}};
  o.timeout = 120s;
  Report r;
  std::vector<std::string> argv = {kLaunch, "--standalone", "--nproc-per-node=3",
                                   "--hang-timeout=2", "--rdzv-id=" + kind};
  if (warm) argv.push_back("--prewarm=torch");
  for (const auto& a : {kScript, std::string("--kind"), kind}) argv.push_back(a);
  r.run = run(argv, o);
  if (warm)
    EXPECT_NE(r.run.err.find("3 of 3 worker(s) forked from the template"), std::string::npos)
        << r.run.err;
  std::smatch m;
  std::istringstream out(r.run.out);
  for (std::string line; std::getline(out, line);)
    if (std::regex_search(line, m,
                          std::regex("HANG \\w+ rank \\d+ at [0-9.]+ before collective #(\\d+)")))
      r.collective = std::stoi(m[1]);
  std::istringstream err(r.run.err);
  for (std::string line; std::getline(err, line);) {
    if (line.find("] hang report: ") != std::string::npos)
      r.groups.push_back(line.substr(line.find("] hang report: ") + 15));
    if (!std::regex_search(line, m, std::regex("likely culprit: rank\\(s\\) ([0-9, ]+) \\(")))
      continue;
    r.lines.push_back(line);
    std::istringstream ranks(m[1].str());
    for (std::string n; std::getline(ranks, n, ',');) r.culprits.insert(std::stoi(n));
  }
  return r;
}

// What every kind must show: the hang found and reported once, naming exactly `culprits` and
// the all-reduce the others wait in, by its number, and those others waiting in it.
void expectReport(const Report& r, const std::set<int>& culprits, const std::string& waiting) {
  ASSERT_FALSE(r.run.timed_out) << "no hang found in 120 s\n" << r.run.all();
  EXPECT_EQ(r.run.exit_code, 124) << r.run.all();
  ASSERT_GT(r.collective, 0) << "the script never hung\n" << r.run.out;
  ASSERT_EQ(r.lines.size(), 1u) << r.run.err;
  EXPECT_EQ(r.culprits, culprits) << r.lines[0];
  const std::string collective = "all_reduce #" + std::to_string(r.collective) + " ";
  EXPECT_NE(r.lines[0].find(collective), std::string::npos)
      << "the report does not name " << collective << ": " << r.lines[0];
  bool others_shown = false;
  for (const auto& g : r.groups)
    others_shown = others_shown || g.rfind(waiting + " " + collective, 0) == 0;
  EXPECT_TRUE(others_shown) << r.run.err;
}

}  // namespace

// Rank 2 stops itself (SIGSTOP): its stack is still read (py-spy without its pause: the report
// shows where in the script it stopped), its flight recorder cannot answer, and the others'
// numbers the collective. Stopping the group continues it, so SIGTERM ends it without waiting
// out --shutdown-timeout for SIGKILL.
TEST(LaunchHangReport, AStoppedRankIsNamed) {
  Report r = hang("sigstop", /*warm=*/true);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {2}, "ranks 0, 1 wait in"));
  bool stopped_shown = false;
  for (const auto& g : r.groups)
    stopped_shown = stopped_shown || (g.rfind("rank 2 stopped (SIGSTOP", 0) == 0 &&
                                      g.find("(hang_kinds.py:") != std::string::npos);
  EXPECT_TRUE(stopped_shown) << r.run.err;
  EXPECT_EQ(r.run.err.find("still running: sending SIGKILL"), std::string::npos) << r.run.err;
}

TEST(LaunchHangReport, ARankAsleepIsNamed) {
  Report r = hang("sleep", /*warm=*/false);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {2}, "ranks 0, 1 wait in"));
  EXPECT_NE(r.lines[0].find("never entered all_reduce #"), std::string::npos) << r.lines[0];
}

// Rank 2 skips all-reduce #N and calls a barrier: every rank is inside a collective, and the
// flight recorder tells that rank 2's #N is another operation.
TEST(LaunchHangReport, ARankInAnotherCollectiveIsNamed) {
  Report r = hang("skip", /*warm=*/true);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {2}, "ranks 0, 1 wait in"));
  EXPECT_NE(r.lines[0].find("in barrier #" + std::to_string(r.collective) + " "), std::string::npos)
      << r.lines[0];
  EXPECT_NE(r.lines[0].find("mismatched collectives"), std::string::npos) << r.lines[0];
}

TEST(LaunchHangReport, ARankStuckInItsDataLoaderIsNamed) {
  Report r = hang("loader", /*warm=*/true);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {2}, "ranks 0, 1 wait in"));
}

TEST(LaunchHangReport, TwoRanksDeadlockedOnLocksAreBothNamed) {
  Report r = hang("lock", /*warm=*/false);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {1, 2}, "rank 0 waits in"));
}

// Rank 2 waits in the store for a helper process that was killed: nothing in the group knows.
TEST(LaunchHangReport, ARankWaitingOnADeadPeerIsNamed) {
  Report r = hang("deadpeer", /*warm=*/true);
  ASSERT_NO_FATAL_FAILURE(expectReport(r, {2}, "ranks 0, 1 wait in"));
}
