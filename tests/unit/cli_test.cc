#include <gtest/gtest.h>

#include <csignal>

#include "launcher/cli.h"

using namespace ddpl::launcher;

namespace {
ParseResult parse(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  return parseCommandLine(args, env);
}
std::string usageError(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
  try {
    parse(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(Cli, DefaultsMatchTorchrun) {
  auto o = parse({"train.py"}).options;
  EXPECT_EQ(o.nproc_per_node.kind, NprocKind::kNumber);
  EXPECT_EQ(o.nproc_per_node.number, 1);
  EXPECT_EQ(o.nnodes_min, 1);
  EXPECT_EQ(o.nnodes_max, 1);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_FALSE(o.master_port.has_value());
  EXPECT_DOUBLE_EQ(o.shutdown_timeout_sec, 30.0);
  EXPECT_EQ(o.signals_to_handle, (std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT}));
  EXPECT_EQ(o.program, "train.py");
}

TEST(Cli, BothSpellingsAndInlineValues) {
  auto a = parse({"--nproc_per_node=4", "--max_restarts", "2", "prog"}).options;
  auto b = parse({"--nproc-per-node", "4", "--max-restarts=2", "prog"}).options;
  EXPECT_EQ(a.nproc_per_node.number, 4);
  EXPECT_EQ(b.nproc_per_node.number, 4);
  EXPECT_EQ(a.max_restarts, 2);
  EXPECT_EQ(b.max_restarts, 2);
}

TEST(Cli, NprocKeywords) {
  EXPECT_EQ(parse({"--nproc-per-node=gpu", "p"}).options.nproc_per_node.kind, NprocKind::kGpu);
  EXPECT_EQ(parse({"--nproc-per-node=cpu", "p"}).options.nproc_per_node.kind, NprocKind::kCpu);
  EXPECT_EQ(parse({"--nproc-per-node=auto", "p"}).options.nproc_per_node.kind, NprocKind::kAuto);
  EXPECT_NE(usageError({"--nproc-per-node=abc", "p"}).find("'abc'"), std::string::npos);
  EXPECT_NE(usageError({"--nproc-per-node=0", "p"}).find("--nproc-per-node"), std::string::npos);
}

TEST(Cli, ProgramArgumentsAreNotParsed) {
  auto o = parse({"--standalone", "train.py", "--nproc-per-node=9", "-m", "x"}).options;
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.program, "train.py");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--nproc-per-node=9", "-m", "x"}));
  EXPECT_EQ(o.nproc_per_node.number, 1);
}

TEST(Cli, DoubleDashEndsOptions) {
  auto o = parse({"--", "-weird-name", "a"}).options;
  EXPECT_EQ(o.program, "-weird-name");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"a"}));
}

TEST(Cli, PetEnvironmentFallbackAndCommandLineWins) {
  auto o = parse({"p"}, {{"PET_NPROC_PER_NODE", "3"}, {"PET_MAX_RESTARTS", "5"},
                         {"PET_STANDALONE", "1"}})
               .options;
  EXPECT_EQ(o.nproc_per_node.number, 3);
  EXPECT_EQ(o.max_restarts, 5);
  EXPECT_TRUE(o.standalone);
  auto o2 = parse({"--nproc-per-node=2", "p"}, {{"PET_NPROC_PER_NODE", "3"}}).options;
  EXPECT_EQ(o2.nproc_per_node.number, 2);
  EXPECT_NE(usageError({"p"}, {{"PET_MAX_RESTARTS", "many"}}).find("PET_MAX_RESTARTS"),
            std::string::npos);
}

TEST(Cli, ModuleAndNoPython) {
  EXPECT_EQ(parse({"-m", "pkg.train"}).options.target_kind, TargetKind::kModule);
  EXPECT_EQ(parse({"--module", "pkg.train"}).options.target_kind, TargetKind::kModule);
  EXPECT_EQ(parse({"--no-python", "./a.out"}).options.target_kind, TargetKind::kNoPython);
  EXPECT_EQ(parse({"--no_python", "./a.out"}).options.target_kind, TargetKind::kNoPython);
}

