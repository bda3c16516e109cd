// The MPI launch (issue 7) on real processes: the same binaries under OpenMPI's mpirun, under
// `launch --launcher=mpi`, and under `launch`. Torch-free driver; the ranks are worker_rank and
// mpi_rank (tests/integration/mpi_rank_main.cc). Cases that need mpirun skip without it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/common/subprocess.h"

namespace dt = ddpl::testing;

namespace {

const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kMpiRank = std::string(DDPL_TEST_BIN_DIR) + "/mpi_rank";
const std::string kWorkerRank = std::string(DDPL_TEST_BIN_DIR) + "/worker_rank";

std::string findMpirun() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = dirs.find(':', start);
    const std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/mpirun";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

#define REQUIRE_MPIRUN()                                                                                  \
  if (findMpirun().empty()) GTEST_SKIP() << "mpirun not found in PATH: these tests need OpenMPI "        \
                                            "(apt-get install openmpi-bin libopenmpi-dev)"

// OpenMPI 4.1 refuses root without --allow-run-as-root, and more ranks than cores without
// --oversubscribe (this machine may have two cores).
std::vector<std::string> mpirun(int np) {
  std::vector<std::string> argv{findMpirun()};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), {"--oversubscribe", "-np", std::to_string(np)});
  return argv;
}

// No launcher variables from whoever runs the tests.
dt::RunOptions options(std::chrono::seconds timeout = std::chrono::seconds(120)) {
  dt::RunOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}, {"DDPL_BACKEND", "gloo"}};
  o.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "DDPL_BOOTSTRAP", "DDPL_MPIRUN", "PET_NPROC_PER_NODE", "PET_NNODES"};
  o.timeout = timeout;
  return o;
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string writeFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

TEST(MpiWorker, DdpMatchesSingleProcessReferenceUnderMpirun) {
  REQUIRE_MPIRUN();
  // worker_rank's own check: 2 ranks of DDP == one process with the global batch.
  const auto r = dt::run(concat(mpirun(2), {kWorkerRank, "equivalence"}), options());
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.all().find("rank 0 max |ddp - reference|"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("rank 1 max |ddp - reference|"), std::string::npos) << r.all();
  // Bootstrapped through MPI, not through some default address.
  EXPECT_NE(r.all().find("address shared through MPI"), std::string::npos) << r.all();
}

TEST(MpiWorker, SameParametersUnderLaunchMpirunAndLaunchMpi) {
  REQUIRE_MPIRUN();
  const std::string dir = dt::makeTempDir("ddpl-mpi");
  for (const char* sub : {"/launch", "/mpirun", "/launch-mpi"}) ::mkdir((dir + sub).c_str(), 0755);

  const auto native = dt::run({kLaunch, "--standalone", "--nproc-per-node=2", kMpiRank, "train", dir + "/launch"},
                              options());
  ASSERT_EQ(native.exit_code, 0) << native.all();
  const auto plain = dt::run(concat(mpirun(2), {kMpiRank, "train", dir + "/mpirun"}), options());
  ASSERT_EQ(plain.exit_code, 0) << plain.all();
  // One slot for two ranks: launch must add --oversubscribe itself for this to run.
  const std::string hostfile = writeFile(dir + "/hosts", "# this machine\nlocalhost slots=1\n");
  const auto viaLaunch = dt::run({kLaunch, "--launcher=mpi", "--hostfile", hostfile, "--nproc-per-node", "2",
                                  kMpiRank, "train", dir + "/launch-mpi"},
                                 options());
  ASSERT_EQ(viaLaunch.exit_code, 0) << viaLaunch.all();
  EXPECT_NE(viaLaunch.err.find("--oversubscribe"), std::string::npos) << viaLaunch.err;

  EXPECT_EQ(dt::readFile(dir + "/launch/rank.1"), "rank 1 world 2 local 1/2 bootstrap env backend gloo\n");
  EXPECT_EQ(dt::readFile(dir + "/mpirun/rank.1"), "rank 1 world 2 local 1/2 bootstrap mpi backend gloo\n");
  EXPECT_EQ(dt::readFile(dir + "/launch-mpi/rank.1"), "rank 1 world 2 local 1/2 bootstrap mpi backend gloo\n");
  const std::string reference = dt::readFile(dir + "/launch/params.0");
  ASSERT_NE(reference.find("0.weight"), std::string::npos) << reference;
  for (const char* sub : {"/launch", "/mpirun", "/launch-mpi"}) {
    for (const char* rank : {"/params.0", "/params.1"}) {
      EXPECT_EQ(dt::readFile(dir + sub + rank), reference) << sub << rank;
    }
  }
}

