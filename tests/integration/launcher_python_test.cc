// Real PyTorch Python scripts, unchanged, under `launch` (the pinned torch from .venv).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "tests/common/subprocess.h"

using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kScripts = std::string(DDPL_SOURCE_DIR) + "/tests/python";
}  // namespace

TEST(LaunchPython, FourRankGlooDdpScriptRunsUnchanged) {
  RunOptions o;
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  o.timeout = 300s;
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=4", kScripts + "/ddp_gloo.py"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  std::string checksum;
  for (int rank = 0; rank < 4; ++rank) {
    std::string tag = "[default" + std::to_string(rank) + "]:DDP OK rank=" + std::to_string(rank) +
                      " world=4 local_rank=" + std::to_string(rank) + " group_rank=0 checksum=";
    auto pos = r.out.find(tag);
    ASSERT_NE(pos, std::string::npos) << r.out;
    std::string sum = r.out.substr(pos + tag.size(), r.out.find('\n', pos) - pos - tag.size());
    if (rank == 0) checksum = sum;
    EXPECT_EQ(sum, checksum) << "ranks disagree after DDP training";
  }
}

// Cold, and forked from the warm template (issue 30: the module imports torch, prewarmed).
TEST(LaunchPython, RecordDecoratorErrorReachesTheReport) {
  for (std::string prewarm : {"", "--prewarm=torch"}) {
    RunOptions o;
    o.env["PYTHON_EXEC"] = DDPL_PYTHON;
    o.timeout = 180s;
    std::vector<std::string> argv = {kLaunch, "--nproc-per-node=2"};
    if (!prewarm.empty()) argv.push_back(prewarm);
    argv.push_back(kScripts + "/record_error.py");
    auto r = run(argv, o);
    EXPECT_EQ(r.exit_code, 1) << r.all();
    EXPECT_EQ(r.err.find("2 of 2 worker(s) forked from the template") != std::string::npos,
              !prewarm.empty())
        << r.all();
    auto pos = r.err.find("Root Cause");
    ASSERT_NE(pos, std::string::npos) << r.err;
    std::string root = r.err.substr(pos);
    EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
    EXPECT_NE(root.find("ValueError: learning rate must be positive, got -0.5"), std::string::npos)
        << root;
    EXPECT_NE(root.find("traceback :"), std::string::npos) << root;
    EXPECT_NE(root.find("record_error.py"), std::string::npos) << root;
    EXPECT_EQ(root.find("warm template"), std::string::npos) << root;
  }
}

// A 4-rank Gloo job where rank 2 stops before an all-reduce and the others wait for it inside
// the collective: launch finds the hang within --hang-timeout, saves every rank's stacks, names
// rank 2 and its Python frame, and restarts the group, which then finishes.
TEST(LaunchHang, HungRankIsFoundWithStacksAndTheGroupRestarts) {
  std::string logs = makeTempDir("hang");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"HANG_RANK", "2"}, {"HANG_STEP", "3"},
           {"OMP_NUM_THREADS", "1"}};
  o.timeout = 240s;
  // 6 s, not less: ranks idle while they bootstrap count toward the timeout (idle by rate,
  // issue 33), and a loaded machine (the sanitizer suite) can take seconds for that. The
  // restarted group's teardown after its last step does not count (issue 44: ddplaunch.done()).
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=4", "--hang-timeout=6",
                "--max-restarts=1", "--log-dir", logs, "--rdzv-id=hang",
                kScripts + "/hang_gloo.py"},
               o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("likely culprit: rank(s) 2 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stuck_in_data_loading (hang_gloo.py:"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("last step of each rank: rank 0: step 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group: restart 1 of 1"), std::string::npos) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string stacks = readFile(logs + "/hang/attempt_0/" + std::to_string(rank) + "/stacks.txt");
    EXPECT_NE(stacks.find("py-spy dump --pid"), std::string::npos) << stacks;
    // The others wait in the collective; rank 2 in its own code.
    EXPECT_NE(stacks.find(rank == 2 ? "stuck_in_data_loading" : "all_reduce"), std::string::npos)
        << rank << ": " << stacks;
  }
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " finished"), std::string::npos) << r.out;
}

