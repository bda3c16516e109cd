// Things that kill: the launcher itself SIGKILLed, workers leaving processes behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kGrandchildren =
    std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/grandchildren.sh";

std::set<pid_t> readPids(const std::string& path) {
  std::set<pid_t> pids;
  std::ifstream in(path);
  pid_t p;
  while (in >> p) pids.insert(p);
  return pids;
}

bool noneAlive(const std::set<pid_t>& pids) {
  for (pid_t p : pids)
    if (processAlive(p)) return false;
  return true;
}
}  // namespace

TEST(LaunchFault, SigkillOfTheLauncherLeavesNoWorkerOrGrandchild) {
  std::string dir = makeTempDir("sigkill");
  RunOptions o;
  o.env = {{"OUT_DIR", dir}};
  Background bg({kLaunch, "--nproc-per-node=3", kGrandchildren}, o);
  ASSERT_TRUE(eventually([&] {
    return fs::exists(dir + "/ready.0") && fs::exists(dir + "/ready.1") &&
           fs::exists(dir + "/ready.2");
  }, 20s)) << bg.outputSoFar();
  auto pids = readPids(dir + "/pids");
  ASSERT_EQ(pids.size(), 9u);  // per worker: itself, one grandchild in its group, one setsid'd
  for (pid_t p : pids) ASSERT_TRUE(processAlive(p)) << p;
  kill(bg.pid(), SIGKILL);
  bg.wait(10s);
  EXPECT_TRUE(eventually([&] { return noneAlive(pids); }, 10s))
      << "processes survived the launcher's SIGKILL";
}

TEST(LaunchFault, NormalExitLeavesNoGrandchildBehind) {
  std::string dir = makeTempDir("orphans");
  RunOptions o;
  o.env = {{"OUT_DIR", dir}, {"EXIT_NOW", "1"}};
  auto r = run({kLaunch, "--nproc-per-node=2", kGrandchildren}, o);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  auto pids = readPids(dir + "/pids");
  ASSERT_EQ(pids.size(), 6u);
  EXPECT_TRUE(eventually([&] { return noneAlive(pids); }, 5s));
}

TEST(LaunchFault, SigintStopsEverythingIncludingGrandchildren) {
  std::string dir = makeTempDir("sigint");
  RunOptions o;
  o.env = {{"OUT_DIR", dir}};
  Background bg({kLaunch, "--nproc-per-node=2", kGrandchildren}, o);
  ASSERT_TRUE(eventually([&] { return fs::exists(dir + "/ready.0") && fs::exists(dir + "/ready.1"); }, 20s));
  auto pids = readPids(dir + "/pids");
  kill(bg.pid(), SIGINT);
  auto r = bg.wait(20s);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.all();
  EXPECT_TRUE(eventually([&] { return noneAlive(pids); }, 5s));
}
