#include "launcher/cli/cli.h"

#include <gtest/gtest.h>

#include <csignal>

using namespace ddpl::launcher;
using ddpl::UsageError;
using ddpl::signalName;

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
  EXPECT_NE(usageError({"--rdzv-backend=zookeeper", "p"}).find("'zookeeper'"), std::string::npos);
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
  // Unknown keys are warned about, never silently taken, and do not stop the job.
  auto unknown = parse({"--rdzv-conf=colour=blue", "p"}).options;
  ASSERT_EQ(unknown.warnings.size(), 1u);
  EXPECT_NE(unknown.warnings[0].find("unknown key 'colour'"), std::string::npos);
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

// torchrun's own --rdzv-conf keys: mapped where they mean something, warned about where not.
TEST(Cli, RdzvConfTorchrunKeys) {
  auto o = parse({"--rdzv-conf=timeout=90,close_timeout=12,read_timeout=7,"
                  "keep_alive_interval=2,keep_alive_max_attempt=4,store_type=tcp,use_libuv=1",
                  "p"})
               .options;
  EXPECT_DOUBLE_EQ(o.rdzv_conf.join_timeout_sec, 90);
  EXPECT_DOUBLE_EQ(o.rdzv_conf.exit_barrier_timeout_sec, 12);
  EXPECT_DOUBLE_EQ(o.rdzv_conf.read_timeout_sec, 7);
  EXPECT_DOUBLE_EQ(o.rdzv_conf.heartbeat_timeout_sec, 8);  // 2 s x 4 attempts
  ASSERT_EQ(o.warnings.size(), 2u);
  EXPECT_NE(o.warnings[0].find("store_type=tcp: has no effect"), std::string::npos);
  EXPECT_NE(o.warnings[1].find("use_libuv"), std::string::npos);
  EXPECT_TRUE(parse({"--rdzv-conf=join_timeout=5", "p"}).options.warnings.empty());
}

// Every input that used to crash (uncaught exception, bad_alloc) or misreport is a usage
// error naming the flag and the value.
TEST(Cli, InputsThatUsedToCrashAreUsageErrors) {
  auto names = [](const std::string& err, const std::string& a, const std::string& b) {
    return err.find(a) != std::string::npos && err.find(b) != std::string::npos;
  };
  EXPECT_PRED3(names, usageError({"--signals-to-handle=99999999999", "p"}), "--signals-to-handle",
               "99999999999");
  EXPECT_PRED3(names, usageError({"--signals-to-handle=SIGTERM,0", "p"}), "--signals-to-handle",
               "'0'");
  EXPECT_PRED3(names, usageError({"--signals-to-handle=9", "p"}), "--signals-to-handle", "'9'");
  for (const char* bad :
       {"h:abc", "h:99999999999", "h:", "h:-1", "h:65536", "[::1", ":29400"}) {
    std::string err =
        usageError({"--rdzv-backend=c10d", std::string("--rdzv-endpoint=") + bad, "p"});
    EXPECT_NE(err.find("--rdzv-endpoint"), std::string::npos) << bad << ": " << err;
    EXPECT_EQ(err.find("stoi"), std::string::npos) << err;
  }
  EXPECT_EQ(parse({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]:5", "p"}).options.rdzv_endpoint,
            "[::1]:5");
  // Port 0 (torchx's single-node jobs): torchrun picks a free port, which is --standalone here;
  // a second node could never find it.
  auto zero = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "p"}).options;
  EXPECT_TRUE(zero.standalone);
  EXPECT_FALSE(zero.elastic());
  EXPECT_TRUE(zero.rdzv_endpoint.empty());
  EXPECT_NE(usageError({"--rdzv-backend=c10d", "--rdzv-endpoint=h:0", "--nnodes=2", "p"})
                .find("port 0"),
            std::string::npos);
  EXPECT_EQ(parse({"--rdzv-backend=c10d", "--rdzv-endpoint=head", "p"}).options.rdzv_endpoint,
            "head");
  std::string big = usageError({"--nproc-per-node=1000000000", "p"});
  EXPECT_PRED3(names, big, "--nproc-per-node", "1000000000");
  EXPECT_NE(big.find(std::to_string(kMaxNprocPerNode)), std::string::npos) << big;
  EXPECT_EQ(parse({"--nproc-per-node=1024", "p"}).options.nproc_per_node.number, 1024);
  EXPECT_PRED3(names, usageError({"--nnodes=99999999999", "p"}), "--nnodes", "99999999999");
  EXPECT_PRED3(names, usageError({"--max-restarts=-1", "p"}), "--max-restarts", "-1");
  EXPECT_PRED3(names, usageError({"--master-port=70000", "p"}), "--master-port", "70000");
  EXPECT_PRED3(names, usageError({"--shutdown-timeout=1e999", "p"}), "--shutdown-timeout", "1e999");
  EXPECT_PRED3(names, usageError({"--monitor-interval=nan", "p"}), "--monitor-interval", "nan");
}

