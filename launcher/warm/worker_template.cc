#include "launcher/warm/worker_template.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "launcher/process/child_process.h"

namespace ddpl::launcher::warm {
namespace {

constexpr int kControlFd = 3;  // template.py's _CONTROL_FD
constexpr int kSourceFd = 4;   // the bootstrap below reads the template's program from it
constexpr size_t kMaxReply = 64 * 1024;
constexpr int kSocketBuffer = 8 << 20;  // template.py's _MAX_MESSAGE

// Runs template.py as a module of its own (not __main__, whose namespace a worker's program
// gets), then its main(): in a worker, the program runs when main() returns into this line.
constexpr const char* kBootstrap =
    "import os,sys,types\n"
    "with os.fdopen(4,'rb') as f: s=f.read()\n"
    "m=types.ModuleType('ddplaunch_warm_template')\n"
    "sys.modules[m.__name__]=m\n"
    "exec(compile(s,'<ddplaunch warm template>','exec'),m.__dict__)\n"
    "del f,s\n"
    "m.main()\n"
    // Room for a worker's command line in ps (template.py's _set_cmdline rewrites this area).
    "#                                                                                       "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        "
    "                                                                                        ";

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int above(int fd, int floor) {
  if (fd < 0) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  close(fd);
  return moved;
}

}  // namespace

WorkerTemplate::WorkerTemplate(TemplateOptions options) : options_(std::move(options)) {
  int sv[2] = {-1, -1}, src[2] = {-1, -1};
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0 || pipe2(src, O_CLOEXEC) != 0)
    throw Error(std::string("cannot start the warm template: ") + strerror(errno));
  int log = open(options_.log_path.c_str(),
                 O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_APPEND, 0600);
  if (log < 0) {
    int e = errno;
    for (int fd : {sv[0], sv[1], src[0], src[1]}) close(fd);
    throw Error(fmt::format("cannot create the warm template's log '{}': {}", options_.log_path,
                            strerror(e)));
  }
  const std::string source = templateSource();
  // Above every number the child moves them to, so that no dup2 there overwrites another.
  int child_sock = above(sv[1], 10), child_src = above(src[0], 10), child_log = above(log, 10);
  sock_ = sv[0];
  int buf = kSocketBuffer;
  setsockopt(sock_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  // The source fits the pipe's buffer (64 KiB): written before the fork, read at its leisure.
  bool wrote = source.size() < 60000 &&
               write(src[1], source.data(), source.size()) == static_cast<ssize_t>(source.size());
  close(src[1]);
  if (!wrote || child_sock < 0 || child_src < 0 || child_log < 0) {
    for (int fd : {child_sock, child_src, child_log, sock_})
      if (fd >= 0) close(fd);
    sock_ = -1;
    throw Error("cannot start the warm template: its descriptors could not be set up");
  }
  std::vector<std::string> argv = {options_.python, "-u", "-c", kBootstrap};
  argv.insert(argv.end(), options_.modules.begin(), options_.modules.end());
  std::vector<char*> cargv, cenvp;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : options_.envp) cenvp.push_back(e.data());
  cenvp.push_back(nullptr);

  ChildSetup setup;
  setup.group = ProcessGroup::kNew;  // out of reach of a terminal's ^C, as the workers
  setup.death_signal = SIGKILL;
  setup.all_signals_default = true;  // what a cold worker starts with
  setup.close_other_fds = true;
  setup.keep_fds = {child_sock, child_src, child_log};
  started_ = now();
  pid_ = forkChild(setup, [&]() -> int {
    dup2(child_log, STDOUT_FILENO);
    dup2(child_log, STDERR_FILENO);
    dup2(child_sock, kControlFd);
    dup2(child_src, kSourceFd);
    execve(cargv[0], cargv.data(), cenvp.data());
    return 127;
  });
  int e = errno;
  for (int fd : {child_sock, child_src, child_log}) close(fd);
  if (pid_ < 0) {
    close(sock_);
    sock_ = -1;
    throw Error(std::string("cannot start the warm template: fork: ") + strerror(e));
  }
}

WorkerTemplate::~WorkerTemplate() {
  if (sock_ >= 0) close(sock_);
  if (pid_ > 0 && state_ != State::kDead) kill(-pid_, SIGKILL);
}

