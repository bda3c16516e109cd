// `launch --launcher=mpi` without running anything: the hostfile parser, --mpi-args splitting,
// and the mpirun command the launcher builds (launcher/mpi/mpi_launch.h).
#include <gtest/gtest.h>

#include "launcher/cli/cli.h"
#include "launcher/mpi/mpi_launch.h"

namespace dl = ddpl::launcher;

namespace {

std::string usageError(const std::function<void()>& f) {
  try {
    f();
  } catch (const ddpl::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(MpiHostfile, ParsesHostsSlotsCommentsAndBlankLines) {
  const auto hosts = dl::parseHostfile("# cluster\n\nnode-a slots=4 max_slots=8\n  node-b\t# no slots\nnode-c slots=2\n",
                                       "hosts");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].host, "node-a");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[0].max_slots, 8);
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[1].host, "node-b");
  EXPECT_FALSE(hosts[1].slots.has_value());
  EXPECT_EQ(hosts[1].line, 4);
  EXPECT_EQ(hosts[2].slots, 2);
}

TEST(MpiHostfile, ErrorsNameTheFileAndLine) {
  EXPECT_EQ(usageError([] { dl::parseHostfile("a\nb slots=0\n", "h"); }),
            "hostfile h, line 2: slots '0' is not a whole number >= 1");
  EXPECT_EQ(usageError([] { dl::parseHostfile("a\n\nb cpus=2\n", "h"); }),
            "hostfile h, line 3: unknown 'cpus=2' (expected HOST [slots=N] [max_slots=N])");
  EXPECT_EQ(usageError([] { dl::parseHostfile("a slots=2\nb\na slots=1\n", "h"); }),
            "hostfile h, line 3: host 'a' is listed again (first on line 1): give it one line with its total slots");
  EXPECT_EQ(usageError([] { dl::parseHostfile("a slots=4 max_slots=2\n", "h"); }),
            "hostfile h, line 1: max_slots=2 is below slots=4");
  EXPECT_EQ(usageError([] { dl::parseHostfile("slots=4\n", "h"); }),
            "hostfile h, line 1: 'slots=4' where a host name was expected");
  EXPECT_EQ(usageError([] { dl::parseHostfile("# nothing\n\n", "h"); }), "hostfile h: no hosts in it");
  EXPECT_NE(usageError([] { dl::readHostfile("/nonexistent/hosts"); }).find("--hostfile: cannot read '/nonexistent/hosts'"),
            std::string::npos);
}

TEST(MpiArgs, SplitsLikeAShellAndQuotesBack) {
  EXPECT_EQ(dl::splitShellWords("  --bind-to core  -x 'A=b c' \"-x\" B=\\\"q\\\" ''"),
            (std::vector<std::string>{"--bind-to", "core", "-x", "A=b c", "-x", "B=\"q\"", ""}));
  EXPECT_TRUE(dl::splitShellWords("").empty());
  EXPECT_EQ(usageError([] { dl::splitShellWords("-x 'A=1"); }), "--mpi-args: unterminated ' quote in '-x 'A=1'");
  const std::vector<std::string> words{"mpirun", "a b", "it's", "", "x=1,y:2/z"};
  EXPECT_EQ(dl::shellQuote(words), "mpirun 'a b' 'it'\\''s' '' x=1,y:2/z");
  EXPECT_EQ(dl::splitShellWords(dl::shellQuote(words)), words);
}

