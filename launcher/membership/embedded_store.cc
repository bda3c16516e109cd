#include "launcher/membership/embedded_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/grpc_plugin.h"

namespace ddpl::launcher {
namespace {

std::string randomToken() {
  unsigned char bytes[24];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, bytes, sizeof(bytes)) != static_cast<ssize_t>(sizeof(bytes))) {
    if (fd >= 0) close(fd);
    throw Error(std::string("cannot read /dev/urandom for the store token: ") + strerror(errno));
  }
  close(fd);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace

EmbeddedStore::EmbeddedStore(std::string host, bool tcpstore, int port)
    : host_(std::move(host)), token_(randomToken()), tcpstore_(tcpstore) {
  if (port < 0 || port > 65535)
    throw InvalidArgument(fmt::format("embedded store: port {} is out of range 0..65535", port));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host_.c_str(), &a.sin_addr) != 1)
    throw InvalidArgument("embedded store: '" + host_ + "' is not an IPv4 address");
  reserve_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(reserve_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  setsockopt(reserve_fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  socklen_t len = sizeof(a);
  if (bind(reserve_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(reserve_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int e = errno;
    close(reserve_fd_);
    throw NetworkError(
        port != 0
            ? fmt::format("--master-port: {}:{} {}; the agent hosts the job's store "
                          "there: choose another port, or leave --master-port out for a "
                          "free one",
                          host_, port,
                          e == EADDRINUSE ? "is already in use"
                                          : std::string("cannot be bound: ") + strerror(e))
            : fmt::format("embedded store: cannot bind a port on {}: {}", host_, strerror(e)));
  }
  port_ = ntohs(a.sin_port);
  endpoint_ = fmt::format("{}:{}", host_, port_);
}

EmbeddedStore::~EmbeddedStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (starter_.joinable()) starter_.join();
  if (server_) GrpcPlugin::get().stopStore(server_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void EmbeddedStore::startInBackground() {
  starter_ = std::thread([this] {
    std::string error;
    void* server = nullptr;
    try {
      // The workers' own start (exec, their interpreters, their imports) comes first on a
      // small machine: the server starts kStartDelay after them, when the forks are done. Its
      // libraries load at normal priority: every Python worker's init_process_group needs this
      // store (the agent store), and at nice 19 a loaded machine starved the loader for 12 s
      // while the workers, refused, sat in their connect back-off and were judged hung.
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (stop_cv_.wait_for(lock, kStartDelay, [this] { return stopping_; })) return;
      }
      int64_t attempt;
      {
        std::lock_guard<std::mutex> lock(mu_);
        attempt = attempt_;
      }
      // One node's job: torch's protocol has no token, so its clients must be launch's own
      // user's, like the workers it forks (another user on the machine could otherwise
      // overwrite the keys Gloo and NCCL bootstrap from).
      server = GrpcPlugin::get().startStore(host_, port_, token_, tcpstore_, attempt,
                                            static_cast<uint32_t>(geteuid()));
      std::lock_guard<std::mutex> lock(mu_);
      // An attempt begun while the server was starting: opened now, before anyone's workers
      // of it can have been refused for long (they retry).
      if (tcpstore_ && attempt_ != attempt) GrpcPlugin::get().beginStoreAttempt(server, attempt_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    server_ = server;
    start_error_ = error;
    if (reserve_fd_ >= 0) {  // the server listens on the port now: the placeholder can go
      close(reserve_fd_);
      reserve_fd_ = -1;
    }
    if (!error.empty())
      log::error(
          "the embedded store on {} did not start: {}; workers that use DDPL_STORE_ADDR "
          "will fail to connect",
          endpoint_, error);
  });
}

std::string EmbeddedStore::waitUntilServing() {
  if (starter_.joinable()) starter_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return start_error_;
}

void EmbeddedStore::beginAttempt(int64_t attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  attempt_ = attempt;
  if (server_ && tcpstore_) GrpcPlugin::get().beginStoreAttempt(server_, attempt);
}

void EmbeddedStore::startServing() {
  if (!starter_.joinable() && !server_) startInBackground();
}

std::map<std::string, std::string> EmbeddedStore::workerEnv(const std::string& run_id,
                                                            int attempt) {
  return {{envvar::kStoreAddr, endpoint_},
          {envvar::kStoreToken, token_},
          {envvar::kStorePrefix, run_id + "/attempt_" + std::to_string(attempt) + "/"}};
}

}  // namespace ddpl::launcher