TEST(MpiLaunch, PythonScriptRunsWithTheExportedEnvironment) {
  REQUIRE_MPIRUN();
  auto o = options();
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  const auto r = dt::run({kLaunch, "--launcher=mpi", "--nproc-per-node=2",
                          std::string(DDPL_SOURCE_DIR) + "/tests/integration/mpi_python_rank.py"},
                         o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("python rank 0 local 0 of 2: sum 3"), std::string::npos) << r.all();
  EXPECT_NE(r.out.find("python rank 1 local 1 of 2: sum 3"), std::string::npos) << r.all();
}

// A plain torchrun-style script (env:// init, reads RANK/LOCAL_RANK/GROUP_RANK, DDP over Gloo)
// runs unchanged: launch's per-rank shim maps OpenMPI's variables to torchrun's.
TEST(MpiLaunch, TorchrunStyleGlooDdpScriptRunsUnchanged) {
  REQUIRE_MPIRUN();
  auto o = options();
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  o.unset_env.insert(o.unset_env.end(), {"GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
                                         "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID"});
  const auto r = dt::run({kLaunch, "--launcher=mpi", "--nproc-per-node=2",
                          std::string(DDPL_SOURCE_DIR) + "/tests/python/ddp_gloo.py"},
                         o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("DDP OK rank=0 world=2 local_rank=0 group_rank=0"), std::string::npos)
      << r.all();
  EXPECT_NE(r.out.find("DDP OK rank=1 world=2 local_rank=1 group_rank=0"), std::string::npos)
      << r.all();
}

TEST(MpiFailure, RankExitingNonZeroEndsTheJobAndLeavesNoProcess) {
  REQUIRE_MPIRUN();
  const std::string dir = dt::makeTempDir("ddpl-mpi-fail");
  const auto start = std::chrono::steady_clock::now();
  const auto r = dt::run(concat(mpirun(2), {kMpiRank, "fail", dir}), options(std::chrono::seconds(90)));
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(r.timed_out) << r.all();
  EXPECT_EQ(r.exit_code, 3) << r.all();  // mpirun's status is the first failed rank's
  // Rank 0 sleeps 60 s: only mpirun ending the job on rank 1's exit gets us here sooner.
  EXPECT_LT(seconds, 30.0) << r.all();
  EXPECT_NE(r.all().find("exiting with status 3 on purpose"), std::string::npos) << r.all();
  for (const char* rank : {"0", "1"}) {
    const std::string pidText = dt::readFile(dir + "/pid." + rank);
    ASSERT_FALSE(pidText.empty()) << "rank " << rank << " never started:\n" << r.all();
    const pid_t pid = std::stoi(pidText);
    // Rank 0's cleanup hook takes 5 s: mpirun must kill it (SIGTERM, then SIGKILL after
    // odls_base_sigkill_timeout), not return and leave it running.
    EXPECT_TRUE(dt::eventually([&] { return !dt::processAlive(pid); }, std::chrono::seconds(2)))
        << "rank " << rank << " (pid " << pid << ") outlived mpirun";
  }
}

