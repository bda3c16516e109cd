#include "launcher/membership/grpc_plugin.h"

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::launcher {
namespace {
using StartFn = void* (*)(const char*, int, const char*, int, long long, long long, int, char*,
                          size_t);
using StopFn = void (*)(void*);
using AttemptFn = int (*)(void*, long long, char*, size_t);
using GrpcFn = RendezvousHandler* (*)(const GrpcRendezvousConfig*, int, char*, size_t);
using EtcdFn = RendezvousHandler* (*)(const EtcdRendezvousConfig*, int, char*, size_t);

constexpr const char* kPluginFile = "libddpl_launch_grpc.so";

int logLevel() { return static_cast<int>(log::logger().level()); }
}  // namespace

std::string GrpcPlugin::defaultPath() { return Plugin::pathOf(kPluginFile); }

GrpcPlugin& GrpcPlugin::get() {
  // Plugin::load remembers a failure, so a second call throws the same error at once.
  static GrpcPlugin plugin(Plugin::load(kPluginFile, "launch's gRPC plugin"));
  return plugin;
}

void* GrpcPlugin::startStore(const std::string& host, int port, const std::string& token,
                             bool tcpstore, int64_t attempt, std::optional<uint32_t> tcpstore_uid) {
  char buf[1024] = {0};
  void* server = plugin_.function<StartFn>("ddpl_embedded_store_start")(
      host.c_str(), port, token.c_str(), tcpstore ? 1 : 0, attempt,
      tcpstore_uid ? static_cast<long long>(*tcpstore_uid) : -1, logLevel(), buf, sizeof(buf));
  if (!server) throw NetworkError(buf);
  return server;
}

void GrpcPlugin::beginStoreAttempt(void* server, int64_t attempt) {
  char buf[1024] = {0};
  if (!plugin_.function<AttemptFn>("ddpl_embedded_store_begin_attempt")(
          server, attempt, buf, sizeof(buf)))
    throw Error(buf);
}

void GrpcPlugin::stopStore(void* server) {
  plugin_.function<StopFn>("ddpl_embedded_store_stop")(server);
}

std::unique_ptr<RendezvousHandler> GrpcPlugin::makeGrpc(const GrpcRendezvousConfig& config) {
  char buf[2048] = {0};
  RendezvousHandler* h = plugin_.function<GrpcFn>("ddpl_make_grpc_rendezvous")(
      &config, logLevel(), buf, sizeof(buf));
  if (!h) throw NetworkError(buf);
  return std::unique_ptr<RendezvousHandler>(h);
}

std::unique_ptr<RendezvousHandler> GrpcPlugin::makeEtcd(const EtcdRendezvousConfig& config) {
  char buf[4096] = {0};
  RendezvousHandler* h = plugin_.function<EtcdFn>("ddpl_make_etcd_rendezvous")(
      &config, logLevel(), buf, sizeof(buf));
  if (!h) throw NetworkError(buf);
  return std::unique_ptr<RendezvousHandler>(h);
}

}  // namespace ddpl::launcher