TEST(LaunchHang, OutOfRestartsExitsWithTheHangCodeAndReport) {
  RunOptions o;
  // launch keeps the stacks a hang report names (issue 33): in a directory of the test's own.
  std::string tmp = makeTempDir("hang_tmp");
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"HANG_RANK", "1"}, {"HANG_STEP", "2"},
           {"OMP_NUM_THREADS", "1"}, {"TMPDIR", tmp}};
  o.timeout = 240s;
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=2", "--hang-timeout=6",
                kScripts + "/hang_gloo.py"},
               o);
  EXPECT_EQ(r.exit_code, 124) << r.all();
  EXPECT_NE(r.err.find("hung: no step for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank      : 1 (local_rank: 1)"), std::string::npos) << r.err;
  std::filesystem::remove_all(tmp);
}

// Issue 44: the teardown after a rank's last step (a final save, destroy_process_group, the
// interpreter's exit) is no hang, however long it takes on a loaded machine. Ranks that
// reported their last step (ddplaunch.done(), or by exiting their interpreter) and then take
// more than twice --hang-timeout to exit are not hung, and the job succeeds. Without that
// report, the same silence is a hang: launch cannot tell the two apart.
TEST(LaunchHang, TeardownAfterTheReportedLastStepIsNoHang) {
  std::string tmp = makeTempDir("teardown_tmp");  // for the stacks launch keeps after a hang
  for (std::string how : {"done", "atexit", "none"}) {
    RunOptions o;
    o.env = {{"PYTHON_EXEC", DDPL_PYTHON},
             {"TEARDOWN", how},
             {"TEARDOWN_SECONDS", "5"},
             {"TMPDIR", tmp}};
    o.timeout = 120s;
    auto r = run({kLaunch, "--nproc-per-node=2", "--hang-timeout=2", "--monitor-interval=0.05",
                  kScripts + "/slow_teardown.py"},
                 o);
    if (how == "none") {
      EXPECT_EQ(r.exit_code, 124) << how << "\n" << r.all();
      EXPECT_NE(r.err.find("hung: no step for"), std::string::npos) << how << "\n" << r.err;
      continue;
    }
    EXPECT_EQ(r.exit_code, 0) << how << "\n" << r.all();
    EXPECT_EQ(r.err.find("hung"), std::string::npos) << how << "\n" << r.err;
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " torn down after 5"),
                std::string::npos)
          << how << "\n"
          << r.out;
  }
  std::filesystem::remove_all(tmp);
}

// A rank stuck in its teardown for good is still found: --hang-finish-timeout after it
// reported its last step (bounded, however long the teardown would take).
TEST(LaunchHang, TeardownStuckForGoodIsHungAtTheFinishTimeout) {
  std::string tmp = makeTempDir("teardown_tmp");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON},
           {"TEARDOWN", "done"},
           {"TEARDOWN_SECONDS", "600"},
           {"TMPDIR", tmp}};
  o.timeout = 120s;
  auto start = std::chrono::steady_clock::now();
  auto r = run({kLaunch, "--nproc-per-node=1", "--hang-timeout=1", "--hang-finish-timeout=3",
                "--monitor-interval=0.05", kScripts + "/slow_teardown.py"},
               o);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_EQ(r.exit_code, 124) << r.all();
  EXPECT_NE(r.err.find("hung: not exited 3."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("after reporting its last step, step 5 (limit 3.0s for teardown)"),
            std::string::npos)
      << r.err;
  EXPECT_LT(took.count(), 60000) << r.err;
  std::filesystem::remove_all(tmp);
}

