// Issue 44: another user on the same machine and a running one-node job. `launch --standalone`
// hosts the job's store on MASTER_PORT (torch's TCPStore protocol, which has no token, next to
// our gRPC and socket transports, which need the job's token) and --dashboard its page. The
// stranger is a child of this test running as uid/gid 65534 (nobody), which takes root to
// become: not root, the cases skip, saying so (CI runs them as root). Each case then releases the
// job's worker and checks that the job finished as if nobody had come.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/protocol/tcpstore_format.h"
#include "tests/common/subprocess.h"

namespace ddpl {
namespace {

using namespace std::chrono_literals;
using ::ddpl::testing::Background;
using ::ddpl::testing::RunOptions;
namespace tcpstore = rdzv::tcpstore;

const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
constexpr uid_t kNobody = 65534;

// Runs `check` in a child process as nobody; returns what it says (its verdict), or why it
// could not run.
std::string asNobody(const std::function<std::string()>& check) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(out[0]);
    std::string said;
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0 ||
        ::geteuid() != kNobody)
      said = "could not become uid 65534";
    else
      said = check();
    size_t off = 0;
    while (off < said.size()) {
      ssize_t n = ::write(out[1], said.data() + off, said.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::string said;
  auto until = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      said += " [no verdict within 60 s]";
      ::kill(pid, SIGKILL);
      break;
    }
    char buf[4096];
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    said.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return said;
}

// A connection to 127.0.0.1:port from an IPv4 socket, or from an IPv6 one (to ::ffff:127.0.0.1,
// as torch's own client connects).
int connectV4(int port, bool v6_socket) {
  if (!v6_socket) return ::ddpl::testing::connectLoopback(port);
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &a.sin6_addr);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// torch's client by hand (as tests/fault/rdzv_tcpstore_hostile_test.cc): VALIDATE, PING, then
// ADD rt_stranger 1; says "answered add=N", "closed" (the server ended the connection without
// an answer) or "silent".
std::string torchHello(int port, bool v6_socket) {
  int fd = connectV4(port, v6_socket);
  if (fd < 0) return std::string("cannot connect: ") + std::strerror(errno);
  tcpstore::Request v;
  v.type = tcpstore::Query::kValidate;
  v.u32 = tcpstore::kValidationMagic;
  tcpstore::Request ping;
  ping.type = tcpstore::Query::kPing;
  ping.u32 = 0x5eed;
  tcpstore::Request add;
  add.type = tcpstore::Query::kAdd;
  add.keys = {"rt_stranger"};
  add.number = 1;
  std::string bytes =
      tcpstore::encodeQuery(v) + tcpstore::encodeQuery(ping) + tcpstore::encodeQuery(add);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string got;
  std::string verdict = "silent";
  auto until = std::chrono::steady_clock::now() + 5s;
  while (got.size() < 12) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[64];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      verdict = "closed";
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (got.size() >= 4) {
    uint32_t nonce = 0;
    std::memcpy(&nonce, got.data(), 4);
    verdict = nonce == 0x5eed ? "answered" : "answered wrongly";
    if (got.size() >= 12) {
      int64_t added = 0;
      std::memcpy(&added, got.data() + 4, 8);
      verdict += " add=" + std::to_string(added);
    }
  }
  return verdict;
}

// Our store client, over the socket transport or gRPC: "served" or what it threw.
std::string storeRoundTrip(const std::string& endpoint, const std::string& token, bool socket) {
  try {
    rdzv::GrpcStoreOptions o;
    o.endpoint = endpoint;
    o.token = token;
    o.socket = socket;
    o.prefix = "stranger/";
    o.connect_timeout = 10s;
    o.default_timeout = 10s;
    auto store = rdzv::connectGrpcStore(o);
    store->set("k", rdzv::toBytes("v"));
    return rdzv::toString(store->get("k", 5s)) == "v" ? "served" : "served wrongly";
  } catch (const AuthError& e) {
    return std::string("refused: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("failed: ") + e.what();
  }
}

// One HTTP/1.1 request on loopback: the status code, or -1.
int httpStatus(int port, const std::string& path, const std::string& headers = "") {
  int fd = ::ddpl::testing::connectLoopback(port);
  if (fd < 0) return -1;
  std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n";
  ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  auto until = std::chrono::steady_clock::now() + 5s;
  while (got.find("\r\n") == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (got.rfind("HTTP/1.1 ", 0) != 0 || got.size() < 12) return -1;
  return std::stoi(got.substr(9, 3));
}

// A `launch --standalone --dashboard` job whose one worker writes its environment's store
// endpoints to a file and waits until the test lets it go.
class StrangerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0)
      GTEST_SKIP() << "running a client as another user (uid 65534, nobody) needs root";
    dir_ = ::ddpl::testing::makeTempDir("ddpl-stranger");
    ASSERT_EQ(::mkfifo((dir_ + "/go").c_str(), 0600), 0) << std::strerror(errno);
    const std::string script =
        "printf '%s %s %s\\n' \"$MASTER_PORT\" \"$DDPL_STORE_ADDR\" \"$DDPL_STORE_TOKEN\" "
        "> \"$0/env.tmp\" && mv \"$0/env.tmp\" \"$0/env\" && read go < \"$0/go\"";
    RunOptions o;
    o.timeout = 120s;
    job_ = std::make_unique<Background>(
        std::vector<std::string>{kLaunch, "--standalone", "--nproc-per-node=1", "--dashboard",
                                 "--no-python", "/bin/sh", "-c", script, dir_},
        o);
    std::smatch m;
    ASSERT_TRUE(::ddpl::testing::eventually(
        [&] {
          log_ = job_->outputSoFar();
          return std::regex_search(log_, m,
                                   std::regex(R"(dashboard of the job on http://127\.0\.0\.1:)"
                                              R"((\d+)/ .* token in (\S+)\))")) &&
                 ::access((dir_ + "/env").c_str(), R_OK) == 0;
        },
        30s))
        << log_;
    dashboard_port_ = std::stoi(m[1]);
    std::string token_line = ::ddpl::testing::readFile(m[2]);
    dashboard_token_ = token_line.substr(0, token_line.find('\n'));
    std::istringstream env(::ddpl::testing::readFile(dir_ + "/env"));
    env >> master_port_ >> store_addr_ >> store_token_;
    ASSERT_GT(master_port_, 0) << ::ddpl::testing::readFile(dir_ + "/env");
    ASSERT_FALSE(store_token_.empty());
    ASSERT_FALSE(dashboard_token_.empty());
    // The store starts listening a moment after the worker starts (embedded_store.h).
    ASSERT_TRUE(::ddpl::testing::eventually(
        [&] {
          int fd = ::ddpl::testing::connectLoopback(master_port_);
          if (fd >= 0) ::close(fd);
          return fd >= 0;
        },
        30s))
        << "the job's store never listened on " << master_port_;
  }

