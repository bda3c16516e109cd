// What a worker, a user on the same machine or a bad command line can do to launch (issue 33):
// each case was reproduced on the code before it, as an attacker or a new user would try it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "tests/common/cgroup_probe.h"
#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
using namespace ddpl::testing;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kRdzvServer = std::string(DDPL_BIN_DIR) + "/rdzv-server";

// Every path under `dir`, relative, with its permission bits.
std::map<std::string, unsigned> tree(const std::string& dir) {
  std::map<std::string, unsigned> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (lstat(it->path().c_str(), &st) == 0)
      out[it->path().lexically_relative(dir).string()] =
          (S_ISLNK(st.st_mode) ? 0120000 : 0) | (st.st_mode & 07777);
  }
  return out;
}

std::string describe(const std::map<std::string, unsigned>& t) {
  std::ostringstream s;
  for (const auto& [p, m] : t) s << std::oct << m << " " << p << "\n";
  return s.str();
}

// The descendants of `root` (not itself), from /proc.
std::set<pid_t> descendantsOf(pid_t root) {
  std::set<pid_t> out{root};
  for (bool grew = true; grew;) {
    grew = false;
    std::error_code ec;
    for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      pid_t p = static_cast<pid_t>(std::stol(name));
      if (!out.count(p) && out.count(parentOf(p))) grew = out.insert(p).second || grew;
    }
  }
  out.erase(root);
  return out;
}
}  // namespace

// A worker that shrinks its heartbeat memfd made launch's next read of the mapping a SIGBUS
// ("Bus error", exit 135). The file's size is sealed now: the worker's ftruncate fails.
TEST(LaunchHardening, AWorkerShrinkingItsHeartbeatCannotCrashLaunch) {
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=1", "--monitor-interval=0.05",
                "--no-python", "/usr/bin/python3", "-c",
                "import os,time\n"
                "fd=int(os.environ['DDPL_HEARTBEAT_FD'])\n"
                "try:\n  os.ftruncate(fd,0)\nexcept OSError as e:\n  print('refused:', e)\n"
                "time.sleep(1)\n"},
               {.timeout = 30s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_THAT(r.all(), HasSubstr("refused"));
  EXPECT_EQ(r.all().find("Bus error"), std::string::npos) << r.all();
}

