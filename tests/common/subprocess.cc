#include "tests/common/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace ddpl::testing {
namespace {

std::vector<std::string> mergedEnv(const RunOptions& o) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& k : o.unset_env) env.erase(k);
  for (const auto& [k, v] : o.env) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// The fields of /proc/<pid>/stat after the command name ("S 1234 ..."), "" when it is gone.
std::string statFields(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return "";
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return "";
  return line.substr(close_paren + 2);
}

}  // namespace

Background::Background(const std::vector<std::string>& argv, const RunOptions& o) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) throw std::runtime_error("pipe failed");
  auto envs = mergedEnv(o);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : envs) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (!o.cwd.empty() && chdir(o.cwd.c_str()) != 0) _exit(126);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  setpgid(pid_, pid_);
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  fcntl(err_fd_, F_SETFL, O_NONBLOCK);
}

Background::~Background() {
  if (!done_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void Background::pump(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  int n = poll(fds, 2, timeout_ms);
  if (n <= 0) return;
  char buf[65536];
  for (int i = 0; i < 2; ++i) {
    if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
    ssize_t r;
    while ((r = read(fds[i].fd, buf, sizeof(buf))) > 0)
      (i == 0 ? result_.out : result_.err).append(buf, static_cast<size_t>(r));
  }
}

std::string Background::outputSoFar() {
  pump(0);
  return result_.out + result_.err;
}

RunResult Background::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      result_.timed_out = true;
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    pump(20);
  }
  // Collect what is left; writers that outlived the child (grandchildren) are not waited for
  // longer than a moment.
  for (int i = 0; i < 5; ++i) pump(10);
  done_ = true;
  result_.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  return result_;
}

RunResult run(const std::vector<std::string>& argv, const RunOptions& options) {
  Background bg(argv, options);
  return bg.wait(options.timeout);
}

bool processAlive(pid_t pid) {
  std::string fields = statFields(pid);
  if (fields.empty()) return false;
  char state = fields[0];
  return state != 'Z' && state != 'X';
}

pid_t parentOf(pid_t pid) {
  std::istringstream fields(statFields(pid));
  char state;
  pid_t ppid = 0;
  fields >> state >> ppid;
  return ppid;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A port bound and closed at once can be taken again before the test's server binds it: by
// another test under `ctest -j`, or as the ephemeral port of any outgoing connection. So the
// port comes from below the kernel's ephemeral range (which connect() never uses), and a lock
// file in /tmp reserves it for this machine's tests for ten minutes.
int freeLoopbackPort() {
  int lo = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    range >> lo;
  }
  const int first = 10000, last = std::max(first + 1000, lo) - 1;
  std::string dir = "/tmp/ddpl-test-ports";
  mkdir(dir.c_str(), 0777);
  std::mt19937 rng(static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(time(nullptr)));
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int port = first + static_cast<int>(rng() % static_cast<unsigned>(last - first + 1));
    std::string lock = dir + "/" + std::to_string(port);
    struct stat st {};
    if (stat(lock.c_str(), &st) == 0) {
      if (time(nullptr) - st.st_mtime < 600) continue;  // reserved by a recent test
      unlink(lock.c_str());
    }
    int lfd = open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
    if (lfd < 0) continue;  // another test took it just now
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    if (ok) return port;
  }
  throw std::runtime_error("no free loopback port below the ephemeral range after 1000 tries");
}

int connectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

int listenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 8) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

namespace {

// The test program's temporary directories, removed when it exits: every run of the suite left
// a few thousand of them in /tmp. Only by the process that made them: a forked child that calls
// exit() must not take its parent's directories. DDPL_KEEP_TEST_DIRS=1 keeps them (to look at
// what a failed test left).
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  pid_t owner = getpid();
  ~TempDirs() {
    const char* keep = std::getenv("DDPL_KEEP_TEST_DIRS");
    if (getpid() != owner || (keep && std::string(keep) == "1")) return;
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

TempDirs& tempDirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string makeTempDir(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  TempDirs& t = tempDirs();
  std::lock_guard<std::mutex> lock(t.mu);
  t.dirs.push_back(tmpl);
  return tmpl;
}

std::vector<std::string> frameLines(const std::string& trace) {
  std::vector<std::string> out;
  std::istringstream in(trace);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("frame #", 0) == 0) out.push_back(line);
  return out;
}

}  // namespace ddpl::testing