TEST(Cli, StreamSpecs) {
  auto o = parse({"-r", "3", "--tee=0:1,1:2", "p"}).options;
  EXPECT_TRUE(o.redirects.forRank(7).stdout_);
  EXPECT_TRUE(o.redirects.forRank(7).stderr_);
  EXPECT_TRUE(o.tee.forRank(0).stdout_);
  EXPECT_FALSE(o.tee.forRank(0).stderr_);
  EXPECT_TRUE(o.tee.forRank(1).stderr_);
  EXPECT_FALSE(o.tee.forRank(2).stdout_);
  auto attached = parse({"-t2", "p"}).options;
  EXPECT_TRUE(attached.tee.forRank(0).stderr_);
  EXPECT_NE(usageError({"--redirects=7", "p"}).find("'7'"), std::string::npos);
}

TEST(Cli, SignalsToHandle) {
  auto o = parse({"--signals-to-handle=SIGUSR1,TERM,2", "p"}).options;
  EXPECT_EQ(o.signals_to_handle, (std::vector<int>{SIGUSR1, SIGTERM, SIGINT}));
  EXPECT_NE(usageError({"--signals-to-handle=SIGKILL", "p"}).find("SIGKILL"), std::string::npos);
  EXPECT_NE(usageError({"--signals-to-handle=SIGFOO", "p"}).find("SIGFOO"), std::string::npos);
  EXPECT_EQ(signalName(SIGUSR1), "SIGUSR1");
}

TEST(Cli, BadInputNamesTheFlag) {
  EXPECT_NE(usageError({"--bogus", "p"}).find("'--bogus'"), std::string::npos);
  EXPECT_NE(usageError({"--max-restarts"}).find("--max-restarts needs a value"), std::string::npos);
  EXPECT_NE(usageError({"--max-restarts=-1", "p"}).find("--max-restarts"), std::string::npos);
  EXPECT_NE(usageError({"--master-port=70000", "p"}).find("70000"), std::string::npos);
  EXPECT_NE(usageError({"--shutdown-timeout=soon", "p"}).find("'soon'"), std::string::npos);
  EXPECT_NE(usageError({}).find("missing PROGRAM"), std::string::npos);
  EXPECT_NE(usageError({"--run-path", "p"}).find("not supported"), std::string::npos);
  EXPECT_NE(usageError({"--rdzv-backend=etcd", "p"}).find("'etcd'"), std::string::npos);
  EXPECT_NE(usageError({"--rdzv-conf=novalue", "p"}).find("key=value"), std::string::npos);
}

