#include "launcher/agent/worker_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <fstream>

#include "launcher/cli/cli.h"
#include "launcher/gpu/gpu.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
using ddpl::UsageError;

TEST(WorkerEnv, TorchrunVariables) {
  WorldAssignment w;
  w.run_id = "job7";
  w.group_rank = 1;
  w.group_world_size = 3;
  w.rank_offset = 8;
  w.world_size = 16;
  w.master_addr = "10.0.0.1";
  w.master_port = 29511;
  WorkerContext c{2, 4, 1, 3, "trainer", "/logs/err.json"};
  auto env = buildWorkerEnv({{"PATH", "/bin"}, {"OMP_NUM_THREADS", "8"}}, w, c, {{"X", "1"}});
  EXPECT_EQ(env["RANK"], "10");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "16");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["ROLE_RANK"], "10");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "16");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29511");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(env["TORCHELASTIC_ERROR_FILE"], "/logs/err.json");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "8");  // the user's value wins
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["X"], "1");
}

TEST(WorkerEnv, OmpDefaultOnlyForSeveralWorkers) {
  WorldAssignment w;
  WorkerContext c;
  c.local_world_size = 1;
  EXPECT_EQ(buildWorkerEnv({}, w, c).count("OMP_NUM_THREADS"), 0u);
  c.local_world_size = 2;
  EXPECT_EQ(buildWorkerEnv({}, w, c)["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(buildWorkerEnv({{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}}, w, c)
                ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
}

TEST(WorkerEnv, LocalRankSubstitution) {
  auto out = substituteLocalRank({"/bin/prog", "--out=${local_rank}/x", "${local_rank}${local_rank}"}, 3);
  EXPECT_EQ(out, (std::vector<std::string>{"/bin/prog", "--out=3/x", "33"}));
}

class ResolveCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ddpl::testing::makeTempDir("resolve");
    std::ofstream(dir_ + "/train.py") << "print(1)\n";
    std::ofstream(dir_ + "/tool") << "#!/bin/sh\n";
    chmod((dir_ + "/tool").c_str(), 0755);
    std::ofstream(dir_ + "/script") << "print(1)\n";
    std::ofstream(dir_ + "/python3") << "#!/bin/sh\n";
    chmod((dir_ + "/python3").c_str(), 0755);
    env_ = {{"PATH", dir_ + ":/usr/bin:/bin"}};
  }
  LaunchOptions opts(const std::string& program, TargetKind kind = TargetKind::kAuto) {
    LaunchOptions o;
    o.program = program;
    o.program_args = {"a"};
    o.target_kind = kind;
    return o;
  }
  std::string dir_;
  Environment env_;
};

TEST_F(ResolveCommand, PythonFileRunsUnderPythonUnbuffered) {
  auto cmd = resolveCommand(opts(dir_ + "/train.py"), env_);
  EXPECT_EQ(cmd, (std::vector<std::string>{dir_ + "/python3", "-u", dir_ + "/train.py", "a"}));
}

TEST_F(ResolveCommand, PythonExecOverrides) {
  env_["PYTHON_EXEC"] = "/bin/sh";
  EXPECT_EQ(resolveCommand(opts(dir_ + "/train.py"), env_)[0], "/bin/sh");
  env_["PYTHON_EXEC"] = "/nonexistent/python";
  try {
    resolveCommand(opts(dir_ + "/train.py"), env_);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("PYTHON_EXEC"), std::string::npos);
  }
}

TEST_F(ResolveCommand, ExecutableRunsDirectly) {
  EXPECT_EQ(resolveCommand(opts(dir_ + "/tool"), env_),
            (std::vector<std::string>{dir_ + "/tool", "a"}));
  EXPECT_EQ(resolveCommand(opts("sh"), env_)[0], "/usr/bin/sh");
}

TEST_F(ResolveCommand, NonExecutableFileRunsUnderPython) {
  EXPECT_EQ(resolveCommand(opts(dir_ + "/script"), env_)[2], dir_ + "/script");
}

TEST_F(ResolveCommand, ModuleAndNoPython) {
  EXPECT_EQ(resolveCommand(opts("pkg.mod", TargetKind::kModule), env_),
            (std::vector<std::string>{dir_ + "/python3", "-u", "-m", "pkg.mod", "a"}));
  EXPECT_EQ(resolveCommand(opts("tool", TargetKind::kNoPython), env_)[0], dir_ + "/tool");
}

TEST_F(ResolveCommand, MissingProgramIsAClearError) {
  for (auto kind : {TargetKind::kAuto, TargetKind::kNoPython}) {
    try {
      resolveCommand(opts("no-such-prog-xyz", kind), env_);
      FAIL();
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("'no-such-prog-xyz'"), std::string::npos);
    }
  }
  EXPECT_THROW(resolveCommand(opts(dir_ + "/missing.py"), env_), UsageError);
  EXPECT_THROW(resolveCommand(opts(dir_), env_), UsageError);
}

