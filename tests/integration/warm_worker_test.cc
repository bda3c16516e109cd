// Issue 30: Python workers forked from launch's warm template (--prewarm) see what a cold start
// gives them, fall back to cold starts where forking is unsafe, and survive the template's death.
// Most cases prewarm a standard-library module (json): what is compared is the worker's start,
// not torch; the DDP case prewarms torch itself.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/common/subprocess.h"

using namespace ddpl::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kWarm = std::string(DDPL_SOURCE_DIR) + "/tests/python/warm";
const std::string kScripts = std::string(DDPL_SOURCE_DIR) + "/tests/python";

size_t countOf(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << "missing " << path;
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

// Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot.
unsigned long long startTicks(pid_t pid) {
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos) return ~0ULL;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && in >> field; ++i) {
  }
  return std::stoull(field);
}

// The template: launch's child that shows the template's command line, the oldest of them (a
// worker shows it too between its fork and the rewrite of its own).
pid_t templateOf(pid_t launch) {
  pid_t found = -1;
  unsigned long long oldest = ~0ULL;
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || parentOf(pid) != launch) continue;
    std::string cmd = readFile("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmd.find("ddplaunch_warm_template") == std::string::npos &&
        cmd.find("[ddplaunch warm template") == std::string::npos)
      continue;
    if (auto t = startTicks(pid); t < oldest) {
      oldest = t;
      found = pid;
    }
  }
  if (d) closedir(d);
  return found;
}

class WarmWorkers : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = makeTempDir("warm"); }
  RunOptions opts(const std::string& mode) {
    RunOptions o;
    o.env = {{"PYTHON_EXEC", DDPL_PYTHON},
             {"PROBE_DIR", dir_},
             {"PROBE_MODE", mode},
             {"OMP_NUM_THREADS", "1"}};
    o.timeout = 120s;
    return o;
  }
  // The same job cold and warm; returns the warm run.
  RunResult both(const std::vector<std::string>& job, RunOptions o = {}, int nproc = 2) {
    auto argv = [&](bool warm) {
      std::vector<std::string> a = {kLaunch, "--nproc-per-node=" + std::to_string(nproc),
                                    "--rdzv-id=probe"};
      if (warm) a.push_back("--prewarm=json");
      a.insert(a.end(), job.begin(), job.end());
      return a;
    };
    RunOptions c = opts("cold"), w = opts("warm");
    for (auto& [k, v] : o.env) c.env[k] = w.env[k] = v;
    c.cwd = w.cwd = o.cwd;
    cold_ = run(argv(false), c);
    auto r = run(argv(true), w);
    EXPECT_EQ(countOf(cold_.err, "forked from the template"), 0u) << cold_.all();
    return r;
  }
  std::string dir_;
  RunResult cold_;
};

TEST_F(WarmWorkers, AScriptForkedFromTheTemplateSeesWhatAColdStartGives) {
  auto r = both({kWarm + "/probe.py", "--lr", "0.1", "${local_rank}"});
  ASSERT_EQ(cold_.exit_code, 0) << cold_.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("--prewarm: 2 of 2 worker(s) forked from the template (json imported in"),
            std::string::npos)
      << r.all();
  EXPECT_EQ(countOf(r.err, "starting cold"), 0u) << r.all();
  double random0 = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto cold = readJson(dir_ + "/cold." + std::to_string(rank) + ".json");
    auto warm = readJson(dir_ + "/warm." + std::to_string(rank) + ".json");
    ASSERT_FALSE(warm.empty());
    // Fresh seeds per process, as cold processes draw them.
    if (rank == 0)
      random0 = warm["random"].get<double>();
    else
      EXPECT_NE(warm["random"].get<double>(), random0);
    cold.erase("random");
    warm.erase("random");
    cold["env"].erase("PROBE_MODE");
    warm["env"].erase("PROBE_MODE");
    EXPECT_EQ(warm, cold) << "rank " << rank << "\nwarm: " << warm.dump(1)
                          << "\ncold: " << cold.dump(1);
    EXPECT_EQ(warm["argv"][3], std::to_string(rank));
    EXPECT_TRUE(warm["parent_is_launch"].get<bool>());
    EXPECT_EQ(warm["pdeathsig"].get<int>(), SIGKILL);
    EXPECT_TRUE(warm["heartbeat"].get<bool>());
    EXPECT_EQ(warm["threads"].get<int>(), 1);
  }
}

