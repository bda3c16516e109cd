// launcher/warm/warm_plan.h: which workers may be forked from the template, and the environment
// rules that keep a forked worker's start equal to a cold one.
#include "launcher/warm/warm_plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "tests/common/subprocess.h"

namespace ddpl::launcher::warm {
namespace {

TEST(WarmPlan, ParsesModuleLists) {
  EXPECT_EQ(parseModules("--prewarm", "torch"), std::vector<std::string>{"torch"});
  EXPECT_EQ(parseModules("--prewarm", "torch,numpy,torch.distributed"),
            (std::vector<std::string>{"torch", "numpy", "torch.distributed"}));
  EXPECT_TRUE(parseModules("--prewarm", "").empty());
  EXPECT_TRUE(parseModules("--prewarm", "off").empty());
  for (const char* bad :
       {"torch,", ",torch", "to rch", "1torch", "torch..nn", ".torch", "torch;import os", "a,,b"})
    EXPECT_THROW(parseModules("--prewarm", bad), UsageError) << bad;
  try {
    parseModules("--prewarm", "torch,nu-mpy");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'nu-mpy' is not a Python module name"),
              std::string::npos);
  }
}

TEST(WarmPlan, OnlyLaunchsOwnPythonCommandsAreForked) {
  std::string dir = testing::makeTempDir("warm-plan");
  std::string script = dir + "/train.py";
  std::ofstream(script) << "print('hi')\n";
  std::string zip = dir + "/app.pyz";
  std::ofstream(zip) << "PK\x03\x04rest";
  std::string pyc = dir + "/train.pyc";
  std::ofstream(pyc) << std::string("\xa7\x0d\r\n", 4) << "xxxx";

  EXPECT_EQ(whyNotWarm({"/usr/bin/python3", "-u", script, "--lr", "1"}, true, false), std::nullopt);
  EXPECT_EQ(whyNotWarm({"/usr/bin/python3", "-u", "-m", "pkg.main", "x"}, true, false),
            std::nullopt);
  // --no-python, an executable, or options launch did not choose.
  EXPECT_TRUE(whyNotWarm({"/usr/bin/python3", "-u", script}, false, false));
  EXPECT_TRUE(whyNotWarm({"/bin/true"}, true, false));
  EXPECT_NE(whyNotWarm({"/usr/bin/python3", "-O", script}, true, false)->find("-O"),
            std::string::npos);
  EXPECT_TRUE(whyNotWarm({"/usr/bin/python3", "-u", "-X", "dev", script}, true, false));
  EXPECT_TRUE(whyNotWarm({"/usr/bin/python3", "-u", "-m"}, true, false));
  EXPECT_TRUE(whyNotWarm({"/usr/bin/python3", "-u", "-m", "a b"}, true, false));
  // What python runs but the template does not: directories, zips, bytecode.
  EXPECT_NE(whyNotWarm({"/usr/bin/python3", "-u", dir}, true, false)->find("not a regular file"),
            std::string::npos);
  EXPECT_NE(whyNotWarm({"/usr/bin/python3", "-u", zip}, true, false)->find("zip"),
            std::string::npos);
  EXPECT_NE(whyNotWarm({"/usr/bin/python3", "-u", pyc}, true, false)->find(".pyc"),
            std::string::npos);
  EXPECT_NE(whyNotWarm({"/usr/bin/python3", "-u", script}, true, true)->find("--numa-binding"),
            std::string::npos);
}

TEST(WarmPlan, VariablesReadAtStartMustMatchTheTemplates) {
  for (const char* name : {"PYTHONPATH", "PYTHONHASHSEED", "LD_PRELOAD", "OMP_NUM_THREADS",
                           "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LC_ALL", "LANG",
                           "TORCH_SHOW_CPP_STACKTRACES", "MALLOC_ARENA_MAX", "PATH"})
    EXPECT_TRUE(readAtStart(name)) << name;
  for (const char* name :
       {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
        "TORCHELASTIC_RESTART_COUNT", "DDPL_HEARTBEAT_FD", "NCCL_DEBUG"})
    EXPECT_FALSE(readAtStart(name)) << name;

  Environment t = {{"PATH", "/bin"}, {"OMP_NUM_THREADS", "1"}, {"HOME", "/root"}};
  Environment w = t;
  w["RANK"] = "3";
  w["MASTER_PORT"] = "29500";
  EXPECT_EQ(startupDifference(t, w), std::nullopt);
  w["OMP_NUM_THREADS"] = "4";
  EXPECT_EQ(startupDifference(t, w), "OMP_NUM_THREADS: '4' in the worker, '1' in the template");
  w = t;
  w["PYTHONPATH"] = "/x";
  EXPECT_EQ(startupDifference(t, w), "PYTHONPATH: '/x' in the worker, <unset> in the template");
  w = t;
  w.erase("PATH");
  EXPECT_EQ(startupDifference(t, w), "PATH: <unset> in the worker, '/bin' in the template");
}

TEST(WarmPlan, TheTemplateGetsWhatEveryWorkerGetsAndReadsAtStart) {
  Environment base = {{"PATH", "/bin"}, {"USER", "me"}};
  Environment first = base;
  first["OMP_NUM_THREADS"] = "1";  // launch's default for several workers
  first["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  first["RANK"] = "0";
  first["MASTER_PORT"] = "29500";
  Environment t = templateEnvironment(base, first, {{"DDPL_LAUNCH_MARKER", "m"}});
  EXPECT_EQ(t, (Environment{{"PATH", "/bin"},
                            {"USER", "me"},
                            {"OMP_NUM_THREADS", "1"},
                            {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                            {"DDPL_LAUNCH_MARKER", "m"}}));
  EXPECT_EQ(startupDifference(t, first), std::nullopt);
}

}  // namespace
}  // namespace ddpl::launcher::warm
