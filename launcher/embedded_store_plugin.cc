// The gRPC half of EmbeddedStore, built as a plugin so that `launch` links no gRPC. A plain C
// interface: the launcher and the plugin share no C++ types across the boundary.
#include <cstdio>
#include <exception>

#include "common/log.h"
#include "rendezvous/server.h"

extern "C" {

__attribute__((visibility("default"))) void* ddpl_embedded_store_start(const char* host, int port,
                                                                       const char* token,
                                                                       int log_level,
                                                                       char* error,
                                                                       size_t error_len) {
  try {
    // The plugin has its own copy of the logging facade: give it the launcher's identity.
    ddpl::log::init({"launch", -1, ""}, static_cast<spdlog::level::level_enum>(log_level));
    ddpl::rdzv::ServerOptions opts;
    opts.host = host;
    opts.port = port;
    opts.token = token;
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
}
