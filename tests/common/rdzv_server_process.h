#pragma once
// For the fault tests that run the rdzv-server binary (rdzv_hostile_test,
// rdzv_socket_hostile_test): the server as a child process, and what they measure of it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/common/subprocess.h"

#if defined(__SANITIZE_ADDRESS__)
#define DDPL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DDPL_TEST_ASAN 1
#endif
#endif

namespace ddpl::testing {

// A file holding a token, for rdzv-server's --token-file; removed with its directory.
class TokenFile {
 public:
  explicit TokenFile(const std::string& token) : dir_(makeTempDir("rdzv_token")) {
    std::ofstream(path()) << token << "\n";
  }
  ~TokenFile() { std::filesystem::remove_all(dir_); }
  std::string path() const { return dir_ + "/token"; }

 private:
  std::string dir_;
};

// Resident memory of a process, in bytes (-1 when it cannot be read).
inline int64_t rssOf(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

inline int openFilesOf(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

inline int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// Empty when this process may raise its open-file limit to `need`; otherwise why not, for the
// test to skip with.
inline std::string tooFewOpenFiles(rlim_t need) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) return {};
  return fmt::format("this test process needs {} open files; its hard limit is {}", need,
                     rl.rlim_max);
}

// Raises this process's open-file limit (to `want`, or the hard limit) for one test, and puts
// it back after.
class OpenFilesRaised {
 public:
  explicit OpenFilesRaised(rlim_t want) {
    getrlimit(RLIMIT_NOFILE, &old_);
    rlimit raised = old_;
    raised.rlim_cur = old_.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(old_.rlim_max, want);
    ok_ = setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  ~OpenFilesRaised() { setrlimit(RLIMIT_NOFILE, &old_); }
  OpenFilesRaised(const OpenFilesRaised&) = delete;
  OpenFilesRaised& operator=(const OpenFilesRaised&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  bool ok_ = false;
};

// An rdzv-server process on a free port (or a given one), optionally under a command prefix
// such as prlimit (which execs the server: same pid). Killed when the test ends.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args, std::vector<std::string> prefix = {},
                         int port = 0)
      : dir_(makeTempDir("rdzv_server")) {
    std::vector<std::string> argv = prefix;
    argv.push_back(std::string(DDPL_BIN_DIR) + "/rdzv-server");
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--port", std::to_string(port), "--port-file", dir_ + "/port"});
    log_ = dir_ + "/server.log";
    pid_ = fork();
    if (pid_ == 0) {
      // Dies with the test, even one a sanitizer aborts: an orphaned server would keep
      // whatever the test's parent had open (the CI's CPU lock, say).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
#ifdef DDPL_TEST_ASAN
      // ASan keeps freed memory in a 256 MiB quarantine to catch late uses: the server's
      // memory could not go back to its baseline. A small one keeps the check meaningful.
      std::string o = std::getenv("ASAN_OPTIONS") ? std::getenv("ASAN_OPTIONS") : "";
      setenv("ASAN_OPTIONS", (o + ":quarantine_size_mb=4").c_str(), 1);
#endif
      FILE* f = std::fopen(log_.c_str(), "w");
      if (f) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
      cargv.push_back(nullptr);
      execvp(cargv[0], cargv.data());
      _exit(127);
    }
    EXPECT_TRUE(eventually(
        [&] {
          return std::filesystem::exists(dir_ + "/port") && !readFile(dir_ + "/port").empty();
        },
        std::chrono::seconds(20)))
        << log();
    port_ = std::stoi(readFile(dir_ + "/port"));
  }
  ~ServerProcess() {
    stop();
    std::filesystem::remove_all(dir_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string endpoint() const { return fmt::format("127.0.0.1:{}", port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return readFile(log_); }

 private:
  std::string dir_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace ddpl::testing
