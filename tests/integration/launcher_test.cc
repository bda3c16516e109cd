// `launch` end to end: real launcher binary, real worker processes, on this machine.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "tests/common/subprocess.h"

namespace fs = std::filesystem;
using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {

const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kPrograms = std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs";

std::string prog(const std::string& name) { return kPrograms + "/" + name; }

RunResult launch(std::vector<std::string> args, RunOptions o = {}) {
  args.insert(args.begin(), kLaunch);
  if (o.timeout == std::chrono::milliseconds(std::chrono::seconds(60))) o.timeout = 60s;
  return run(args, o);
}

std::vector<std::string> linesWith(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}


}  // namespace

TEST(Launch, EveryRankGetsTheTorchrunEnvironment) {
  auto r = launch({"--nproc-per-node=3", "--rdzv-id=envjob", "--max-restarts=2", prog("env_dump.sh"),
                   "arg${local_rank}"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  std::set<std::string> ports, error_files;
  for (int rank = 0; rank < 3; ++rank) {
    std::string p = "[default" + std::to_string(rank) + "]:";
    std::string out = r.out;
    auto has = [&](const std::string& kv) {
      return out.find(p + kv + "\n") != std::string::npos;
    };
    EXPECT_TRUE(has("RANK=" + std::to_string(rank))) << out;
    EXPECT_TRUE(has("LOCAL_RANK=" + std::to_string(rank)));
    EXPECT_TRUE(has("WORLD_SIZE=3"));
    EXPECT_TRUE(has("LOCAL_WORLD_SIZE=3"));
    EXPECT_TRUE(has("GROUP_RANK=0"));
    EXPECT_TRUE(has("GROUP_WORLD_SIZE=1"));
    EXPECT_TRUE(has("ROLE_NAME=default"));
    EXPECT_TRUE(has("ROLE_RANK=" + std::to_string(rank)));
    EXPECT_TRUE(has("ROLE_WORLD_SIZE=3"));
    EXPECT_TRUE(has("MASTER_ADDR=127.0.0.1"));
    EXPECT_TRUE(has("TORCHELASTIC_RESTART_COUNT=0"));
    EXPECT_TRUE(has("TORCHELASTIC_MAX_RESTARTS=2"));
    EXPECT_TRUE(has("TORCHELASTIC_RUN_ID=envjob"));
    EXPECT_TRUE(has("TORCHELASTIC_USE_AGENT_STORE=True"));  // the agent hosts the store
    EXPECT_TRUE(has("TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
    EXPECT_TRUE(has("ARGS=arg" + std::to_string(rank)));
    for (const auto& l : linesWith(out, p + "MASTER_PORT=")) ports.insert(l.substr(l.find('=') + 1));
    for (const auto& l : linesWith(out, p + "TORCHELASTIC_ERROR_FILE="))
      error_files.insert(l.substr(l.find('=') + 1));
  }
  ASSERT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT";
  EXPECT_GT(std::stoi(*ports.begin()), 0);
  EXPECT_EQ(error_files.size(), 3u) << "each rank needs its own error file";
}

TEST(Launch, OmpNumThreadsDefaultsToOneWithAWarning) {
  RunOptions o;
  o.unset_env = {"OMP_NUM_THREADS"};
  auto r = launch({"--nproc-per-node=2", prog("env_dump.sh")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default1]:OMP_NUM_THREADS=1\n"), std::string::npos);
  EXPECT_NE(r.err.find("OMP_NUM_THREADS"), std::string::npos);
  o.env["OMP_NUM_THREADS"] = "3";
  r = launch({"--nproc-per-node=2", prog("env_dump.sh")}, o);
  EXPECT_NE(r.out.find("[default1]:OMP_NUM_THREADS=3\n"), std::string::npos);
}

TEST(Launch, PetEnvironmentFallback) {
  RunOptions o;
  o.env = {{"PET_NPROC_PER_NODE", "2"}, {"PET_ROLE", "trainer"}};
  auto r = launch({prog("env_dump.sh")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[trainer1]:WORLD_SIZE=2"), std::string::npos) << r.out;
  r = launch({"--nproc-per-node=1", prog("env_dump.sh")}, o);
  EXPECT_NE(r.out.find("[trainer0]:WORLD_SIZE=1"), std::string::npos) << r.out;
}

TEST(Launch, PythonFileModuleAndNoPython) {
  RunOptions o;
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  auto r = launch({"--nproc-per-node=2", prog("hello.py"), "x", "${local_rank}"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default1]:python rank=1 args=['x', '1'] unbuffered=True"),
            std::string::npos)
      << r.out;

  o.cwd = kPrograms;
  r = launch({"-m", "pymod.hello_mod"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default0]:module rank=0 name=__main__"), std::string::npos) << r.out;

  r = launch({"--no-python", "--nproc-per-node=2", "echo", "plain ${local_rank}"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default1]:plain 1"), std::string::npos) << r.out;
}

TEST(Launch, FailedRankStopsTheOthersWithSigterm) {
  RunOptions o;
  o.env = {{"FAILS", "1"}, {"SLEEP", "300"}};
  auto r = launch({"--nproc-per-node=3", prog("fail_rank.sh")}, o);
  EXPECT_FALSE(r.timed_out) << "healthy ranks must be stopped, not waited for";
  EXPECT_EQ(r.exit_code, 3) << r.all();
  // Both healthy ranks appear as stopped by SIGTERM, after the root cause.
  EXPECT_EQ(linesWith(r.err, "signal 15 (SIGTERM) received by PID").size(), 2u) << r.err;
}

TEST(Launch, RestartThenSuccess) {
  RunOptions o;
  o.env = {{"FAILS", "2"}, {"SLEEP", "0.2"}};
  auto r = launch({"--nproc-per-node=2", "--max-restarts=2", prog("fail_rank.sh")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default0]:rank 0 done in attempt 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default1]:rank 1 done in attempt 2"), std::string::npos) << r.out;
  EXPECT_EQ(linesWith(r.err, "restarting the worker group").size(), 2u) << r.err;
}

TEST(Launch, RestartsExhaustedExitWithTheRootCauseCodeAndReport) {
  RunOptions o;
  o.env = {{"FAILS", "9"}, {"FAIL_CODE", "42"}, {"SLEEP", "20"}};
  auto r = launch({"--nproc-per-node=2", "--max-restarts=1", prog("fail_rank.sh")}, o);
  EXPECT_EQ(r.exit_code, 42) << r.all();
  EXPECT_NE(r.err.find("fail_rank.sh FAILED"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause (first observed failure)"), std::string::npos);
  auto root = r.err.substr(r.err.find("Root Cause"));
  EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
  EXPECT_NE(root.find("exitcode  : 42"), std::string::npos) << root;
  EXPECT_NE(root.find("boom on rank 1 (attempt 1)"), std::string::npos) << root;
  EXPECT_NE(r.err.find("stopped by launch after the root cause"), std::string::npos);
}

TEST(Launch, WorkerKilledBySignalGives128PlusN) {
  RunOptions o;
  o.env = {{"FAILS", "1"}, {"FAIL_SIGNAL", "SEGV"}, {"SLEEP", "20"}};
  auto r = launch({"--nproc-per-node=2", prog("fail_rank.sh")}, o);
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.all();
  EXPECT_NE(r.err.find("signal 11 (SIGSEGV)"), std::string::npos) << r.err;
}

TEST(Launch, ShutdownTimeoutEscalatesToSigkill) {
  std::string dir = makeTempDir("shutdown");
  RunOptions o;
  o.env = {{"OUT_DIR", dir}, {"IGNORE_TERM", "1"}, {"FAIL_RANK", "1"}};
  auto r = launch({"--nproc-per-node=2", "--shutdown-timeout=0.5", prog("trap_term.sh")}, o);
  EXPECT_EQ(r.exit_code, 5) << r.all();
  EXPECT_NE(readFile(dir + "/signals.0").find("ignored TERM"), std::string::npos);
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
}

TEST(Launch, SigtermIsForwardedAndExitCodeSaysSo) {
  std::string dir = makeTempDir("sigterm");
  RunOptions o;
  o.env = {{"OUT_DIR", dir}};
  Background bg({kLaunch, "--nproc-per-node=2", "--signals-to-handle=SIGTERM,SIGUSR1",
                 prog("trap_term.sh")},
                o);
  ASSERT_TRUE(eventually([&] { return fs::exists(dir + "/ready.0") && fs::exists(dir + "/ready.1"); }, 20s));
  kill(bg.pid(), SIGUSR1);
  ASSERT_TRUE(eventually([&] {
    return readFile(dir + "/signals.0").find("got USR1") != std::string::npos &&
           readFile(dir + "/signals.1").find("got USR1") != std::string::npos;
  }, 10s)) << bg.outputSoFar();
  kill(bg.pid(), SIGTERM);
  auto r = bg.wait(20s);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.all();
  EXPECT_NE(readFile(dir + "/signals.0").find("got TERM"), std::string::npos);
  EXPECT_NE(readFile(dir + "/signals.1").find("got TERM"), std::string::npos);
}

TEST(Launch, LogDirLayoutTeeAndRedirects) {
  std::string dir = makeTempDir("logs");
  auto r = launch({"--nproc-per-node=2", "--log-dir", dir, "--rdzv-id=run1", "--tee=3",
                   prog("env_dump.sh")});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  for (int lr = 0; lr < 2; ++lr) {
    std::string d = dir + "/run1/attempt_0/" + std::to_string(lr);
    std::string out = readFile(d + "/stdout.log");
    EXPECT_NE(out.find("RANK=" + std::to_string(lr) + "\n"), std::string::npos) << d;
    EXPECT_EQ(out.find("[default"), std::string::npos) << "files hold the raw output";
    EXPECT_NE(r.out.find("[default" + std::to_string(lr) + "]:LOCAL_RANK="), std::string::npos);
    EXPECT_NE(readFile(d + "/stdout.log").find("TORCHELASTIC_ERROR_FILE=" + d + "/error.json"),
              std::string::npos);
  }
  // Redirect: files only. Reusing the run id never overwrites the first run's logs.
  r = launch({"--nproc-per-node=2", "--log-dir", dir, "--rdzv-id=run1", "-r", "1",
              prog("env_dump.sh")});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(r.out.find("LOCAL_RANK="), std::string::npos) << r.out;
  EXPECT_NE(readFile(dir + "/run1.1/attempt_0/1/stdout.log").find("RANK=1\n"), std::string::npos);
  EXPECT_NE(readFile(dir + "/run1/attempt_0/1/stdout.log").find("RANK=1\n"), std::string::npos);
}

TEST(Launch, RestartAttemptsGetTheirOwnLogDirs) {
  std::string dir = makeTempDir("attempts");
  RunOptions o;
  o.env = {{"FAILS", "1"}, {"SLEEP", "0.1"}};
  auto r = launch({"--nproc-per-node=2", "--max-restarts=1", "--log-dir", dir, "--rdzv-id=j",
                   "-t", "3", prog("fail_rank.sh")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(readFile(dir + "/j/attempt_0/1/stderr.log").find("boom on rank 1"), std::string::npos);
  EXPECT_NE(readFile(dir + "/j/attempt_1/1/stdout.log").find("done in attempt 1"), std::string::npos);
}

TEST(Launch, LocalRanksFilter) {
  auto r = launch({"--nproc-per-node=3", "--local-ranks-filter=1", prog("env_dump.sh")});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default1]:"), std::string::npos);
  EXPECT_EQ(r.out.find("[default0]:"), std::string::npos);
  EXPECT_EQ(r.out.find("[default2]:"), std::string::npos);
}

// Inputs that used to abort (uncaught std::out_of_range, exit 134), print "[error] stoi"
// (exit 1) or run out of memory: each is a usage error naming the flag (or variable) and value.
TEST(Launch, InputsThatUsedToCrashExitTwoNamingFlagAndValue) {
  const std::vector<std::tuple<std::vector<std::string>, std::map<std::string, std::string>,
                               std::string, std::string>>
      cases = {
          {{"--signals-to-handle=99999999999"}, {}, "--signals-to-handle", "99999999999"},
          {{}, {{"PET_SIGNALS_TO_HANDLE", "99999999999"}}, "PET_SIGNALS_TO_HANDLE", "99999999999"},
          {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:abc"}, {}, "--rdzv-endpoint", "abc"},
          {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:99999999999"}, {}, "--rdzv-endpoint",
           "99999999999"},
          {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:"}, {}, "--rdzv-endpoint", "h:"},
          {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:-1"}, {}, "--rdzv-endpoint", "-1"},
          {{"--rdzv-backend=c10d", "--rdzv-endpoint=h:65536"}, {}, "--rdzv-endpoint", "65536"},
          {{"--nproc-per-node=1000000000"}, {}, "--nproc-per-node", "1000000000"},
          {{"-m", "--no-python"}, {}, "-m/--module and --no-python", "contradict"},
      };
  for (const auto& [args, env, flag, value] : cases) {
    std::vector<std::string> argv = args;
    argv.push_back("/bin/true");
    RunOptions o;
    o.env = env;
    auto r = launch(argv, o);
    EXPECT_EQ(r.exit_code, 2) << r.all();
    EXPECT_NE(r.err.find(flag), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(value), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("stoi"), std::string::npos) << r.err;
  }
}

TEST(Launch, BadInputExitsTwoAndNamesIt) {
  auto r = launch({"--nproc-per-node=many", prog("env_dump.sh")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--nproc-per-node: 'many'"), std::string::npos) << r.err;
  r = launch({"--bogus-flag", prog("env_dump.sh")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'--bogus-flag'"), std::string::npos) << r.err;
  r = launch({"/no/such/program"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'/no/such/program'"), std::string::npos) << r.err;
  r = launch({"--nnodes=2:4", prog("env_dump.sh")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--nnodes=2:4 is elastic: add --rdzv-backend=c10d"), std::string::npos)
      << r.err;
  RunOptions nogpu;
  nogpu.env["CUDA_VISIBLE_DEVICES"] = "";
  r = launch({"--nproc-per-node=gpu", prog("env_dump.sh")}, nogpu);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no GPU is visible"), std::string::npos) << r.err;
  auto help = launch({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: launch"), std::string::npos);
}

TEST(Launch, ExecFailureIsReportedClearly) {
  auto r = launch({"--no-python", "--nproc-per-node=2", prog("not_exec_format.bin")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.all().find("cannot execute"), std::string::npos) << r.all();
  EXPECT_NE(r.all().find("Exec format error"), std::string::npos) << r.all();
}

TEST(Launch, FixedMasterPortInUseIsNamed) {
  int port = 0;
  int fd = listenLoopback(&port);
  ASSERT_GE(fd, 0);
  auto r = launch({"--master-port=" + std::to_string(port), prog("env_dump.sh")});
  close(fd);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(port) + " is already in use"),
            std::string::npos)
      << r.err;
}

// The stack tools run off launch's event loop: while a snapshot is being taken, `launch status`
// is answered, and the snapshot still comes back whole. (When the loop took the stacks itself,
// status waited for the snapshot.) The stand-in eu-stack holds the snapshot open until this test
// lets it go, 8 s at most (launch stops a stack tool after 10): status must come back while it
// is still held. An order, not a time: a status that waits for the snapshot comes back after the
// tool has let go, however fast the machine, and one that does not has 7 s or more (it
// had 2 s when a 6 s tool was timed against a 3 s limit).
TEST(Launch, StatusIsAnsweredWhileAStacksSnapshotIsBeingTaken) {
  std::string logs = makeTempDir("slow-stacks");
  std::string bin = makeTempDir("slow-stacks-bin");
  const std::string started = bin + "/started", release = bin + "/release", done = bin + "/done";
  std::ofstream(bin + "/eu-stack")
      << "#!/bin/sh\n: > " << started << "\n"
      << "end=$(( $(date +%s) + 8 ))\n"
      << "while [ ! -e " << release << " ] && [ \"$(date +%s)\" -lt $end ]; do sleep 0.05; done\n"
      << ": > " << done << "\n"
      << "echo '#0  0x0 in slow_tool_frame ()'\n";
  std::filesystem::permissions(bin + "/eu-stack", std::filesystem::perms::owner_all);
  RunOptions o;
  const char* path = getenv("PATH");
  o.env["PATH"] = bin + ":" + (path ? path : "/usr/bin:/bin");
  Background job({kLaunch, "--no-python", "--nproc-per-node=1", "--log-dir", logs, "--rdzv-id=slow",
                  "sleep", "60"},
                 o);
  ASSERT_TRUE(
      eventually([&] { return job.outputSoFar().find("launch stacks") != std::string::npos; }, 30s))
      << job.outputSoFar();
  Background stacks({kLaunch, "stacks", logs + "/slow"});
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(started); }, 30s))
      << "the snapshot did not start its stack tool\n"
      << stacks.outputSoFar() << job.outputSoFar();
  auto status = run({kLaunch, "status", logs + "/slow"});
  const bool still_held = !std::filesystem::exists(done);
  std::ofstream(release).flush();
  EXPECT_EQ(status.exit_code, 0) << status.all();
  EXPECT_NE(status.out.find("node 0 ("), std::string::npos) << status.out;
  EXPECT_TRUE(still_held) << "launch status came back only after the stack tool let go (8 s)";
  auto snap = stacks.wait(30s);
  EXPECT_EQ(snap.exit_code, 0) << snap.all();
  EXPECT_NE(snap.out.find("ok " + logs + "/slow/snapshots/"), std::string::npos) << snap.out;
  EXPECT_NE(snap.out.find("rank 0 (local rank 0, pid "), std::string::npos) << snap.out;
  kill(job.pid(), SIGTERM);
  job.wait(30s);
}

TEST(Launch, StandaloneHostsOurStoreForTheWorkers) {
  std::string client = std::string(DDPL_TEST_BIN_DIR) + "/store_client_program";
  auto r = launch({"--standalone", "--nproc-per-node=3", "--rdzv-id=storejob", client});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(r.out.find("[default" + std::to_string(rank) + "]:rank " + std::to_string(rank) +
                         " saw 'hello from " + std::to_string((rank + 1) % 3) + "'"),
              std::string::npos)
        << r.out;
  EXPECT_NE(r.out.find("arrived=3"), std::string::npos) << r.out;
  // A restarted group gets a fresh key prefix, so counters from the failed attempt don't leak.
  RunOptions o;
  o.env["FAIL_ONCE"] = "1";
  r = launch({"--standalone", "--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=again", client}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("prefix=again/attempt_1/"), std::string::npos) << r.out;
  EXPECT_EQ(linesWith(r.out, "prefix=again/attempt_1/").size(), 2u) << r.out;
  for (const auto& l : linesWith(r.out, "prefix=again/attempt_1/"))
    EXPECT_TRUE(l.find("arrived=1") != std::string::npos || l.find("arrived=2") != std::string::npos) << l;
  // Without --standalone, no store is started and none is advertised.
  r = launch({"--no-python", "sh", "-c", "echo store=${DDPL_STORE_ADDR:-none}"});
  EXPECT_NE(r.out.find("store=none"), std::string::npos) << r.out;
}

// On a terminal, a worker's carriage-return updates (a progress bar) appear as they happen,
// not when the line ends; another rank's line scrolls above them whole; the worker sees a
// terminal as under torchrun; the log file keeps the line's final state.
TEST(LaunchTerminal, ProgressBarUpdatesShowLiveInAPty) {
  std::string dir = makeTempDir("pty");
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  std::string slave_name = ptsname(master);
  std::string logs = dir + "/logs";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setsid();
    int slave = open(slave_name.c_str(), O_RDWR);
    termios t{};
    tcgetattr(slave, &t);
    t.c_oflag &= ~static_cast<tcflag_t>(OPOST);  // the bytes launch writes, untranslated
    tcsetattr(slave, TCSANOW, &t);
    dup2(slave, 0);
    dup2(slave, 1);
    dup2(slave, 2);
    setenv("OUT_DIR", dir.c_str(), 1);
    execl(kLaunch.c_str(), kLaunch.c_str(), "--nproc-per-node=2", "--tee=3", "--log-dir",
          logs.c_str(), "--rdzv-id=bar", prog("progress_bar.sh").c_str(), nullptr);
    _exit(127);
  }
  fcntl(master, F_SETFL, O_NONBLOCK);
  std::string screen;
  auto pump = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = read(master, buf, sizeof(buf))) > 0) screen.append(buf, static_cast<size_t>(n));
    return screen;
  };
  auto shows = [&](const std::string& text) {
    return eventually([&] { return pump().find(text) != std::string::npos; }, 20s);
  };
  EXPECT_TRUE(shows("[default0]:progress 1/3")) << screen;  // before any newline
  std::ofstream(dir + "/go.1") << "";
  EXPECT_TRUE(shows("[default1]:rank 1 says hello\n")) << screen;
  EXPECT_TRUE(eventually([&] { return fs::exists(dir + "/said.1"); }, 20s));
  EXPECT_TRUE(shows("[default0]:progress 2/3")) << screen;
  std::ofstream(dir + "/go.2") << "";
  EXPECT_TRUE(shows("[default0]:progress 3/3\n")) << screen;
  int status = 0;
  for (int i = 0; i < 1000 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
    pump();
    usleep(20000);
  }
  pump();
  close(master);
  ASSERT_TRUE(WIFEXITED(status)) << screen;
  EXPECT_EQ(WEXITSTATUS(status), 0) << screen;
  EXPECT_NE(screen.find("[default0]:stdout is a terminal"), std::string::npos) << screen;
  // The other rank's line was never cut by the bar: it starts on a cleared line and ends whole.
  EXPECT_NE(screen.find("\r\x1b[K[default1]:rank 1 says hello\n"), std::string::npos) << screen;
  EXPECT_EQ(readFile(logs + "/bar/attempt_0/0/stdout.log"), "stdout is a terminal\nprogress 3/3\n");
}

TEST(LaunchTerminal, OffATerminalWorkersGetPipesAndFinalLines) {
  std::string dir = makeTempDir("nopty");
  for (const char* go : {"/go.1", "/go.2"}) std::ofstream(dir + go) << "";
  RunOptions o;
  o.env = {{"OUT_DIR", dir}};
  auto r = launch({"--nproc-per-node=2", prog("progress_bar.sh")}, o);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default0]:stdout is a pipe\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[default0]:progress 3/3\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("progress 1/3"), std::string::npos) << r.out;
}

// A launch installed in a virtual environment (a wheel's, or cmake --install into its prefix)
// runs a .py PROGRAM under that environment's interpreter, not python3 from PATH; PYTHON_EXEC
// still wins; a worker that cannot import torch gets the interpreter named in the report.
TEST(LaunchPythonChoice, TheEnvironmentsInterpreterRunsScripts) {
  std::string venv = makeTempDir("venv");
  fs::create_directories(venv + "/bin");
  fs::copy_file(kLaunch, venv + "/bin/launch");
  std::ofstream(venv + "/bin/python3") << "#!/bin/sh\n"
                                          "echo \"venv python: $*\"\n"
                                          "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\n"
                                          "exit 1\n";
  fs::permissions(venv + "/bin/python3", fs::perms::owner_all);
  std::string script = prog("hello.py");
  RunOptions o;
  o.unset_env = {"PYTHON_EXEC", "DDPL_LAUNCH_PYTHON"};
  auto r = run({venv + "/bin/launch", "--log-level=debug", script}, o);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_NE(r.out.find("[default0]:venv python: -u " + script), std::string::npos) << r.all();
  EXPECT_NE(r.err.find("Python: " + venv + "/bin/python3 (the interpreter of the environment"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("ran under " + venv + "/bin/python3 (the interpreter of the environment "
                       "launch is installed in), which cannot import torch"),
            std::string::npos)
      << r.err;
  // PYTHON_EXEC wins over the environment's interpreter.
  o.env = {{"PYTHON_EXEC", "/bin/echo"}};
  r = run({venv + "/bin/launch", script}, o);
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.out.find("[default0]:-u " + script), std::string::npos) << r.all();
  // A build tree's launch has no interpreter beside it: python3 from PATH, as before.
  o.env = {{"PATH", venv + "/bin:/usr/bin:/bin"}};
  r = run({kLaunch, "--log-level=debug", script}, o);
  EXPECT_NE(r.err.find("Python: " + venv + "/bin/python3 (python3 from PATH)"), std::string::npos)
      << r.err;
}

namespace {
// The words of rank `global_rank`'s row in launch's end-of-run summary.
std::vector<std::string> summaryRow(const std::string& text, int global_rank) {
  auto at = text.find("per-rank summary of attempt");
  if (at == std::string::npos) return {};
  std::istringstream in(text.substr(at));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.size() >= 8 && w[0] == std::to_string(global_rank)) return w;
  }
  return {};
}
}  // namespace

// Workers report steps through DDPL_HEARTBEAT_FD with the documented Python one-liner; the
// summary at the end shows them per rank. A program that never reports shows "-".
TEST(LaunchProgress, HeartbeatStepsReachTheEndOfRunSummary) {
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"STEPS", "4"}, {"STEP_SECONDS", "0.05"}};
  auto r = launch({"--nproc-per-node=2", "--monitor-interval=0.02", prog("beats.py")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  for (int rank = 0; rank < 2; ++rank) {
    auto w = summaryRow(r.err, rank);
    ASSERT_FALSE(w.empty()) << r.err;
    EXPECT_EQ(w[1], std::to_string(rank)) << r.err;  // local rank
    EXPECT_EQ(w[3], "4") << r.err;                    // steps
    EXPECT_NE(w[4], "-") << r.err;                    // mean step time
    EXPECT_NE(w[7], "-") << r.err;                    // peak memory
  }
  EXPECT_NE(r.out.find("heartbeat fd "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("heartbeat fd -1"), std::string::npos) << r.out;

  auto silent = launch({"--nproc-per-node=1", prog("hello.py")}, o);
  ASSERT_EQ(silent.exit_code, 0) << silent.all();
  auto w = summaryRow(silent.err, 0);
  ASSERT_FALSE(w.empty()) << silent.err;
  EXPECT_EQ(w[3], "-") << silent.err;
  // --log-level=warn keeps the summary out.
  auto quiet = launch({"--log-level=warn", "--nproc-per-node=1", prog("hello.py")}, o);
  EXPECT_EQ(quiet.err.find("per-rank summary"), std::string::npos) << quiet.err;
}

// A rank that sleeps 30 ms more per step is reported as a straggler, while the job runs and in
// the summary, and no other rank is.
TEST(LaunchProgress, SlowRankIsReportedAsAStragglerAndNoOtherIs) {
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"STEPS", "40"}, {"STEP_SECONDS", "0.02"},
           {"SLOW_RANK", "1"}, {"SLOW_FACTOR", "2.5"}};
  auto r = launch({"--nproc-per-node=3", "--monitor-interval=0.01", prog("beats.py")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("straggler on "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("straggler: rank 1 (local rank 1) takes"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 0 (local rank 0) takes"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("rank 2 (local rank 2) takes"), std::string::npos) << r.err;
  // Even ranks: no straggler.
  o.env.erase("SLOW_RANK");
  auto even = launch({"--nproc-per-node=3", "--monitor-interval=0.01", prog("beats.py")}, o);
  ASSERT_EQ(even.exit_code, 0) << even.all();
  EXPECT_EQ(even.err.find("straggler"), std::string::npos) << even.err;
}

namespace {
// tmux on a server of the test's own, so that nothing of the user's is touched.
std::string tmux(const std::string& socket, const std::string& args) {
  auto r = run({"/bin/sh", "-c", "tmux -L " + socket + " " + args});
  return r.out;
}
}  // namespace

// The live view in a real terminal (tmux): while the job runs, the bottom line of the screen
// is launch's status line, below the worker lines and a rank's carriage-return progress bar;
// at the end every worker line is on the screen whole, once, and no status line is left.
TEST(LaunchLiveView, StatusLineInATerminalLeavesWorkerLinesWhole) {
  if (run({"/bin/sh", "-c", "command -v tmux"}).exit_code != 0)
    GTEST_SKIP() << "tmux is not installed (scripts/setup.sh installs it)";
  std::string socket = "ddpl-live-" + std::to_string(getpid());
  std::string cmd = "env PYTHON_EXEC=" + std::string(DDPL_PYTHON) +
                    " LINES=20 STEP_SECONDS=0.1 " + kLaunch +
                    " --nproc-per-node=2 --monitor-interval=0.05 " + prog("chatty_beats.py") +
                    "; echo EXIT=$?; sleep 60";
  tmux(socket, "new-session -d -s live -x 160 -y 100 '" + cmd + "'");
  auto screen = [&] { return tmux(socket, "capture-pane -p -t live -S -200"); };
  auto lastLine = [](const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
      if (l.find_first_not_of(' ') != std::string::npos) lines.push_back(l);
    return lines.empty() ? std::string() : lines.back();
  };
  std::string seen;
  bool status_at_bottom = eventually([&] {
    seen = screen();
    return lastLine(seen).rfind("ddpl | 2/2 ranks up", 0) == 0 &&
           seen.find("line 5 of rank 1") != std::string::npos;
  }, 20s);
  EXPECT_TRUE(status_at_bottom) << seen;
  // The bar sits right above the status line while it is being drawn.
  EXPECT_NE(seen.find("[default0]:bar "), std::string::npos) << seen;
  bool done = eventually([&] {
    seen = screen();
    return seen.find("EXIT=") != std::string::npos;
  }, 30s);
  tmux(socket, "kill-server");
  ASSERT_TRUE(done) << seen;
  EXPECT_NE(seen.find("EXIT=0"), std::string::npos) << seen;
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 1; i <= 20; ++i) {
      std::string line = "[default" + std::to_string(rank) + "]:line " + std::to_string(i) +
                         " of rank " + std::to_string(rank);
      int whole = 0;
      std::istringstream in(seen);
      for (std::string l; std::getline(in, l);) whole += l == line;
      EXPECT_EQ(whole, 1) << line << " in\n" << seen;
    }
  EXPECT_EQ(linesWith(seen, "ddpl |").size(), 0u) << seen;
  EXPECT_EQ(linesWith(seen, "[default0]:bar 20/20").size(), 1u) << seen;
  EXPECT_EQ(linesWith(seen, "per-rank summary of attempt 0").size(), 1u) << seen;
}

// Not a terminal: a plain log line every --monitor-log-interval with the same figures;
// --monitor=off: none.
TEST(LaunchLiveView, PeriodicLogLinesWhenNotATerminalAndOffMeansOff) {
  RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"LINES", "15"}, {"STEP_SECONDS", "0.1"}};
  auto r = launch({"--nproc-per-node=2", "--monitor-log-interval=1", prog("chatty_beats.py")}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  auto lines = linesWith(r.err, "] ranks: 2/2 ranks up ");
  EXPECT_GE(lines.size(), 1u) << r.err;
  for (const auto& l : lines) {
    EXPECT_NE(l.find("; step "), std::string::npos) << l;
    EXPECT_NE(l.find("; cpu% "), std::string::npos) << l;
    EXPECT_NE(l.find("; mem "), std::string::npos) << l;
  }
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "no terminal codes in a log";
  auto off = launch({"--nproc-per-node=2", "--monitor=off", "--monitor-log-interval=1",
                     prog("chatty_beats.py")}, o);
  ASSERT_EQ(off.exit_code, 0) << off.all();
  EXPECT_EQ(linesWith(off.err, "] ranks: ").size(), 0u) << off.err;
  auto bad = launch({"--nproc-per-node=1", "--monitor=sometimes", prog("hello.py")});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--monitor: 'sometimes' is not auto, live, log or off"),
            std::string::npos) << bad.err;
}

namespace {
// KEY=VALUE lines of `env`'s output.
std::map<std::string, std::string> envFile(const std::string& path) {
  std::map<std::string, std::string> out;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);)
    if (auto eq = line.find('='); eq != std::string::npos)
      out[line.substr(0, eq)] = line.substr(eq + 1);
  return out;
}
}  // namespace

// torchrun 2.11+'s --virtual-local-rank: every worker has LOCAL_RANK=0 and sees only the
// device of its local rank, picked from launch's own CUDA_VISIBLE_DEVICES (or its index when
// unset); too few devices for the local ranks stop the run before any worker starts.
TEST(LaunchTorchrunFlags, VirtualLocalRankGivesEachWorkerItsOwnDevice) {
  std::string dir = makeTempDir("vlr");
  auto job = [&](const std::string& tag, RunOptions o) {
    return launch({"--nproc-per-node=3", "--virtual-local-rank", "--monitor=off", "--no-python",
                   "/bin/sh", "-c", "env > " + dir + "/" + tag + ".${local_rank}.env"},
                  o);
  };
  RunOptions listed;
  listed.env["CUDA_VISIBLE_DEVICES"] = "3,5, GPU-7f";
  auto r = job("listed", listed);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  const char* expected[] = {"3", "5", "GPU-7f"};
  for (int lr = 0; lr < 3; ++lr) {
    auto env = envFile(dir + "/listed." + std::to_string(lr) + ".env");
    EXPECT_EQ(env["LOCAL_RANK"], "0") << lr;
    EXPECT_EQ(env["RANK"], std::to_string(lr));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], expected[lr]);
    EXPECT_EQ(env.count("HIP_VISIBLE_DEVICES"), 0u);
  }
  RunOptions unset;
  unset.unset_env = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"};
  r = job("unset", unset);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  for (int lr = 0; lr < 3; ++lr)
    EXPECT_EQ(envFile(dir + "/unset." + std::to_string(lr) + ".env")["CUDA_VISIBLE_DEVICES"],
              std::to_string(lr));
  RunOptions few;
  few.env["CUDA_VISIBLE_DEVICES"] = "3,5";
  r = job("few", few);
  EXPECT_EQ(r.exit_code, 2) << r.all();
  EXPECT_NE(r.err.find("--virtual-local-rank: CUDA_VISIBLE_DEVICES='3,5' names 2 device(s), "
                       "none for local rank 2"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir + "/few.0.env")) << "a worker started";
  // Without the flag: the real local rank, launch's devices inherited as they are.
  r = launch({"--nproc-per-node=2", "--monitor=off", "--no-python", "/bin/sh", "-c",
              "env > " + dir + "/plain.${local_rank}.env"},
             few);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  EXPECT_EQ(envFile(dir + "/plain.1.env")["LOCAL_RANK"], "1");
  EXPECT_EQ(envFile(dir + "/plain.1.env")["CUDA_VISIBLE_DEVICES"], "3,5");
}

// torchrun 2.11+'s --duplicate-stdout-filters/--duplicate-stderr-filters: the tee'd lines that
// hold a filter string, of every rank --local-ranks-filter shows, also go to
// <run>/attempt_<n>/filtered_std{out,err}.log, prefixed; a restart writes the next attempt's.
TEST(LaunchTorchrunFlags, DuplicateFiltersCopyMatchingTeedLinesPerAttempt) {
  std::string logs = makeTempDir("dup");
  std::string ready = makeTempDir("dup-ready");
  auto r =
      launch({"--nproc-per-node=3", "--tee=3", "--local-ranks-filter=0,2", "--log-dir", logs,
              "--rdzv-id=dup", "--max-restarts=1", "--monitor=off",
              "--duplicate_stdout_filters=apple,or,,ange", "--duplicate-stderr-filters", "kiwi",
              "--no-python", "/bin/sh", "-c",
              // Attempt 0 fails once every rank has written its lines; attempt 1 succeeds.
              "echo \"apple ${local_rank}\"; echo banana; echo 'or,ange'; echo kiwi >&2; "
              "echo apple >&2; [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ] && exit 0; touch " +
                  ready + "/${local_rank}; i=0; while [ $(ls " + ready +
                  " | wc -l) -lt 3 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; exit 3"});
  ASSERT_EQ(r.exit_code, 0) << r.all();
  auto sorted = [](const std::string& text) {
    std::multiset<std::string> lines;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines.insert(l);
    return lines;
  };
  for (const std::string attempt : {"attempt_0", "attempt_1"}) {
    std::string base = logs + "/dup/" + attempt;
    EXPECT_EQ(sorted(readFile(base + "/filtered_stdout.log")),
              (std::multiset<std::string>{"[default0]:apple 0", "[default0]:or,ange",
                                          "[default2]:apple 2", "[default2]:or,ange"}))
        << attempt;
    EXPECT_EQ(sorted(readFile(base + "/filtered_stderr.log")),
              (std::multiset<std::string>{"[default0]:kiwi", "[default2]:kiwi"}))
        << attempt;
    // The per-rank files keep everything, the filtered-out rank's too.
    EXPECT_EQ(readFile(base + "/1/stdout.log"), "apple 1\nbanana\nor,ange\n") << attempt;
  }
  // Not tee'd: nothing is copied (as in torchrun) and launch says why.
  auto untee = launch({"--nproc-per-node=1", "--log-dir", logs, "--rdzv-id=untee", "--monitor=off",
                       "--duplicate-stdout-filters=apple", "--no-python", "/bin/echo", "apple"});
  ASSERT_EQ(untee.exit_code, 0) << untee.all();
  EXPECT_EQ(readFile(logs + "/untee/attempt_0/filtered_stdout.log"), "");
  EXPECT_NE(untee.err.find("add --tee 1 or --tee 3"), std::string::npos) << untee.err;
}

// torchrun 2.15's --print-completion: a script the shell loads, from launch's own options.
TEST(LaunchTorchrunFlags, PrintCompletionScriptsLoadAndComplete) {
  std::string dir = makeTempDir("completion");
  auto bash = launch({"--print-completion", "bash"});
  ASSERT_EQ(bash.exit_code, 0) << bash.all();
  { std::ofstream(dir + "/launch.bash") << bash.out; }
  // What bash offers after "launch --virt", "launch --monitor " and past the program.
  auto complete =
      run({"/bin/bash", "-c",
           "source " + dir +
               "/launch.bash; "
               "t() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _launch; "
               "echo \"${COMPREPLY[*]}\"; }; "
               "t launch --virt; t launch --monitor ''; t launch --nproc_per_node g; "
               "t launch --nnodes 2 train.py --virt"});
  ASSERT_EQ(complete.exit_code, 0) << complete.all();
  EXPECT_EQ(complete.out, "--virtual-local-rank\nauto live log off\ngpu\n\n") << complete.all();
  for (const std::string shell : {"zsh", "tcsh"}) {
    auto r = launch({"--print_completion=" + shell});
    ASSERT_EQ(r.exit_code, 0) << r.all();
    std::string path = "/usr/bin/" + shell;
    if (!fs::exists(path)) continue;  // the shell is optional here; bash is checked above
    { std::ofstream(dir + "/launch." + shell) << r.out; }
    auto check = shell == "zsh"
                     ? run({path, "-n", dir + "/launch.zsh"})
                     : run({path, "-f", "-c", "source " + dir + "/launch.tcsh; complete launch"});
    EXPECT_EQ(check.exit_code, 0) << shell << ": " << check.all();
  }
  auto bad = launch({"--print-completion", "fish"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("'fish' is not bash, zsh or tcsh"), std::string::npos) << bad.err;
}