// Without --hang-timeout, a program that reports no steps is never watched: a silent wait is
// not a hang.
TEST(LaunchHang, SilentProgramWithoutStepsIsNotHungWithoutTheFlag) {
  auto r = run({kLaunch, "--nproc-per-node=2", "--hang-first-timeout=1", "--monitor-interval=0.05",
                "/bin/sh", "-c", "sleep 3"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(r.err.find("hung"), std::string::npos) << r.err;
  // With the flag, the same silence is a hang.
  std::string tmp = makeTempDir("hang_tmp");  // for the stacks launch keeps
  RunOptions o;
  o.env = {{"TMPDIR", tmp}};
  auto flagged = run({kLaunch, "--nproc-per-node=1", "--hang-timeout=1", "--monitor-interval=0.05",
                      "/bin/sh", "-c", "sleep 30"},
                     o);
  EXPECT_EQ(flagged.exit_code, 124) << flagged.all();
  EXPECT_NE(flagged.err.find("no CPU time and no output"), std::string::npos) << flagged.err;
  std::filesystem::remove_all(tmp);
}

// `launch stacks RUN_DIR` snapshots a running job's stacks without stopping it.
TEST(LaunchStacks, OnDemandSnapshotLeavesTheJobRunning) {
  std::string logs = makeTempDir("ondemand");
  std::string dir = makeTempDir("ondemand-out");
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"OUT_DIR", dir}};
  Background bg({kLaunch, "--nproc-per-node=2", "--log-dir", logs, "--rdzv-id=od",
                 std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/wait_for_file.py"},
                o);
  ASSERT_TRUE(eventually([&] {
    return bg.outputSoFar().find("launch stacks") != std::string::npos &&
           readFile(dir + "/ready.0") == "ready" && readFile(dir + "/ready.1") == "ready";
  }, 60s)) << bg.outputSoFar();
  auto r = run({kLaunch, "stacks", logs + "/od"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("ok " + logs + "/od/snapshots/"), std::string::npos) << r.out;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " (local rank " + std::to_string(rank) +
                         ", pid "),
              std::string::npos)
        << r.out;
  EXPECT_NE(r.out.find("wait_here (wait_for_file.py:"), std::string::npos) << r.out;
  // Still running: let it finish.
  std::ofstream(dir + "/go") << "";
  auto done = bg.wait(60s);
  EXPECT_EQ(done.exit_code, 0) << done.all();
  EXPECT_EQ(run({kLaunch, "stacks", logs + "/od"}).exit_code, 1);  // nobody answers any more
}

namespace {

// A torch installation to hold launch against: its interpreter and version.
struct TorchInstall {
  std::string python;
  std::string version;
  std::string torchrun() const { return python.substr(0, python.rfind('/')) + "/torchrun"; }
};

// "2.15.0" < "2.9.1" as numbers, not as text.
bool olderVersion(const std::string& a, const std::string& b) {
  std::istringstream x(a), y(b);
  std::string p, q;
  while (true) {
    bool more_a = static_cast<bool>(std::getline(x, p, '.'));
    bool more_b = static_cast<bool>(std::getline(y, q, '.'));
    if (!more_a || !more_b) return !more_a && more_b;
    if (p != q) {
      try {
        return std::stoi(p) < std::stoi(q);
      } catch (const std::exception&) {
        return p < q;
      }
    }
  }
}

// The pinned torch (DDPL_PYTHON's environment) and every newer one installed beside it as
// .venv-torch-<version> (scripts/gpu_kit_check.sh's convention), oldest first. A worktree's
// .venv may be a link to the main checkout's: its siblings are found where it points.
std::vector<TorchInstall> torchInstalls() {
  std::vector<TorchInstall> out{{DDPL_PYTHON, "pinned"}};
  std::error_code ec;
  auto venv = std::filesystem::canonical(
      std::filesystem::path(DDPL_PYTHON).parent_path().parent_path(), ec);
  if (ec) return out;
  std::vector<TorchInstall> newer;
  for (const auto& entry : std::filesystem::directory_iterator(venv.parent_path(), ec)) {
    std::string name = entry.path().filename().string();
    const std::string prefix = ".venv-torch-";
    if (name.rfind(prefix, 0) != 0) continue;
    TorchInstall t{(entry.path() / "bin" / "python").string(), name.substr(prefix.size())};
    if (std::filesystem::exists(t.python) && std::filesystem::exists(t.torchrun()))
      newer.push_back(t);
  }
  std::sort(newer.begin(), newer.end(), [](const TorchInstall& a, const TorchInstall& b) {
    return olderVersion(a.version, b.version);
  });
  out.insert(out.end(), newer.begin(), newer.end());
  return out;
}

// Every option string of that torchrun's parser, and whether it takes a value.
std::vector<std::pair<std::string, bool>> torchrunOptions(const TorchInstall& t) {
  auto r = run({t.python, "-c",
                "from torch.distributed.run import get_args_parser\n"
                "for a in get_args_parser()._actions:\n"
                "    for s in a.option_strings:\n"
                "        print(s, 0 if a.nargs == 0 else 1)\n"},
               RunOptions{{}, {}, 120s, ""});
  EXPECT_EQ(r.exit_code, 0) << t.python << ": " << r.all();
  std::vector<std::pair<std::string, bool>> out;
  std::istringstream in(r.out);
  std::string flag;
  int value = 0;
  while (in >> flag >> value) out.emplace_back(flag, value != 0);
  return out;
}

std::map<std::string, std::string> envOf(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);)
    if (auto eq = line.find('='); eq != std::string::npos)
      out[line.substr(0, eq)] = line.substr(eq + 1);
  return out;
}