TEST_F(WarmWorkers, AModuleWithRelativeImportsRunsAsUnderDashM) {
  RunOptions o;
  o.cwd = kWarm;
  auto r = both({"-m", "pkg.main", "x"}, o);
  ASSERT_EQ(cold_.exit_code, 0) << cold_.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("2 of 2 worker(s) forked"), std::string::npos) << r.all();
  for (int rank = 0; rank < 2; ++rank) {
    auto cold = readJson(dir_ + "/cold." + std::to_string(rank) + ".json");
    auto warm = readJson(dir_ + "/warm." + std::to_string(rank) + ".json");
    EXPECT_EQ(warm, cold) << "warm: " << warm.dump(1) << "\ncold: " << cold.dump(1);
    EXPECT_EQ(warm["sibling"], "relative import ok");
    EXPECT_EQ(warm["name"], "__main__");
  }
}

// The lines of rank 0's output on stderr, without the prefix.
std::string traceback(const std::string& err) {
  std::string out;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("[default0]:", 0) == 0) out += line.substr(11) + "\n";
  return out;
}

TEST_F(WarmWorkers, ExitCodesAndTracebacksAreAColdStartsOwn) {
  RunOptions o;
  o.env["PROBE_EXIT_1"] = "3";
  auto r = both({kWarm + "/probe.py"}, o);
  EXPECT_NE(cold_.err.find("exitcode  : 3"), std::string::npos) << cold_.all();
  EXPECT_NE(r.err.find("exitcode  : 3"), std::string::npos) << r.all();
  EXPECT_EQ(r.exit_code, cold_.exit_code);

  // One rank: with two, the first to fail has the other stopped, sometimes before it printed.
  auto crash = both({kWarm + "/crash.py"}, {}, 1);
  EXPECT_EQ(crash.exit_code, cold_.exit_code) << crash.all();
  std::string warm_tb = traceback(crash.err), cold_tb = traceback(cold_.err);
  EXPECT_NE(warm_tb.find("RuntimeError: boom from inner"), std::string::npos) << crash.all();
  EXPECT_EQ(warm_tb, cold_tb);
  EXPECT_EQ(crash.err.find("warm template"), std::string::npos) << crash.all();
  EXPECT_NE(crash.err.find("exitcode  : 1"), std::string::npos) << crash.all();
}

TEST_F(WarmWorkers, ASignalEndsAWarmWorkerAsItEndsACold) {
  // The worker's own SIGTERM: Python leaves its default action, so the worker dies by it.
  auto r = both({kWarm + "/probe.py"}, {}, 1);
  ASSERT_EQ(r.exit_code, 0);
  std::string script = dir_ + "/term.py";
  std::ofstream(script) << "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n";
  auto t = both({script}, {}, 1);
  EXPECT_NE(cold_.err.find("signal 15 (SIGTERM)"), std::string::npos) << cold_.all();
  EXPECT_NE(t.err.find("signal 15 (SIGTERM)"), std::string::npos) << t.all();
  EXPECT_NE(t.err.find("1 of 1 worker(s) forked"), std::string::npos) << t.all();
}

TEST_F(WarmWorkers, FallsBackToColdStartsAndSaysWhyOnce) {
  // Not Python.
  auto r =
      run({kLaunch, "--nproc-per-node=2", "--prewarm=json", "--no-python", "/bin/true"}, opts("x"));
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(countOf(r.err,
                    "--prewarm: every worker starts cold: the program is not a Python "
                    "script or module run by launch's interpreter"),
            1u)
      << r.all();
  // A module that starts a thread when imported.
  auto o = opts("warm");
  o.env["PYTHONPATH"] = kWarm;
  r = run({kLaunch, "--nproc-per-node=2", "--prewarm=threaded", kWarm + "/probe.py"}, o);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(countOf(r.err,
                    "--prewarm: every worker starts cold: the template has 2 threads after "
                    "importing threaded"),
            1u)
      << r.all();
  EXPECT_EQ(countOf(r.out, "done"), 2u) << r.all();
  // CUDA initialised while importing (a stand-in torch: no GPU here; tests/gpu/ does it for real).
  o.env["PYTHONPATH"] = kWarm + "/fake_cuda";
  r = run({kLaunch, "--nproc-per-node=2", "--prewarm=torch", kWarm + "/probe.py"}, o);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(countOf(r.err, "every worker starts cold: CUDA was initialised while importing"), 1u)
      << r.all();
  // A module that does not exist.
  r = run({kLaunch, "--nproc-per-node=2", "--prewarm=no_such_module_here", kWarm + "/probe.py"},
          opts("warm"));
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("importing the modules failed: ModuleNotFoundError: No module named "
                       "'no_such_module_here'"),
            std::string::npos)
      << r.all();
  // A bad name is a usage error before anything starts.
  r = run({kLaunch, "--prewarm=torch,,x", kWarm + "/probe.py"}, opts("x"));
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("--prewarm: '' is not a Python module name"), std::string::npos) << r.all();
}