TEST(Cli, PetVariableErrorsNameTheVariable) {
  for (const auto& [var, value] :
       std::vector<std::pair<std::string, std::string>>{{"PET_SIGNALS_TO_HANDLE", "99999999999"},
                                                        {"PET_NPROC_PER_NODE", "lots"},
                                                        {"PET_NNODES", "3:1"},
                                                        {"PET_RDZV_CONF", "novalue"},
                                                        {"PET_MAX_RESTARTS", "x"}}) {
    std::string err = usageError({"p"}, {{var, value}});
    EXPECT_NE(err.find(var), std::string::npos) << err;
    EXPECT_NE(err.find(value), std::string::npos) << err;
  }
}

TEST(Cli, ModuleWithNoPythonIsAConflict) {
  std::string err = usageError({"-m", "--no-python", "pkg"});
  EXPECT_NE(err.find("-m/--module and --no-python"), std::string::npos) << err;
  EXPECT_NE(usageError({"--no-python", "--module", "pkg"}).find("contradict"), std::string::npos);
}

TEST(Cli, MistypedFlagSuggestsTheNearestOnce) {
  std::string err = usageError({"--nproc-per-mode=2", "p"});
  EXPECT_NE(err.find("did you mean --nproc-per-node?"), std::string::npos) << err;
  EXPECT_EQ(err.find("did you mean", err.find("did you mean") + 1), std::string::npos) << err;
  EXPECT_NE(usageError({"--max_restrats=2", "p"}).find("did you mean --max-restarts?"),
            std::string::npos);
  // Nothing close: no suggestion.
  EXPECT_EQ(usageError({"--zzzzzzzzzz", "p"}).find("did you mean"), std::string::npos);
}

TEST(Cli, UniquePrefixesAbbreviateAsArgparse) {
  auto o = parse({"--stand", "--max-rest=2", "--nproc_per=3", "p"}).options;
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.nproc_per_node.number, 3);
  std::string err = usageError({"--log=x", "p"});
  EXPECT_NE(err.find("ambiguous option '--log'"), std::string::npos) << err;
  EXPECT_NE(err.find("--log-dir"), std::string::npos) << err;
  EXPECT_NE(err.find("--log-level"), std::string::npos) << err;
}

TEST(Cli, FormerlyRefusedTorchrunFlags) {
  auto o = parse({"--start-method=fork", "--event-log-handler=console", "--logs-specs=mine",
                  "--numa-binding=socket", "p"})
               .options;
  EXPECT_EQ(o.start_method, "fork");
  EXPECT_EQ(o.numa_binding, NumaBinding::kSocket);
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("--logs-specs=mine"), std::string::npos);
  EXPECT_EQ(parse({"--numa_binding", "core-complex", "p"}).options.numa_binding,
            NumaBinding::kCoreComplex);
  EXPECT_NE(usageError({"--start-method=thread", "p"}).find("spawn, fork or forkserver"),
            std::string::npos);
  EXPECT_NE(usageError({"--numa-binding=everywhere", "p"}).find("node, socket"), std::string::npos);
  EXPECT_NE(usageError({"--event-log-handler=dynamic_rendezvous", "p"}).find("null or console"),
            std::string::npos);
}