// The first file called `name` under `dir` (torchrun's run directory has a random suffix).
std::string findFile(const std::string& dir, const std::string& name) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->path().filename() == name) return it->path().string();
  return "";
}

std::multiset<std::string> lineSet(const std::string& text) {
  std::multiset<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.insert(l);
  return lines;
}

}  // namespace

// Issue 47: every option of the pinned torchrun's parser, and of each newer torch installed
// beside it, is one launch knows: accepted, or refused saying what to use instead, never an
// "unknown option".
TEST(LaunchTorchrunFlags, EveryOptionOfTheInstalledTorchrunsIsKnown) {
  for (const auto& t : torchInstalls()) {
    auto options = torchrunOptions(t);
    EXPECT_GE(options.size(), 40u) << t.version;
    for (const auto& [flag, takes_value] : options) {
      std::vector<std::string> argv{kLaunch, flag};
      if (takes_value) argv.push_back("1");
      argv.push_back("--help");
      auto r = run(argv);
      EXPECT_EQ(r.err.find("unknown option"), std::string::npos)
          << "torch " << t.version << ": " << flag << ": " << r.err;
      EXPECT_EQ(r.err.find("ambiguous option"), std::string::npos)
          << "torch " << t.version << ": " << flag << ": " << r.err;
    }
  }
}