TEST_F(WarmWorkers, ATemplateThatDiesIsReplacedAndTheRestartIsTimed) {
  std::string go = dir_ + "/go";
  auto o = opts("warm");
  o.env["GO"] = go;
  Background launch(
      {kLaunch, "--nproc-per-node=2", "--prewarm=json", "--max-restarts=1", kWarm + "/wait_go.py"},
      o);
  pid_t tmpl = -1;
  ASSERT_TRUE(eventually([&] { return (tmpl = templateOf(launch.pid())) > 0; }, 30s));
  // Wait until the workers are forked, then kill the template under them.
  ASSERT_TRUE(eventually(
      [&] { return launch.outputSoFar().find("forked from the template") != std::string::npos; },
      30s));
  kill(tmpl, SIGKILL);
  ASSERT_TRUE(eventually(
      [&] { return launch.outputSoFar().find("the template (ready) died") != std::string::npos; },
      30s));
  std::ofstream(go) << "go";
  auto r = launch.wait(60s);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("rank 1 attempt 1"), std::string::npos) << r.all();
  // The restarted group came from the new template, and its phases were said.
  EXPECT_TRUE(std::regex_search(r.err, std::regex("restart 1: stop [0-9.]+s, re-form [0-9.]+s, "
                                                  "start [0-9.]+s \\(2 warm\\)")))
      << r.all();
  EXPECT_NE(r.err.find("where each restart's time went"), std::string::npos) << r.all();
  EXPECT_FALSE(processAlive(tmpl));
}

TEST_F(WarmWorkers, TheTemplateNeverOutlivesLaunch) {
  auto o = opts("warm");
  o.env["GO"] = dir_ + "/never";
  Background launch({kLaunch, "--nproc-per-node=1", "--prewarm=json", kWarm + "/wait_go.py"}, o);
  pid_t tmpl = -1;
  ASSERT_TRUE(eventually([&] { return (tmpl = templateOf(launch.pid())) > 0; }, 30s));
  ASSERT_TRUE(eventually(
      [&] { return launch.outputSoFar().find("forked from the template") != std::string::npos; },
      30s));
  kill(launch.pid(), SIGKILL);
  launch.wait(10s);
  EXPECT_TRUE(eventually([&] { return !processAlive(tmpl); }, 10s));
}

// The real thing: torch imported once, a 2-rank Gloo DDP job whose rank 1 is SIGKILLed mid-step;
// the restarted ranks are forked from the template, resume from memory, and end with the weights
// of a run that never failed.
TEST_F(WarmWorkers, ATorchDdpJobKilledMidStepRestartsWarmAsIfItNeverFailed) {
  auto job = [&](const std::string& tag, std::vector<std::string> extra) {
    std::vector<std::string> argv = {kLaunch,
                                     "--nproc-per-node=2",
                                     "--max-restarts=1",
                                     "--prewarm=torch",
                                     kScripts + "/ckpt_train.py",
                                     "--steps",
                                     "12",
                                     "--ckpt-every",
                                     "5",
                                     "--step-sleep",
                                     "0.2",
                                     "--dir",
                                     dir_ + "/" + tag,
                                     "--out",
                                     dir_ + "/" + tag + ".pt"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto o = opts("x");
    o.timeout = 240s;
    return run(argv, o);
  };
  auto ref = job("ref", {});
  ASSERT_EQ(ref.exit_code, 0) << ref.all();
  auto r = job("kill", {"--kill-at", "8:1:step"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("2 of 2 worker(s) forked from the template (torch imported in"),
            std::string::npos)
      << r.all();
  EXPECT_NE(r.out.find("resumed from step 5 (memory)"), std::string::npos) << r.all();
  EXPECT_TRUE(std::regex_search(r.err, std::regex("restart 1: stop [0-9.]+s, re-form [0-9.]+s, "
                                                  "start [0-9.]+s \\(2 warm\\), first step "
                                                  "[0-9.]+s \\(checkpoint read [0-9.]+s\\): "
                                                  "[0-9.]+s in all")))
      << r.all();
  auto eq = run({DDPL_PYTHON, kScripts + "/ckpt_equal.py", dir_ + "/ref.pt", dir_ + "/kill.pt"});
  EXPECT_EQ(eq.exit_code, 0) << eq.all();
}

}  // namespace