TEST(Gpu, CudaVisibleDevices) {
  EXPECT_EQ(countVisible(4, "0,1"), 2);
  EXPECT_EQ(countVisible(4, ""), 0);
  EXPECT_EQ(countVisible(4, "0,1,-1,2"), 2);
  EXPECT_EQ(countVisible(4, "1,99999999999,2"), 1);  // out of range: invalid, ends the list
  EXPECT_EQ(countVisible(2, "0,1,2,3"), 2);
  EXPECT_EQ(countVisible(8, "GPU-abc,GPU-def"), 2);
  EXPECT_EQ(countVisible(0, "0"), 0);
}

TEST(Gpu, DiscoveryNeverFails) {
  auto info = discoverGpus(nullptr, true);
  EXPECT_GE(info.physical, 0);
  EXPECT_FALSE(info.source.empty());
  EXPECT_EQ(discoverGpus("", false).visible, 0);
}

// --virtual-local-rank as torchrun 2.15's _set_local_rank_env: LOCAL_RANK=0, and
// CUDA_VISIBLE_DEVICES the local rank's entry of launch's own HIP_VISIBLE_DEVICES (when set and
// not empty; then HIP's too), else of CUDA_VISIBLE_DEVICES (when set, even empty), else the
// local rank's index; RANK and the rest as without it.
TEST(WorkerSpec, VirtualLocalRankNarrowsTheDevices) {
  LaunchOptions o;
  o.virtual_local_rank = true;
  WorldAssignment w;
  w.world_size = 8;
  w.rank_offset = 4;
  auto env = [&](const Environment& base, int lr) {
    return buildWorkerEnv(base, w, workerContext(o, lr, 4, 0, ""));
  };
  auto none = env({}, 2);
  EXPECT_EQ(none["LOCAL_RANK"], "0");
  EXPECT_EQ(none["CUDA_VISIBLE_DEVICES"], "2");
  EXPECT_EQ(none["RANK"], "6");
  EXPECT_EQ(none["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(none.count("HIP_VISIBLE_DEVICES"), 0u);
  // Entries are taken as written (UUIDs, MIG names), spaces stripped.
  auto listed = env({{"CUDA_VISIBLE_DEVICES", "3, GPU-5a1b ,7,1"}}, 1);
  EXPECT_EQ(listed["CUDA_VISIBLE_DEVICES"], "GPU-5a1b");
  EXPECT_EQ(listed["LOCAL_RANK"], "0");
  auto hip = env({{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}, {"HIP_VISIBLE_DEVICES", "4,5,6,7"}}, 3);
  EXPECT_EQ(hip["CUDA_VISIBLE_DEVICES"], "7");
  EXPECT_EQ(hip["HIP_VISIBLE_DEVICES"], "7");
  auto empty_hip = env({{"CUDA_VISIBLE_DEVICES", "0,1,2,3"}, {"HIP_VISIBLE_DEVICES", ""}}, 3);
  EXPECT_EQ(empty_hip["CUDA_VISIBLE_DEVICES"], "3");
  EXPECT_EQ(empty_hip["HIP_VISIBLE_DEVICES"], "");
  // Set but empty: one empty entry, as Python's "".split(",").
  EXPECT_EQ(env({{"CUDA_VISIBLE_DEVICES", ""}}, 0)["CUDA_VISIBLE_DEVICES"], "");
  try {
    checkVirtualDevices({{"CUDA_VISIBLE_DEVICES", "3,5"}}, 4);
    ADD_FAILURE() << "4 local ranks on 2 devices were accepted";
  } catch (const ddpl::UsageError& e) {
    std::string why = e.what();
    EXPECT_NE(why.find("CUDA_VISIBLE_DEVICES='3,5' names 2 device(s), none for local rank 2"),
              std::string::npos)
        << why;
  }
  EXPECT_NO_THROW(checkVirtualDevices({{"CUDA_VISIBLE_DEVICES", "3,5"}}, 2));
  EXPECT_NO_THROW(checkVirtualDevices({}, 64));
  // Without the flag: the real local rank, the devices inherited untouched.
  o.virtual_local_rank = false;
  auto plain = env({{"CUDA_VISIBLE_DEVICES", "3,5"}}, 1);
  EXPECT_EQ(plain["LOCAL_RANK"], "1");
  EXPECT_EQ(plain["CUDA_VISIBLE_DEVICES"], "3,5");
}

// torchrun 2.15 exports its --signals-to-handle to the workers (os.environ, inherited).
TEST(WorkerSpec, SignalsToHandleReachTheWorkers) {
  LaunchOptions o;
  o.signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  WorldAssignment w;
  auto env = buildWorkerEnv({{"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGUSR2"}}, w,
                            workerContext(o, 0, 1, 0, ""));
  EXPECT_EQ(env["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
  o.signals_to_handle = {SIGUSR1, SIGTERM};
  EXPECT_EQ(buildWorkerEnv({}, w, workerContext(o, 0, 1, 0, ""))["TORCHELASTIC_SIGNALS_TO_HANDLE"],
            "SIGUSR1,SIGTERM");
}