// Issue 47: the same job under the newest torchrun installed (one with --virtual-local-rank,
// 2.11 or later) and under launch gives each worker the same torchrun variables (added,
// changed or removed against the parent's environment; launch's own DDPL_* aside) and the
// same filtered logs.
TEST(LaunchTorchrunFlags, SameWorkerEnvironmentAndFilteredLogsAsTheNewestTorchrun) {
  const TorchInstall* newest = nullptr;
  auto installs = torchInstalls();
  for (const auto& t : installs) {
    auto options = torchrunOptions(t);
    if (std::any_of(options.begin(), options.end(),
                    [](const auto& o) { return o.first == "--virtual-local-rank"; }))
      newest = &t;
  }
  if (!newest)
    GTEST_SKIP() << "no torchrun with --virtual-local-rank (torch 2.11+) is installed beside "
                 << DDPL_PYTHON << " as .venv-torch-<version>; the pinned torch has none";
  std::cout << "comparing with torch " << newest->version << "'s torchrun: " << newest->torchrun()
            << "\n";
  std::string dir = makeTempDir("torchrun-cmp");
  RunOptions o;
  o.env = {{"CUDA_VISIBLE_DEVICES", "3,5"}, {"PYTHONDONTWRITEBYTECODE", "1"}};
  o.unset_env = {"HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE"};
  o.timeout = 180s;
  auto job = [&](const std::string& launcher, const std::string& tag) {
    std::filesystem::create_directories(dir + "/" + tag);
    return run({launcher, "--nproc-per-node=2", "--virtual-local-rank", "--tee=3", "--log-dir",
                dir + "/" + tag, "--duplicate-stdout-filters=apple,or,,ange",
                "--duplicate-stderr-filters=kiwi", "--no-python", "/bin/sh", "-c",
                "env > " + dir + "/" + tag +
                    ".${local_rank}.env; echo \"apple ${local_rank}\"; "
                    "echo banana; echo 'or,ange'; echo kiwi >&2; echo apple >&2"},
               o);
  };
  auto theirs = job(newest->torchrun(), "torchrun");
  ASSERT_EQ(theirs.exit_code, 0) << theirs.all();
  auto ours = job(kLaunch, "launch");
  ASSERT_EQ(ours.exit_code, 0) << ours.all();

  // The parent's environment as both launchers saw it.
  std::map<std::string, std::string> parent;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (auto eq = kv.find('='); eq != std::string::npos)
      parent[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& k : o.unset_env) parent.erase(k);
  for (const auto& [k, v] : o.env) parent[k] = v;
  // Where a worker's environment differs from the parent's: "=value", or "<unset>".
  auto changes = [&](const std::map<std::string, std::string>& env) {
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : env) {
      auto p = parent.find(k);
      if (p == parent.end() || p->second != v) out[k] = "=" + v;
    }
    for (const auto& [k, v] : parent)
      if (!env.count(k)) out[k] = "<unset>";
    out.erase("LC_CTYPE");  // Python's own locale coercion (PEP 538) in torchrun's process
    out.erase("_");         // the last command a shell ran
    for (auto it = out.begin(); it != out.end();)
      it = it->first.rfind("DDPL_", 0) == 0 ? out.erase(it) : std::next(it);
    // launch's one addition while it looks for hangs, documented beside the torchrun variables
    // (docs/user-guide.md): torch's flight recorder, which names a hang's collective (issue 48).
    if (out.count("TORCH_FR_BUFFER_SIZE") && out["TORCH_FR_BUFFER_SIZE"] == "=64")
      out.erase("TORCH_FR_BUFFER_SIZE");
    // Per run: the store's address, the run id and the error file's path.
    for (const char* k :
         {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"})
      if (out.count(k)) out[k] = "<per run>";
    return out;
  };
  for (int lr = 0; lr < 2; ++lr) {
    std::string n = std::to_string(lr);
    auto t = changes(envOf(dir + "/torchrun." + n + ".env"));
    auto l = changes(envOf(dir + "/launch." + n + ".env"));
    EXPECT_EQ(t.at("LOCAL_RANK"), "=0");
    EXPECT_EQ(t.at("CUDA_VISIBLE_DEVICES"), lr == 0 ? "=3" : "=5");
    for (const auto& [k, v] : t) {
      auto it = l.find(k);
      EXPECT_TRUE(it != l.end() && it->second == v)
          << "local rank " << lr << ": torch " << newest->version << "'s torchrun gives " << k << v
          << ", launch " << (it == l.end() ? "leaves it as the parent has it" : it->second);
    }
    for (const auto& [k, v] : l)
      EXPECT_TRUE(t.count(k)) << "local rank " << lr << ": launch gives " << k << v << ", torch "
                              << newest->version << "'s torchrun does not";
  }
  for (const char* name : {"filtered_stdout.log", "filtered_stderr.log"}) {
    std::string t = findFile(dir + "/torchrun", name), l = findFile(dir + "/launch", name);
    ASSERT_FALSE(t.empty()) << name;
    ASSERT_FALSE(l.empty()) << name;
    EXPECT_EQ(lineSet(readFile(l)), lineSet(readFile(t))) << name;
    EXPECT_EQ(lineSet(readFile(l)).size(), std::string(name) == "filtered_stdout.log" ? 4u : 2u);
  }
}