TEST(Cli, LoglevelAndPrefixTemplateFromTheEnvironment) {
  EXPECT_EQ(parse({"p"}, {{"LOGLEVEL", "DEBUG"}}).options.log_level, "debug");
  EXPECT_EQ(parse({"p"}, {{"LOGLEVEL", "WARNING"}}).options.log_level, "warn");
  EXPECT_EQ(parse({"--log-level=error", "p"}, {{"LOGLEVEL", "DEBUG"}}).options.log_level, "error");
  EXPECT_NE(usageError({"p"}, {{"LOGLEVEL", "LOUD"}}).find("LOGLEVEL='LOUD'"), std::string::npos);
  EXPECT_EQ(parse({"p"}).options.log_line_prefix_template, "[${role_name}${local_rank}]:");
  EXPECT_EQ(parse({"p"}, {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]:"}})
                .options.log_line_prefix_template,
            "[${rank}]:");
  EXPECT_FALSE(parse({"--no-prefix", "p"}).options.prefix_output);
  EXPECT_FALSE(parse({"--cgroup=off", "p"}).options.use_cgroup);
  EXPECT_TRUE(parse({"p"}).options.use_cgroup);
}

// Every option string of torchrun 2.15's parser (torch/distributed/run.py, both spellings),
// with a value where it takes one: each is accepted, or refused saying what to do instead.
// Never "unknown option".
TEST(Cli, EveryFlagOfTorchrun215IsKnown) {
  const std::vector<std::pair<std::string, std::string>> kTorchrun215 = {
      {"--nnodes", "1"},
      {"--nproc-per-node", "2"},
      {"--nproc_per_node", "2"},
      {"--rdzv-backend", "static"},
      {"--rdzv_backend", "static"},
      {"--rdzv-endpoint", "host:1234"},
      {"--rdzv_endpoint", "host:1234"},
      {"--rdzv-id", "job"},
      {"--rdzv_id", "job"},
      {"--rdzv-conf", "join_timeout=5"},
      {"--rdzv_conf", "join_timeout=5"},
      {"--standalone", ""},
      {"--max-restarts", "1"},
      {"--max_restarts", "1"},
      {"--monitor-interval", "0.5"},
      {"--monitor_interval", "0.5"},
      {"--start-method", "spawn"},
      {"--start_method", "spawn"},
      {"--event-log-handler", "null"},
      {"--event_log_handler", "null"},
      {"--role", "trainer"},
      {"-m", ""},
      {"--module", ""},
      {"--no-python", ""},
      {"--no_python", ""},
      {"--run-path", ""},
      {"--run_path", ""},
      {"--log-dir", "/tmp/x"},
      {"--log_dir", "/tmp/x"},
      {"-r", "3"},
      {"--redirects", "3"},
      {"-t", "3"},
      {"--tee", "3"},
      {"--log-line-prefix-template", "${hostname}:${rank}: "},
      {"--log_line_prefix_template", "${hostname}:${rank}: "},
      {"--local-ranks-filter", "0"},
      {"--local_ranks_filter", "0"},
      {"--duplicate-stdout-filters", "apple"},
      {"--duplicate_stdout_filters", "apple"},
      {"--duplicate-stderr-filters", "apple"},
      {"--duplicate_stderr_filters", "apple"},
      {"--node-rank", "0"},
      {"--node_rank", "0"},
      {"--master-addr", "10.0.0.1"},
      {"--master_addr", "10.0.0.1"},
      {"--master-port", "29500"},
      {"--master_port", "29500"},
      {"--local-addr", "10.0.0.2"},
      {"--local_addr", "10.0.0.2"},
      {"--logs-specs", "default"},
      {"--logs_specs", "default"},
      {"--numa-binding", "node"},
      {"--numa_binding", "node"},
      {"--signals-to-handle", "SIGTERM,SIGUSR1"},
      {"--signals_to_handle", "SIGTERM,SIGUSR1"},
      {"--shutdown-timeout", "10"},
      {"--shutdown_timeout", "10"},
      {"--virtual-local-rank", ""},
      {"--virtual_local_rank", ""},
      {"--print-completion", "bash"},
      {"--print_completion", "bash"},
      {"-h", ""},
      {"--help", ""},
  };
  for (const auto& [flag, value] : kTorchrun215) {
    std::vector<std::string> args{flag};
    if (!value.empty()) args.push_back(value);
    args.push_back("train.py");
    try {
      parseCommandLine(args, {});
    } catch (const UsageError& e) {
      std::string why = e.what();
      EXPECT_EQ(why.find("unknown option"), std::string::npos) << flag << ": " << why;
      // A refusal says what to do instead.
      EXPECT_TRUE(why.find("use") != std::string::npos || why.find("drop ") != std::string::npos)
          << flag << ": " << why;
    }
  }
}

// torchrun 2.11+: LOCAL_RANK=0 and one device per worker (worker_spec_test checks the
// environment); a check_env flag, so PET_VIRTUAL_LOCAL_RANK=0 leaves it off.
TEST(Cli, VirtualLocalRank) {
  EXPECT_FALSE(parse({"p"}).options.virtual_local_rank);
  EXPECT_TRUE(parse({"--virtual-local-rank", "p"}).options.virtual_local_rank);
  EXPECT_TRUE(parse({"--virtual_local_rank", "p"}).options.virtual_local_rank);
  EXPECT_TRUE(parse({"p"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).options.virtual_local_rank);
  EXPECT_FALSE(parse({"p"}, {{"PET_VIRTUAL_LOCAL_RANK", "0"}}).options.virtual_local_rank);
  EXPECT_TRUE(parse({"--virtual-local-rank", "p"}, {{"PET_VIRTUAL_LOCAL_RANK", "0"}})
                  .options.virtual_local_rank);
}

// torchrun's comma_separated_list: ",," is a literal comma; an empty item is kept (it matches
// every line there too, and launch says so); an empty value is no filter at all.
TEST(Cli, DuplicateFiltersAsTorchrun) {
  using V = std::vector<std::string>;
  auto o = parse({"--tee=3", "--duplicate-stdout-filters=apple,orange", "p"}).options;
  EXPECT_EQ(o.duplicate_stdout_filters, (V{"apple", "orange"}));
  EXPECT_TRUE(o.duplicate_stderr_filters.empty());
  EXPECT_TRUE(o.warnings.empty());
  EXPECT_EQ(
      parse({"--duplicate_stderr_filters", "a,,,b,", "-t3", "p"}).options.duplicate_stderr_filters,
      (V{"a,", "b", ""}));
  EXPECT_EQ(parse({"--duplicate-stdout-filters=,,", "p"}).options.duplicate_stdout_filters,
            (V{","}));
  EXPECT_TRUE(parse({"--duplicate-stdout-filters=", "p"}).options.duplicate_stdout_filters.empty());
  EXPECT_EQ(
      parse({"p"}, {{"PET_DUPLICATE_STDERR_FILTERS", "x,y"}}).options.duplicate_stderr_filters,
      (V{"x", "y"}));
  // Only tee'd lines are copied: without a tee for that stream, nothing ever is.
  auto untee = parse({"--tee=2", "--duplicate-stdout-filters=apple", "p"}).options;
  ASSERT_EQ(untee.warnings.size(), 1u);
  EXPECT_NE(untee.warnings[0].find("--tee 1 or --tee 3"), std::string::npos) << untee.warnings[0];
  EXPECT_TRUE(
      parse({"--tee=0:1", "--duplicate-stdout-filters=apple", "p"}).options.warnings.empty());
  auto all = parse({"--tee=3", "--duplicate-stdout-filters=apple,", "p"}).options;
  ASSERT_EQ(all.warnings.size(), 1u);
  EXPECT_NE(all.warnings[0].find("matches every line"), std::string::npos) << all.warnings[0];
}

// As torchrun's: the script is printed at once, no PROGRAM needed; its options are launch's.
TEST(Cli, PrintCompletion) {
  auto r = parse({"--print-completion", "zsh"});
  EXPECT_EQ(r.action, ParseResult::Action::kCompletion);
  EXPECT_EQ(r.options.print_completion, "zsh");
  EXPECT_EQ(parse({"--print_completion=tcsh"}).options.print_completion, "tcsh");
  EXPECT_NE(usageError({"--print-completion", "fish"}).find("bash, zsh or tcsh"),
            std::string::npos);
  // Not read from the environment: PET_PRINT_COMPLETION does not turn a run into a print.
  EXPECT_EQ(parse({"p"}, {{"PET_PRINT_COMPLETION", "bash"}}).action, ParseResult::Action::kRun);
  std::string bash = completionScript("bash");
  EXPECT_NE(bash.find("complete -o filenames -F _launch launch"), std::string::npos);
  EXPECT_NE(bash.find("--virtual-local-rank"), std::string::npos);
  EXPECT_NE(bash.find("\"auto live log off\""), std::string::npos) << bash;
  std::string zsh = completionScript("zsh");
  EXPECT_EQ(zsh.rfind("#compdef launch\n", 0), 0u);
  EXPECT_NE(zsh.find("'--nproc-per-node=[workers per node]:N|gpu|cpu|auto:(gpu cpu auto)'"),
            std::string::npos)
      << zsh;
  std::string tcsh = completionScript("tcsh");
  EXPECT_EQ(tcsh.rfind("complete launch 'c/--/(nnodes ", 0), 0u) << tcsh;
  EXPECT_NE(tcsh.find("'n/--numa-binding/(node socket exclusive core-complex)/'"),
            std::string::npos);
}

TEST(Cli, NprocXpuIsRefusedWithTheNumberToGive) {
  std::string err = usageError({"--nproc-per-node=xpu", "p"});
  EXPECT_NE(err.find("NVIDIA GPUs only"), std::string::npos) << err;
  EXPECT_NE(err.find("--nproc-per-node=4"), std::string::npos) << err;
}

// torchrun 2.15: --shutdown-timeout, else PET_SHUTDOWN_TIMEOUT, else
// TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30.
TEST(Cli, ShutdownTimeoutFromTorchElasticVariable) {
  const std::map<std::string, std::string> env{{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7"}};
  EXPECT_DOUBLE_EQ(parse({"p"}, env).options.shutdown_timeout_sec, 7);
  auto pet = env;
  pet["PET_SHUTDOWN_TIMEOUT"] = "5";
  EXPECT_DOUBLE_EQ(parse({"p"}, pet).options.shutdown_timeout_sec, 5);
  EXPECT_DOUBLE_EQ(parse({"--shutdown-timeout=3", "p"}, pet).options.shutdown_timeout_sec, 3);
  std::string err = usageError({"p"}, {{"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "soon"}});
  EXPECT_NE(err.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), std::string::npos) << err;
  EXPECT_NE(err.find("soon"), std::string::npos) << err;
}