TEST(MpiWorker, PartialOrInconsistentMpiEnvironmentIsAClearError) {
  const std::string dir = dt::makeTempDir("ddpl-mpi-env");
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"OMPI_COMM_WORLD_RANK", "1"}},
       "a partial OpenMPI environment: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
      {{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"},
      {{{"RANK", "1"}}, "RANK is set but WORLD_SIZE is not: a partial launcher environment"},
      {{{"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "WORLD_SIZE=4 but the OpenMPI launch says world size 2"},
  };
  for (const auto& [env, message] : cases) {
    auto o = options(std::chrono::seconds(60));
    for (const auto& [k, v] : env) o.env[k] = v;
    const auto r = dt::run({kMpiRank, "train", dir}, o);
    EXPECT_EQ(r.exit_code, 1) << r.all();
    EXPECT_NE(r.err.find("mpi_rank: error: " + message), std::string::npos) << r.err;
  }
}

TEST(MpiLaunch, DryRunPrintsTheMpirunCommand) {
  const std::string dir = dt::makeTempDir("ddpl-mpi-dry");
  const std::string hostfile = writeFile(dir + "/hosts", "node-a slots=4\nnode-b slots=2  # small one\n");
  auto o = options(std::chrono::seconds(20));
  o.unset_env.push_back("OMP_NUM_THREADS");
  o.env.erase("OMP_NUM_THREADS");
  const auto r = dt::run({kLaunch, "--launcher=mpi", "--hostfile", hostfile, "--nproc-per-node=4",
                          "--master-port=29611", "--rdzv-id=job7", "--mpi-args", "--bind-to core -x 'NCCL_DEBUG=INFO'",
                          "--dry-run", "/bin/echo", "a b"},
                         o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const std::string root = ::geteuid() == 0 ? "--allow-run-as-root " : "";
  EXPECT_EQ(r.out, "mpirun " + root +
                       "--oversubscribe -np 8 --host node-a:4,node-b:2 --map-by ppr:4:node "
                       "-x DDPL_MPI_RANKS_PER_HOST=4,4 -x GROUP_WORLD_SIZE=2 -x LOCAL_WORLD_SIZE=4 "
                       "-x MASTER_ADDR=node-a -x MASTER_PORT=29611 "
                       "-x OMP_NUM_THREADS=1 -x ROLE_WORLD_SIZE=8 -x TORCHELASTIC_MAX_RESTARTS=0 "
                       "-x TORCHELASTIC_RESTART_COUNT=0 -x TORCHELASTIC_RUN_ID=job7 -x "
                       "TORCHELASTIC_USE_AGENT_STORE=False "
                       "-x WORLD_SIZE=8 --bind-to core -x NCCL_DEBUG=INFO " +
                       kLaunch + " --mpi-rank-shim -- /bin/echo 'a b'\n");
}

TEST(MpiLaunch, HostfileErrorNamesTheLine) {
  const std::string dir = dt::makeTempDir("ddpl-mpi-bad");
  const std::string hostfile = writeFile(dir + "/hosts", "node-a slots=2\nnode-b slots=two\n");
  const auto r = dt::run({kLaunch, "--launcher=mpi", "--hostfile", hostfile, "--dry-run", "/bin/true"},
                         options(std::chrono::seconds(20)));
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("hostfile " + hostfile + ", line 2: slots 'two' is not a whole number >= 1"),
            std::string::npos)
      << r.err;
  const auto native = dt::run({kLaunch, "--hostfile", hostfile, "/bin/true"}, options(std::chrono::seconds(20)));
  EXPECT_EQ(native.exit_code, 2) << native.all();
  EXPECT_NE(native.err.find("--hostfile, --mpi-args and --dry-run go with --launcher=mpi"), std::string::npos)
      << native.err;
  const auto restarts = dt::run({kLaunch, "--launcher=mpi", "--max-restarts=2", "--dry-run", "/bin/true"},
                                options(std::chrono::seconds(20)));
  EXPECT_EQ(restarts.exit_code, 2) << restarts.all();
  EXPECT_NE(restarts.err.find("--max-restarts does not apply to --launcher=mpi"), std::string::npos) << restarts.err;
}

}  // namespace

// The example trainer, unchanged, as an MPI job: rank, world and the store come from MPI.
TEST(MpiExample, ResNetTrainerLearnsUnderMpirun) {
  REQUIRE_MPIRUN();
  const std::string trainer = std::string(DDPL_BIN_DIR) + "/ddp_resnet";
  ASSERT_EQ(::access(trainer.c_str(), X_OK), 0) << trainer << " not built";
  const std::string dir = dt::makeTempDir("mpi-example");
  const auto r = dt::run(concat(mpirun(2), {trainer, "--width", "8", "--train-size", "1024",
                                            "--test-size", "256", "--batch-size", "32",
                                            "--epochs", "2", "--lr", "0.2", "--checkpoint-dir",
                                            dir + "/ckpt", "--summary-json", dir + "/summary.json"}),
                         options(std::chrono::seconds(240)));
  ASSERT_FALSE(r.timed_out) << r.all();
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const auto summary = nlohmann::json::parse(dt::readFile(dir + "/summary.json"));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["final_step"], summary["total_steps"]);
  EXPECT_GT(summary["final_top1"].get<double>(), 0.2) << r.all();  // chance is 0.1
}
