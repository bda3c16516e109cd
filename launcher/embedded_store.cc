#include "launcher/embedded_store.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::launcher {
namespace {

using StartFn = void* (*)(const char*, int, const char*, int, char*, size_t);
using StopFn = void (*)(void*);

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

std::string defaultPluginPath() {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libddpl_embedded_store.so";
  std::string dir(exe, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../lib/libddpl_embedded_store.so";
}

}  // namespace

EmbeddedStore::EmbeddedStore(std::string host, std::string plugin_path)
    : host_(std::move(host)),
      plugin_path_(plugin_path.empty() ? defaultPluginPath() : std::move(plugin_path)),
      token_(randomToken()) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
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
    throw NetworkError(fmt::format("embedded store: cannot bind a port on {}: {}", host_, strerror(e)));
  }
  port_ = ntohs(a.sin_port);
  endpoint_ = fmt::format("{}:{}", host_, port_);
}

EmbeddedStore::~EmbeddedStore() {
  if (starter_.joinable()) starter_.join();
  if (server_ && plugin_) reinterpret_cast<StopFn>(dlsym(plugin_, "ddpl_embedded_store_stop"))(server_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void EmbeddedStore::startInBackground() {
  starter_ = std::thread([this] {
    std::string error;
    void* plugin = dlopen(plugin_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    void* server = nullptr;
    if (!plugin) {
      error = std::string("cannot load the store plugin: ") + dlerror();
    } else if (auto start = reinterpret_cast<StartFn>(dlsym(plugin, "ddpl_embedded_store_start"))) {
      char buf[1024] = {0};
      server = start(host_.c_str(), port_, token_.c_str(), static_cast<int>(log::logger().level()),
                     buf, sizeof(buf));
      if (!server) error = buf;
    } else {
      error = "store plugin " + plugin_path_ + " has no ddpl_embedded_store_start";
    }
    std::lock_guard<std::mutex> lock(mu_);
    plugin_ = plugin;
    server_ = server;
    start_error_ = error;
    if (reserve_fd_ >= 0) {  // the server listens on the port now: the placeholder can go
      close(reserve_fd_);
      reserve_fd_ = -1;
    }
    if (!error.empty())
      log::error("the embedded store on {} did not start: {}; workers that use DDPL_STORE_ADDR "
                 "will fail to connect",
                 endpoint_, error);
  });
}

std::string EmbeddedStore::waitUntilServing() {
  if (starter_.joinable()) starter_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return start_error_;
}

std::map<std::string, std::string> EmbeddedStore::workerEnv(const std::string& run_id,
                                                            int attempt) {
  if (!starter_.joinable() && !server_) startInBackground();
  return {{"DDPL_STORE_ADDR", endpoint_},
          {"DDPL_STORE_TOKEN", token_},
          {"DDPL_STORE_PREFIX", run_id + "/attempt_" + std::to_string(attempt) + "/"}};
}

}  // namespace ddpl::launcher
