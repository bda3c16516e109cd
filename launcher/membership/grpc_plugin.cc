#include "launcher/membership/grpc_plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <mutex>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::launcher {
namespace {
using StartFn = void* (*)(const char*, int, const char*, int, long long, long long, int, char*,
                          size_t);
using StopFn = void (*)(void*);
using AttemptFn = int (*)(void*, long long, char*, size_t);
using ConsoleFn = void (*)(void (*)(void (*)(void*), void*));
using GrpcFn = RendezvousHandler* (*)(const GrpcRendezvousConfig*, int, char*, size_t);
using EtcdFn = RendezvousHandler* (*)(const EtcdRendezvousConfig*, int, char*, size_t);

int logLevel() { return static_cast<int>(log::logger().level()); }
}  // namespace

std::string GrpcPlugin::defaultPath() {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "libddpl_launch_grpc.so";
  std::string dir(exe, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../lib/libddpl_launch_grpc.so";
}

GrpcPlugin& GrpcPlugin::get() {
  static std::once_flag once;
  static GrpcPlugin* plugin = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::string path = defaultPath();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      plugin = new GrpcPlugin(h);
      // Its own copy of the logging facade writes through launch's console.
      if (auto* console = reinterpret_cast<ConsoleFn>(dlsym(h, "ddpl_plugin_console")))
        console([](void (*write)(void*), void* arg) {
          log::writeThroughConsole([&] { write(arg); });
        });
    }
    else
      error =
          "cannot load " + path + " (launch's gRPC plugin; rebuild with make build): " + dlerror();
  });
  if (!plugin) throw Error(error);
  return *plugin;
}

void* GrpcPlugin::symbol(const char* name) {
  void* s = dlsym(handle_, name);
  if (!s) throw Error(std::string("launch's gRPC plugin lacks ") + name + ": version mismatch?");
  return s;
}

void* GrpcPlugin::startStore(const std::string& host, int port, const std::string& token,
                             bool tcpstore, int64_t attempt, std::optional<uint32_t> tcpstore_uid) {
  char buf[1024] = {0};
  void* server = reinterpret_cast<StartFn>(symbol("ddpl_embedded_store_start"))(
      host.c_str(), port, token.c_str(), tcpstore ? 1 : 0, attempt,
      tcpstore_uid ? static_cast<long long>(*tcpstore_uid) : -1, logLevel(), buf, sizeof(buf));
  if (!server) throw NetworkError(buf);
  return server;
}

void GrpcPlugin::beginStoreAttempt(void* server, int64_t attempt) {
  char buf[1024] = {0};
  if (!reinterpret_cast<AttemptFn>(symbol("ddpl_embedded_store_begin_attempt"))(
          server, attempt, buf, sizeof(buf)))
    throw Error(buf);
}

void GrpcPlugin::stopStore(void* server) {
  reinterpret_cast<StopFn>(symbol("ddpl_embedded_store_stop"))(server);
}

std::unique_ptr<RendezvousHandler> GrpcPlugin::makeGrpc(const GrpcRendezvousConfig& config) {
  char buf[2048] = {0};
  RendezvousHandler* h = reinterpret_cast<GrpcFn>(symbol("ddpl_make_grpc_rendezvous"))(
      &config, logLevel(), buf, sizeof(buf));
  if (!h) throw NetworkError(buf);
  return std::unique_ptr<RendezvousHandler>(h);
}

std::unique_ptr<RendezvousHandler> GrpcPlugin::makeEtcd(const EtcdRendezvousConfig& config) {
  char buf[4096] = {0};
  RendezvousHandler* h = reinterpret_cast<EtcdFn>(symbol("ddpl_make_etcd_rendezvous"))(
      &config, logLevel(), buf, sizeof(buf));
  if (!h) throw NetworkError(buf);
  return std::unique_ptr<RendezvousHandler>(h);
}

}  // namespace ddpl::launcher