void WorkerTemplate::giveUp(const std::string& why) {
  why_not_ = why;
  if (state_ != State::kDead) state_ = State::kUnusable;
  if (pid_ > 0 && state_ != State::kDead) kill(-pid_, SIGKILL);
}

std::optional<std::string> WorkerTemplate::receive(double timeout_sec, std::string* why) {
  double deadline = now() + timeout_sec;
  while (true) {
    pollfd p{sock_, POLLIN, 0};
    int ms = static_cast<int>(std::max(0.0, deadline - now()) * 1000);
    int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      *why = fmt::format("no answer within {:.0f}s", timeout_sec);
      return std::nullopt;
    }
    std::string buf(kMaxReply, '\0');
    ssize_t n = recv(sock_, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      *why = "it exited (its log: " + options_.log_path + ")";
      return std::nullopt;
    }
    buf.resize(static_cast<size_t>(n));
    return buf;
  }
}

bool WorkerTemplate::awaitReady(double timeout_sec, std::string* why) {
  if (state_ == State::kReady) return true;
  if (state_ != State::kStarting) {
    *why = why_not_.empty() ? "it exited" : why_not_;
    return false;
  }
  std::string err;
  auto msg = receive(timeout_sec, &err);
  if (!msg) {
    giveUp("the template did not get ready: " + err);
    *why = why_not_;
    return false;
  }
  try {
    auto j = nlohmann::json::parse(*msg);
    if (j.value("ready", false)) {
      state_ = State::kReady;
      import_seconds_ = now() - started_;
      return true;
    }
    giveUp(j.value("why", std::string("the template refused without a reason")));
  } catch (const std::exception& e) {
    giveUp(std::string("the template's answer was not understood: ") + e.what());
  }
  *why = why_not_;
  return false;
}

std::optional<pid_t> WorkerTemplate::spawn(const WarmSpawn& r, double timeout_sec,
                                           std::string* why) {
  if (state_ != State::kReady) {
    *why = why_not_.empty() ? "the template is not ready" : why_not_;
    return std::nullopt;
  }
  nlohmann::json req;
  req["orig_argv"] = r.argv;
  req["argv"] =
      std::vector<std::string>(r.argv.begin() + std::min<size_t>(2, r.argv.size()), r.argv.end());
  nlohmann::json env = nlohmann::json::object();
  for (const auto& kv : r.envp) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  req["env"] = std::move(env);
  req["cpus"] = r.cpus;
  req["heartbeat_env"] = r.heartbeat_env;
  std::vector<int> fds = {r.stdout_fd, r.stderr_fd};
  std::vector<std::string> names = {"stdout", "stderr"};
  if (r.heartbeat_fd >= 0) {
    fds.push_back(r.heartbeat_fd);
    names.push_back("heartbeat");
  }
  if (r.cgroup_procs_fd >= 0) {
    fds.push_back(r.cgroup_procs_fd);
    names.push_back("cgroup");
  }
  req["fds"] = names;
  std::string body;
  try {
    body = req.dump();
  } catch (const nlohmann::json::exception&) {
    // The template's environment is text: one that is not UTF-8 is passed exactly only by exec.
    *why = "the worker's command or environment is not UTF-8 text";
    return std::nullopt;
  }
  iovec iov{body.data(), body.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t sent;
  do {
    sent = sendmsg(sock_, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) {
    if (errno == EMSGSIZE) {
      *why = fmt::format(
          "the request ({} bytes of command and environment) exceeds the "
          "template's socket",
          body.size());
      return std::nullopt;
    }
    giveUp(std::string("the template's socket failed: ") + strerror(errno));
    *why = why_not_;
    return std::nullopt;
  }
  std::string err;
  auto reply = receive(timeout_sec, &err);
  if (!reply) {
    giveUp("the template did not fork a worker: " + err);
    *why = why_not_;
    return std::nullopt;
  }
  try {
    auto j = nlohmann::json::parse(*reply);
    if (j.contains("pid")) {
      long long pid = j["pid"].get<long long>();
      if (pid > 1 && pid < (1LL << 22)) return static_cast<pid_t>(pid);
      giveUp(fmt::format("the template answered pid {}", pid));
    } else {
      *why = "the template could not fork the worker: " + j.value("error", std::string("?"));
      return std::nullopt;
    }
  } catch (const std::exception& e) {
    giveUp(std::string("the template's answer was not understood: ") + e.what());
  }
  *why = why_not_;
  return std::nullopt;
}

}  // namespace ddpl::launcher::warm
