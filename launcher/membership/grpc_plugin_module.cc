// The gRPC half of `launch`, built as a plugin (libddpl_launch_grpc.so) so that the launcher
// links no gRPC: the embedded store of --standalone and the multi-node rendezvous. Loaded only
// by jobs that use them (launcher/membership/grpc_plugin.h). Errors cross the boundary as text,
// never as exceptions.
#include <cstdio>
#include <functional>
#include <exception>

#include "common/log.h"
#include "launcher/membership/etcd/etcd_rendezvous.h"
#include "launcher/membership/grpc_rendezvous.h"
#include "rendezvous/server/server.h"

namespace {
void initLog(int log_level) {
  // The plugin has its own copy of the logging facade: give it the launcher's identity.
  ddpl::log::init({"launch", -1, ""}, static_cast<spdlog::level::level_enum>(log_level));
}
}  // namespace

extern "C" {

// The plugin's log lines go through launch's console (its live status line makes room for
// them): `through` runs one write the way launch runs its own lines' writes.
__attribute__((visibility("default"))) void ddpl_plugin_console(void (*through)(void (*)(void*),
                                                                                void*)) {
  ddpl::log::setConsoleWrapper([through](const std::function<void()>& write) {
    through([](void* w) { (*static_cast<const std::function<void()>*>(w))(); },
            const_cast<void*>(static_cast<const void*>(&write)));
  });
}

// `tcpstore`: serve torch's TCPStore protocol too (the agent store), its attempt `attempt`
// open from the start (< 0: none yet), for loopback clients whose socket is `tcpstore_uid`'s
// (< 0: any user's).
__attribute__((visibility("default"))) void* ddpl_embedded_store_start(
    const char* host, int port, const char* token, int tcpstore, long long attempt,
    long long tcpstore_uid, int log_level, char* error, size_t error_len) {
  try {
    initLog(log_level);
    ddpl::rdzv::ServerOptions opts;
    opts.host = host;
    opts.port = port;
    opts.token = token;
    opts.tcpstore = tcpstore != 0;
    opts.tcpstore_attempt = attempt;
    if (tcpstore_uid >= 0) opts.tcpstore_uid = static_cast<uint32_t>(tcpstore_uid);
    // The agent store: a client per worker, and any tool's of theirs.
    opts.connections.max_connections_from_file_limit = tcpstore != 0;
    opts.log_name = "launch-store";
    return new ddpl::rdzv::RendezvousServer(opts);
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

__attribute__((visibility("default"))) void ddpl_embedded_store_stop(void* server) {
  delete static_cast<ddpl::rdzv::RendezvousServer*>(server);
}

// One node's attempt: its own workers connect over loopback.
__attribute__((visibility("default"))) int ddpl_embedded_store_begin_attempt(void* server,
                                                                             long long attempt,
                                                                             char* error,
                                                                             size_t error_len) {
  try {
    static_cast<ddpl::rdzv::RendezvousServer*>(server)->beginTcpStoreAttempt(attempt, {}, true);
    return 1;
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return 0;
  }
}

// Returns a heap RendezvousHandler (the whole backend, every role: rendezvous_handler.h) the
// caller owns (same build, same C++ ABI), or null with the reason in `error`. The boundary
// carries the whole backend, not its roles: one pointer, one owner, one delete.
__attribute__((visibility("default"))) ddpl::launcher::RendezvousHandler* ddpl_make_grpc_rendezvous(
    const ddpl::launcher::GrpcRendezvousConfig* config, int log_level, char* error,
    size_t error_len) {
  try {
    initLog(log_level);
    return ddpl::launcher::makeGrpcRendezvous(*config).release();
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

// The same for the etcd backend (launcher/membership/etcd/etcd_rendezvous.h).
__attribute__((visibility("default"))) ddpl::launcher::RendezvousHandler* ddpl_make_etcd_rendezvous(
    const ddpl::launcher::EtcdRendezvousConfig* config, int log_level, char* error,
    size_t error_len) {
  try {
    initLog(log_level);
    return ddpl::launcher::makeEtcdRendezvous(*config).release();
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}
}