  void TearDown() override { finish(); }

  // Lets the worker go: the job must end as if nobody had come. Its whole log is then in log_.
  void finish() {
    if (!job_) return;
    // Non-blocking: ENXIO until the worker has opened its end (it may be a moment behind).
    int fd = -1;
    ::ddpl::testing::eventually(
        [&] {
          return (fd = ::open((dir_ + "/go").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) >= 0;
        },
        10s);
    if (fd >= 0) {
      (void)::write(fd, "go\n", 3);
      ::close(fd);
    }
    auto r = job_->wait(60s);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    log_ = r.all();
    job_.reset();
  }

  std::string dir_;
  std::unique_ptr<Background> job_;
  std::string log_;
  int master_port_ = 0;
  std::string store_addr_, store_token_;
  int dashboard_port_ = 0;
  std::string dashboard_token_;
};

// torch's protocol has no token: before issue 44 a stranger's VALIDATE, PING and ADD were all
// answered, in the job's own namespace.
TEST_F(StrangerTest, TorchStoreServesTheJobsUserAndClosesAnotherUsersClient) {
  const int port = master_port_;
  int64_t added = 0;
  for (bool v6_socket : {false, true}) {
    SCOPED_TRACE(v6_socket ? "IPv6 socket" : "IPv4 socket");
    EXPECT_EQ(asNobody([=] { return torchHello(port, v6_socket); }), "closed");
    // The job's own user (this test's, launch's) is served in the same moment.
    EXPECT_EQ(torchHello(port, v6_socket), "answered add=" + std::to_string(++added));
  }
  finish();
  EXPECT_NE(log_.find("refused a torch TCPStore client from ipv4:127.0.0.1:"), std::string::npos)
      << log_;
  EXPECT_NE(log_.find("its socket is uid 65534's, and this store serves only the job's user, "
                      "uid 0"),
            std::string::npos)
      << log_;
}

// gRPC and the store socket ask every caller for the token, whoever it is: a stranger with the
// job's token is served (the uid rule is only for the protocol without one), without it
// refused.
TEST_F(StrangerTest, StoreTransportsWithATokenServeAnyUserAndRefuseWithout) {
  const std::string addr = store_addr_, token = store_token_;
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC");
    EXPECT_EQ(asNobody([&] { return storeRoundTrip(addr, token, socket); }), "served");
    std::string refused = asNobody([&] { return storeRoundTrip(addr, "", socket); });
    EXPECT_EQ(refused.rfind("refused: ", 0), 0u) << refused;
    refused = asNobody([&] { return storeRoundTrip(addr, token + "x", socket); });
    EXPECT_EQ(refused.rfind("refused: ", 0), 0u) << refused;
  }
}

// The page and its data show the job's last lines: before issue 44 any local user read them
// from loopback without the token.
TEST_F(StrangerTest, DashboardServesTheJobsUserAndAnotherUserOnlyWithTheToken) {
  const int port = dashboard_port_;
  const std::string token = dashboard_token_;
  for (const std::string path : {"/", "/api/job", "/api/logs?rank=0"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(asNobody([&] { return std::to_string(httpStatus(port, path)); }), "403");
    EXPECT_EQ(
        asNobody([&] {
          return std::to_string(httpStatus(port, path, "Authorization: Bearer " + token + "x\r\n"));
        }),
        "403");
    EXPECT_EQ(
        asNobody([&] {
          return std::to_string(httpStatus(port, path, "Authorization: Bearer " + token + "\r\n"));
        }),
        "200");
    // The page's own URL: a browser sends no header with it.
    const std::string with_query =
        path + (path.find('?') == std::string::npos ? "?" : "&") + "token=" + token;
    EXPECT_EQ(asNobody([&] { return std::to_string(httpStatus(port, with_query)); }), "200");
    EXPECT_EQ(httpStatus(port, path), 200) << "the job's own user reads without the token";
  }
  finish();
  EXPECT_NE(log_.find("dashboard: refused GET / from 127.0.0.1:"), std::string::npos) << log_;
}

}  // namespace
}  // namespace ddpl