TEST(Cli, NnodesValidation) {
  EXPECT_NE(usageError({"--nnodes=3:2", "p"}).find("minimum 3 is greater than maximum 2"),
            std::string::npos);
  EXPECT_NE(usageError({"--nnodes=2:4", "p"}).find("elastic"), std::string::npos);
  EXPECT_NE(usageError({"--node-rank=1", "p"}).find("--node-rank=1"), std::string::npos);
  EXPECT_NE(usageError({"--nnodes=2", "--node-rank=2", "p"}).find("node ranks are 0..1"),
            std::string::npos);
  EXPECT_EQ(parse({"--nnodes=1:1", "p"}).options.nnodes_max, 1);
  EXPECT_NE(usageError({"--standalone", "--nnodes=1:2", "p"}).find("--standalone"),
            std::string::npos);
  EXPECT_NE(usageError({"--rdzv-backend=c10d", "--nnodes=2", "p"}).find("--rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(usageError({"--rdzv-endpoint=h:1", "--nnodes=2", "p"}).find("c10d"),
            std::string::npos);
  auto st = parse({"--nnodes=2", "--node-rank=1", "--master-addr=10.1.1.1", "p"}).options;
  EXPECT_FALSE(st.elastic());
  EXPECT_EQ(st.node_rank, 1);
  auto el = parse({"--nnodes=2:4", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400",
                   "--rdzv-id=j", "p"}).options;
  EXPECT_TRUE(el.elastic());
  EXPECT_EQ(el.nnodes_min, 2);
  EXPECT_EQ(el.nnodes_max, 4);
}

TEST(Cli, RdzvConf) {
  auto o = parse({"--rdzv-conf=join_timeout=5, is_host=1,last_call_timeout=0.5", "p"}).options;
  EXPECT_DOUBLE_EQ(o.rdzv_conf.join_timeout_sec, 5);
  EXPECT_DOUBLE_EQ(o.rdzv_conf.last_call_timeout_sec, 0.5);
  ASSERT_TRUE(o.rdzv_conf.is_host.has_value());
  EXPECT_TRUE(*o.rdzv_conf.is_host);
  EXPECT_DOUBLE_EQ(o.rdzv_conf.heartbeat_timeout_sec, 30);
  EXPECT_NE(usageError({"--rdzv-conf=colour=blue", "p"}).find("unknown key 'colour'"),
            std::string::npos);
  EXPECT_NE(usageError({"--rdzv-conf=join_timeout=soon", "p"}).find("join_timeout"),
            std::string::npos);
  EXPECT_NE(usageError({"--rdzv-conf=novalue", "p"}).find("key=value"), std::string::npos);
}

TEST(Slurm, NodeListExpansion) {
  EXPECT_EQ(expandSlurmNodeList("n[1-3,7],gpu05"),
            (std::vector<std::string>{"n1", "n2", "n3", "n7", "gpu05"}));
  EXPECT_EQ(expandSlurmNodeList("node[08-10]"),
            (std::vector<std::string>{"node08", "node09", "node10"}));
  EXPECT_EQ(expandSlurmNodeList("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(expandSlurmNodeList("vm"), (std::vector<std::string>{"vm"}));
  EXPECT_THROW(expandSlurmNodeList("n[1-3"), UsageError);
}

TEST(Slurm, DefaultsFromTheAllocation) {
  std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "4242"}, {"SLURM_NNODES", "3"}, {"SLURM_JOB_NODELIST", "cn[07-09]"}};
  auto r = parseCommandLine({"--nproc-per-node=2", "train.py"}, env);
  std::string note = applySlurmDefaults(r.options, r.given_flags, env);
  EXPECT_NE(note.find("4242"), std::string::npos);
  EXPECT_EQ(r.options.nnodes_min, 3);
  EXPECT_EQ(r.options.nnodes_max, 3);
  EXPECT_EQ(r.options.rdzv_backend, "c10d");
  EXPECT_EQ(r.options.rdzv_endpoint, "cn07:29400");
  EXPECT_EQ(r.options.rdzv_id, "slurm-4242");
  EXPECT_NO_THROW(validateTopology(r.options));

  // What the user spelled out wins.
  auto given = parseCommandLine({"--nnodes=1", "train.py"}, env);
  EXPECT_EQ(applySlurmDefaults(given.options, given.given_flags, env), "");
  EXPECT_EQ(given.options.nnodes_max, 1);
  // One-node allocations and no Slurm: nothing to do.
  auto single = env;
  single["SLURM_NNODES"] = "1";
  auto r1 = parseCommandLine({"train.py"}, single);
  EXPECT_EQ(applySlurmDefaults(r1.options, r1.given_flags, single), "");
  auto r2 = parseCommandLine({"train.py"}, {});
  EXPECT_EQ(applySlurmDefaults(r2.options, r2.given_flags, {}), "");
}

TEST(Cli, HelpAndVersion) {
  EXPECT_EQ(parse({"--help"}).action, ParseResult::Action::kHelp);
  EXPECT_EQ(parse({"-h"}).action, ParseResult::Action::kHelp);
  EXPECT_EQ(parse({"--version"}).action, ParseResult::Action::kVersion);
  std::string help = helpText();
  for (const char* flag : {"--nproc-per-node", "--max-restarts", "--tee", "--signals-to-handle",
                           "--local-ranks-filter", "--log-dir", "--no-python", "-m"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}