// Without --log-dir nothing may stay in the temporary directory (316 manifests sat in /tmp),
// and while the run lasts its files are private: 0700 directories, a 0600 manifest.
TEST(LaunchHardening, RunsWithoutLogDirArePrivateAndLeaveNothingBehind) {
  std::string tmp = makeTempDir("hardening_tmp");
  std::string seen = tmp + "-seen";
  // The worker copies what it can see of the run directory while it runs.
  auto r = run({kLaunch, "--nproc-per-node=1", "--no-python", "/bin/sh", "-c",
                "sleep 0.3; ls -la \"$TMPDIR\" > " + seen + "; find \"$TMPDIR\" -name "
                "manifest.json -exec stat -c '%a %n' {} + >> " + seen},
               {.env = {{"TMPDIR", tmp}, {"GITHUB_PAT", "ghp_secret"}}, .timeout = 30s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  std::string during = readFile(seen);
  EXPECT_THAT(during, HasSubstr("drwx------")) << during;
  EXPECT_THAT(during, ::testing::ContainsRegex("600 .*/manifest.json")) << during;
  EXPECT_TRUE(tree(tmp).empty()) << describe(tree(tmp));
  fs::remove_all(tmp);
  fs::remove(seen);
}

// With --log-dir: the run's directory is made by launch, private, and a symlink planted at its
// name in advance (a shared --log-dir) is never followed.
TEST(LaunchHardening, LogDirRunDirectoryIsPrivateAndNeverAPlantedLink) {
  std::string logs = makeTempDir("hardening_logs");
  std::string elsewhere = makeTempDir("hardening_elsewhere");
  ASSERT_EQ(symlink(elsewhere.c_str(), (logs + "/job").c_str()), 0);
  auto r = run({kLaunch, "--log-dir", logs, "--rdzv-id", "job", "--nproc-per-node=1",
                "--no-python", "true"},
               {.timeout = 30s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_TRUE(tree(elsewhere).empty()) << describe(tree(elsewhere));
  auto t = tree(logs);
  ASSERT_TRUE(t.count("job.1")) << describe(t);
  EXPECT_EQ(t["job.1"], 0700u) << describe(t);
  ASSERT_TRUE(t.count("job.1/manifest.json")) << describe(t);
  EXPECT_EQ(t["job.1/manifest.json"], 0600u);
  for (const auto& [path, mode] : t)
    if (path != "job") EXPECT_EQ(mode & 0007, 0u) << path << " is world-readable";
  fs::remove_all(logs);
  fs::remove_all(elsewhere);
}

// --rdzv-id=../../x created directories outside the log directory; 5,000 characters gave a bare
// filesystem error (exit 1) and left the temporary directory.
TEST(LaunchHardening, RunIdsThatCannotNameADirectoryAreUsageErrors) {
  std::string tmp = makeTempDir("hardening_runid");
  std::string logs = tmp + "/logs";
  for (const std::string& id : {std::string("../../x"), std::string("a/b"), std::string(5000, 'a'),
                                std::string(".."), std::string("")}) {
    auto r = run({kLaunch, "--log-dir", logs, "--rdzv-id=" + id, "--no-python", "true"},
                 {.env = {{"TMPDIR", tmp}}, .timeout = 30s});
    EXPECT_EQ(r.exit_code, 2) << id.substr(0, 20) << ": " << r.all();
    EXPECT_THAT(r.err, HasSubstr("--rdzv-id")) << r.all();
    EXPECT_LT(r.err.size(), 600u) << "the message should not echo 5,000 characters";
  }
  EXPECT_TRUE(tree(tmp).empty()) << describe(tree(tmp));
  EXPECT_FALSE(fs::exists(fs::path(tmp).parent_path() / "x"));
  fs::remove_all(tmp);
}

TEST(LaunchHardening, ListenAddressesAreCheckedAsUsageErrors) {
  for (const std::string& host : {std::string(""), std::string("999.1.1.1"), std::string("a b")}) {
    auto r = run({kLaunch, "--metrics-port=0", "--metrics-host=" + host, "--no-python", "true"});
    EXPECT_EQ(r.exit_code, 2) << "'" << host << "': " << r.all();
    EXPECT_THAT(r.err, HasSubstr("--metrics-host"));
  }
  auto s = run({kRdzvServer, "--host=999.999.1.1", "--port=0"}, {.timeout = 10s});
  EXPECT_EQ(s.exit_code, 2) << s.all();
  EXPECT_THAT(s.err, HasSubstr("--host"));
}

// Debian's civetweb has no IPv6: launch relays an IPv6 listener to it. The worker scrapes its
// own node's endpoint over [::1] (python3's standard library only).
TEST(LaunchHardening, MetricsOnIpv6Loopback) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  if (probe < 0) GTEST_SKIP() << "no IPv6 here";
  close(probe);
  int port = freeLoopbackPort();
  auto r = run({kLaunch, "--metrics-port=" + std::to_string(port), "--metrics-host=::1",
                "--nproc-per-node=1", "--no-python", "/usr/bin/python3", "-c",
                "import urllib.request,time\n"
                "for i in range(50):\n"
                "  try:\n"
                "    b=urllib.request.urlopen('http://[::1]:" + std::to_string(port) +
                    "/metrics',timeout=5).read().decode()\n"
                "    break\n"
                "  except OSError:\n"
                "    time.sleep(0.1)\n"
                "print('scraped', 'ddpl_local_ranks_alive' in b)\n"},
               {.timeout = 40s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_THAT(r.all(), HasSubstr("scraped True"));
  EXPECT_THAT(r.all(), HasSubstr("http://[::1]:" + std::to_string(port) + "/metrics"));
}

// torchx's dist.ddp component: `--rdzv_backend c10d --rdzv_endpoint localhost:0 --role ''`,
// which torchrun runs as one node on a free port.
TEST(LaunchHardening, TorchxSingleNodeCommandLineRuns) {
  auto r = run({kLaunch, "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id",
                "train-x1y2", "--nnodes", "1", "--nproc_per_node", "2", "--tee", "3", "--role",
                "", "--no-python", "/bin/sh", "-c",
                "echo \"role=[$ROLE_NAME] world=$WORLD_SIZE run=$TORCHELASTIC_RUN_ID\""},
               {.timeout = 30s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_THAT(r.all(), HasSubstr("role=[] world=2 run=train-x1y2"));
  // Port 0 cannot reach a second node: said at once.
  auto m = run({kLaunch, "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--nnodes",
                "2", "--no-python", "true"});
  EXPECT_EQ(m.exit_code, 2) << m.all();
  EXPECT_THAT(m.err, HasSubstr("port 0"));
}

// A hang's report points at each rank's stacks.txt; without --log-dir launch deleted them at
// exit. What a report names stays (in the private run directory), the rest goes.
TEST(LaunchHardening, StacksAHangReportNamesOutliveTheRun) {
  std::string tmp = makeTempDir("hardening_stacks");
  auto r = run({kLaunch, "--nproc-per-node=1", "--hang-timeout=1.5", "--monitor-interval=0.1",
                "--no-python", "/usr/bin/python3", "-c",
                "import os,time\n"
                "fd=int(os.environ['DDPL_HEARTBEAT_FD'])\n"
                "for s in range(1,4):\n"
                "  os.pwrite(fd,s.to_bytes(8,'little'),0); time.sleep(0.1)\n"
                "time.sleep(120)\n"},
               {.env = {{"TMPDIR", tmp}}, .timeout = 90s});
  EXPECT_EQ(r.exit_code, 124) << r.all();
  std::smatch m;
  std::string all = r.all();
  ASSERT_TRUE(std::regex_search(all, m, std::regex("stack \\(([^)]*stacks\\.txt)\\)"))) << all;
  std::string stacks = m[1];
  EXPECT_TRUE(fs::exists(stacks)) << stacks << " is gone; output:\n" << all;
  EXPECT_THAT(all, HasSubstr("kept in " + tmp));
  // Only the evidence stays: no logs, no control socket.
  for (const auto& [path, mode] : tree(tmp)) {
    bool dir = fs::is_directory(tmp + "/" + path);
    EXPECT_TRUE(dir || path.find("stacks.txt") != std::string::npos ||
                path.find("manifest.json") != std::string::npos)
        << path;
    if (dir) EXPECT_EQ(mode & 0007, 0u) << path;
  }
  fs::remove_all(tmp);
}

// SIGKILL of a whole launch tree (launch, watchdog and workers at once) leaves its run cgroup;
// the next launch removes it, and never a live launch's.
TEST(LaunchHardening, StaleRunCgroupsAreRemovedByTheNextLaunchLiveOnesAreNot) {
  auto cgroupOf = [](Background& bg) -> std::string {
    std::string path;
    eventually(
        [&] {
          std::smatch m;
          std::string out = bg.outputSoFar();
          if (!std::regex_search(out, m, std::regex("workers run in cgroup (\\S+):"))) return false;
          path = m[1];
          return true;
        },
        15s);
    return path;
  };
  // Judged apart from launch: where a cgroup v2 can be made here, a launch that makes none has
  // regressed (a failure); only a machine that gives none skips this test.
  if (std::string why = cgroupV2Unavailable(); !why.empty())
    GTEST_SKIP() << "no run cgroups on this machine: " << why;
  Background killed({kLaunch, "--log-level=debug", "--nproc-per-node=1", "--no-python", "sleep",
                     "60"});
  std::string stale = cgroupOf(killed);
  ASSERT_FALSE(stale.empty()) << "this machine gives a writable cgroup v2, yet launch made no "
                                 "run cgroup (no 'workers run in cgroup' line):\n"
                              << killed.outputSoFar();
  // Stop the whole tree first, so that no part of it (the watchdog) cleans up, then kill it.
  ASSERT_TRUE(eventually([&] { return descendantsOf(killed.pid()).size() >= 2; }, 10s));
  std::set<pid_t> all = descendantsOf(killed.pid());
  all.insert(killed.pid());
  for (pid_t p : all) kill(p, SIGSTOP);
  for (pid_t p : all) kill(p, SIGKILL);
  killed.wait(10s);
  // Nothing of the killed tree removes its cgroup now. (Another test's launch that ends
  // meanwhile may sweep it first: that is the behaviour under test too.)
  eventually([&] {
    return !fs::exists(stale) ||
           readFile(stale + "/cgroup.events").find("populated 0") != std::string::npos;
  }, 10s);

  Background live({kLaunch, "--log-level=debug", "--nproc-per-node=1", "--no-python", "sleep",
                   "60"});
  std::string live_cgroup = cgroupOf(live);
  ASSERT_FALSE(live_cgroup.empty());
  auto r = run({kLaunch, "--nproc-per-node=1", "--no-python", "true"}, {.timeout = 30s});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_FALSE(fs::exists(stale)) << r.all();
  EXPECT_TRUE(fs::exists(live_cgroup));
}

// A launch SIGKILLed without --log-dir left its private temporary directory behind every time
// (64 of them after one make test): its watchdog removes it with the rest of the run.
TEST(LaunchHardening, ASigkilledLaunchLeavesNoTemporaryDirectory) {
  std::string tmp = makeTempDir("hardening_killed");
  RunOptions o;
  o.env = {{"TMPDIR", tmp}};
  Background bg({kLaunch, "--nproc-per-node=1", "--no-python", "sleep", "60"}, o);
  ASSERT_TRUE(eventually([&] { return !tree(tmp).empty() && !descendantsOf(bg.pid()).empty(); },
                         15s))
      << bg.outputSoFar();
  kill(bg.pid(), SIGKILL);
  bg.wait(10s);
  EXPECT_TRUE(eventually([&] { return tree(tmp).empty(); }, 10s)) << describe(tree(tmp));
  fs::remove_all(tmp);
}
