#pragma once
// Test helpers (torch-free) for the worker library's multi-process tests: start real rank
// processes with the launcher's environment, wait with a deadline, read what they left.
#include "tests/common/subprocess.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ddpl::worker::testing {

inline std::string rankBinary() { return std::string(DDPL_TEST_BIN_DIR) + "/worker_rank"; }

inline int freePort() { return ddpl::testing::freeLoopbackPort(); }

inline std::string tempDir() {
  std::string pattern = "/tmp/ddpl-worker-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

inline bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// fork/exec with this process's environment plus `extra`; stdout and stderr go to `logPath`.
inline pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra,
                   const std::string& logPath) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (auto& [k, v] : extra) env[k] = v;
  std::vector<std::string> envStrings;
  for (auto& [k, v] : env) envStrings.push_back(k + "=" + v);
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    FILE* log = std::fopen(logPath.c_str(), "w");
    if (log) {
      ::dup2(fileno(log), 1);
      ::dup2(fileno(log), 2);
    }
    ::execve(args[0], args.data(), envp.data());
    std::_Exit(127);
  }
  return pid;
}

// Returns the wait status; kills the process (and fails) after `timeout`.
inline int waitFor(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw std::runtime_error("process " + std::to_string(pid) + " did not finish within " +
                               std::to_string(timeout.count()) + "s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

struct RankResult {
  int status = 0;
  std::string log;
  std::string error_file;
};

// Runs `world` ranks of the rank program with the variables `launch`/torchrun would set.
inline std::vector<RankResult> runRanks(int world, const std::vector<std::string>& args, const std::string& dir,
                                        std::chrono::seconds timeout = std::chrono::seconds(120)) {
  const int port = freePort();
  std::vector<pid_t> pids;
  std::vector<RankResult> results(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv{rankBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    results[r].error_file = dir + "/error." + std::to_string(r) + ".json";
    pids.push_back(spawn(argv,
                         {{"RANK", std::to_string(r)},
                          {"LOCAL_RANK", std::to_string(r)},
                          {"WORLD_SIZE", std::to_string(world)},
                          {"LOCAL_WORLD_SIZE", std::to_string(world)},
                          {"MASTER_ADDR", "127.0.0.1"},
                          {"MASTER_PORT", std::to_string(port)},
                          {"TORCHELASTIC_USE_AGENT_STORE", "False"},
                          {"TORCHELASTIC_ERROR_FILE", results[r].error_file},
                          {"OMP_NUM_THREADS", "1"},
                          {"DDPL_BACKEND", "gloo"}},
                         dir + "/rank" + std::to_string(r) + ".log"));
  }
  for (int r = 0; r < world; ++r) {
    results[r].status = waitFor(pids[r], timeout);
    results[r].log = readFile(dir + "/rank" + std::to_string(r) + ".log");
  }
  return results;
}

inline bool exitedWith(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

}  // namespace ddpl::worker::testing