dl::MpiJob job() {
  dl::MpiJob j;
  j.hosts = {{"localhost", std::nullopt, std::nullopt, 0}};
  j.master_addr = "127.0.0.1";
  j.master_port = 29555;
  j.run_id = "r1";
  j.command = {"/bin/prog", "--lr", "0.1"};
  return j;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

TEST(MpiCommand, OneHostGetsItsRanksAsSlotsAndEveryPerJobVariable) {
  auto j = job();
  j.nproc_per_node = 3;
  EXPECT_EQ(joined(dl::buildMpirunCommand(j)),
            "mpirun -np 3 --host localhost:3 --map-by ppr:3:node -x DDPL_MPI_RANKS_PER_HOST=3 "
            "-x GROUP_WORLD_SIZE=1 -x LOCAL_WORLD_SIZE=3 "
            "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29555 -x ROLE_WORLD_SIZE=3 -x "
            "TORCHELASTIC_MAX_RESTARTS=0 "
            "-x TORCHELASTIC_RESTART_COUNT=0 -x TORCHELASTIC_RUN_ID=r1 -x "
            "TORCHELASTIC_USE_AGENT_STORE=False "
            "-x WORLD_SIZE=3 /bin/prog --lr 0.1");
  // With the shim, each rank starts as `launch --mpi-rank-shim -- PROGRAM` (torchrun's
  // per-rank variables), the program's own arguments untouched.
  j.shim = "/opt/bin/launch";
  EXPECT_NE(joined(dl::buildMpirunCommand(j))
                .find("-x WORLD_SIZE=3 /opt/bin/launch --mpi-rank-shim -- /bin/prog --lr 0.1"),
            std::string::npos);
}

TEST(MpiCommand, RootAndTooFewSlotsAddTheirFlags) {
  auto j = job();
  j.nproc_per_node = 2;
  j.as_root = true;
  j.hosts = {{"a", 2, std::nullopt, 1}, {"b", 1, std::nullopt, 2}};
  const auto argv = dl::buildMpirunCommand(j);
  EXPECT_EQ(joined({argv.begin(), argv.begin() + 9}),
            "mpirun --allow-run-as-root --oversubscribe -np 4 --host a:2,b:1 --map-by ppr:2:node");
  j.hosts = {{"a", 2, std::nullopt, 1}, {"b", 4, std::nullopt, 2}};
  EXPECT_EQ(joined(dl::buildMpirunCommand(j)).find("--oversubscribe"), std::string::npos);
}

TEST(MpiCommand, WithoutNprocEachHostRunsItsSlots) {
  auto j = job();
  j.hosts = {{"a", 4, std::nullopt, 1}, {"b", std::nullopt, std::nullopt, 2}};
  const std::string cmd = joined(dl::buildMpirunCommand(j));
  EXPECT_NE(cmd.find("mpirun -np 5 --host a:4,b:1 -x DDPL_MPI_RANKS_PER_HOST=4,1 "
                     "-x GROUP_WORLD_SIZE=2 "),
            std::string::npos)
      << cmd;
  EXPECT_EQ(cmd.find("--map-by"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("LOCAL_WORLD_SIZE"), std::string::npos) << cmd;  // hosts differ
  EXPECT_NE(cmd.find("-x WORLD_SIZE=5 "), std::string::npos) << cmd;
}

TEST(MpiCommand, PassThroughArgsComeLastAndTheirMappingWins) {
  auto j = job();
  j.nproc_per_node = 2;
  j.mpi_args = {"--map-by", "numa", "--bind-to", "core", "-x", "NCCL_DEBUG"};
  j.extra_env = {{"OMP_NUM_THREADS", "1"}};
  const std::string cmd = joined(dl::buildMpirunCommand(j));
  EXPECT_EQ(cmd.find("ppr:"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("LOCAL_WORLD_SIZE"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("DDPL_MPI_RANKS_PER_HOST"), std::string::npos) << cmd;  // their placement
  EXPECT_NE(cmd.find("-x OMP_NUM_THREADS=1 "), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("-x WORLD_SIZE=2 --map-by numa --bind-to core -x NCCL_DEBUG /bin/prog --lr 0.1"),
            std::string::npos)
      << cmd;
}

TEST(MpiCommand, PlanRefusesFlagsMpirunCannotHonour) {
  dl::LaunchOptions o;
  o.launcher = "mpi";
  o.program = "/bin/true";
  o.target_kind = dl::TargetKind::kNoPython;
  EXPECT_EQ(usageError([&] { dl::planMpiJob(o, {}, 2, {"--launcher", "--tee"}); }).rfind("--tee does not apply", 0),
            0u);
  o.nnodes_min = o.nnodes_max = 2;
  EXPECT_NE(usageError([&] { dl::planMpiJob(o, {}, 2, {"--launcher", "--nnodes"}); })
                .find("--nnodes=2:2 but the default (this host) lists 1 host(s)"),
            std::string::npos);
  o.nnodes_min = o.nnodes_max = 1;
  o.program_args = {"--rank=${local_rank}"};
  EXPECT_NE(usageError([&] { dl::planMpiJob(o, {}, 2, {"--launcher"}); }).find("${local_rank} cannot be substituted"),
            std::string::npos);
  o.program_args.clear();
  const auto planned = dl::planMpiJob(o, {{"DDPL_MPIRUN", "/opt/ompi/bin/mpirun"}}, 2, {"--launcher"});
  EXPECT_EQ(planned.mpirun, "/opt/ompi/bin/mpirun");
  EXPECT_EQ(planned.master_addr, "127.0.0.1");
  EXPECT_GT(planned.master_port, 0);  // a free port here: rank 0 runs on this host
  EXPECT_EQ(planned.extra_env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(planned.command, (std::vector<std::string>{"/bin/true"}));
}

TEST(MpiCli, LauncherFlagsParseAndNeedTheMpiLauncher) {
  const auto parsed = dl::parseCommandLine(
      {"--launcher=mpi", "--hostfile", "h", "--mpi-args", "--bind-to none", "--dry-run", "prog", "x"}, {});
  EXPECT_EQ(parsed.options.launcher, "mpi");
  EXPECT_EQ(parsed.options.hostfile, "h");
  EXPECT_EQ(parsed.options.mpi_args, "--bind-to none");
  EXPECT_TRUE(parsed.options.dry_run);
  EXPECT_EQ(dl::parseCommandLine({"prog"}, {}).options.launcher, "native");
  EXPECT_EQ(usageError([] { dl::parseCommandLine({"--launcher=slurm", "prog"}, {}); }),
            "--launcher: 'slurm' is not native or mpi");
  EXPECT_EQ(usageError([] { dl::parseCommandLine({"--dry-run", "prog"}, {}); }),
            "--hostfile, --mpi-args and --dry-run go with --launcher=mpi");
}

}  // namespace

TEST(MpiRankShim, TorchrunVariablesFromOpenMpis) {
  dl::Environment env = {{"OMPI_COMM_WORLD_RANK", "5"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                         {"DDPL_MPI_RANKS_PER_HOST", "4,2,2"},
                         {"PATH", "/bin"}};
  auto out = dl::torchrunEnvFromMpi(env, "/tmp/errs");
  EXPECT_EQ(out["RANK"], "5");
  EXPECT_EQ(out["LOCAL_RANK"], "1");
  EXPECT_EQ(out["ROLE_RANK"], "5");
  EXPECT_EQ(out["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(out["GROUP_RANK"], "1");  // ranks 0-3 on host 0, 4-5 on host 1
  EXPECT_EQ(out["ROLE_NAME"], "default");
  EXPECT_EQ(out["TORCHELASTIC_ERROR_FILE"], "/tmp/errs/5/error.json");
  EXPECT_EQ(out["PATH"], "/bin");
  EXPECT_EQ(out["DDPL_BOOTSTRAP"], "mpi");
  // What the user set is kept; without the counts there is no GROUP_RANK to guess.
  env["LOCAL_WORLD_SIZE"] = "3";
  env.erase("DDPL_MPI_RANKS_PER_HOST");
  out = dl::torchrunEnvFromMpi(env, "/tmp/errs");
  EXPECT_EQ(out["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(out.count("GROUP_RANK"), 0u);
  env.erase("OMPI_COMM_WORLD_RANK");
  try {
    dl::torchrunEnvFromMpi(env, "/tmp/errs");
    ADD_FAILURE() << "no error without OMPI_COMM_WORLD_RANK";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK is not set"), std::string::npos);
  }
  env["OMPI_COMM_WORLD_RANK"] = "9";
  env["DDPL_MPI_RANKS_PER_HOST"] = "4,2";
  EXPECT_THROW(dl::torchrunEnvFromMpi(env, "/tmp/errs"), std::exception);
}
