// rdzv-server: the standalone rendezvous service for multi-node jobs. Its flags:
// server_flags.h; the page of every job it hosts (--dashboard): job_pages.h.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/defaults.h"
#include "common/environment.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"
#include "ddpl/config.h"
#include "rendezvous/server/server.h"
#include "rendezvous/server/server_flags.h"
#include "rendezvous/store/token.h"
#ifdef DDPL_WITH_DASHBOARD
#include "rendezvous/server/job_pages.h"
#endif

namespace {

using namespace ddpl;

int usageError(const std::string& msg) {
  std::fprintf(stderr, "rdzv-server: %s (see --help)\n", msg.c_str());
  return kUsageExitCode;
}

// --token-file, else DDPL_RDZV_TOKEN (the old name with a warning), else none (warned at start).
std::string serverToken(const std::string& token_file) {
  if (!token_file.empty()) return rdzv::readTokenFile(token_file);
  const rdzv::EnvironmentToken env =
      rdzv::rdzvTokenFromEnvironment(processEnvironment(), "rdzv-server");
  if (!env.warning.empty()) log::warn("{}", env.warning);
  return env.token.value_or("");
}

// Serves until a stop signal; throws what the server or its page throws.
int serve(rdzv::ServerCommandLine& c) {
  c.server.token = serverToken(c.token_file);
  // Signals go to one thread that stops the server; block them before any thread exists.
  sigset_t set;
  sigemptyset(&set);
  for (int s : defaults::kStopSignals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  rdzv::RendezvousServer server(c.server);
  if (!c.port_file.empty()) {
    // Whole or absent for whoever polls it; not synced, it is stale after a reboot anyway.
    AtomicWriteOptions quick;
    quick.durable = false;
    writeFileAtomically(c.port_file, std::to_string(server.port()) + "\n", quick);
  }
#ifdef DDPL_WITH_DASHBOARD
  std::unique_ptr<rdzv::JobPages> pages;  // stops before the server goes
  if (c.dashboard) pages = std::make_unique<rdzv::JobPages>(server, *c.dashboard, c.server.token);
#else
  if (c.dashboard) throw Error("this rdzv-server was built without the dashboard (civetweb)");
#endif
  int received = 0;
  std::thread stopper([&] {
    sigwait(&set, &received);
    log::info("received signal {} ({}); shutting down", received, strsignal(received));
    server.shutdown();
  });
  server.wait();
  stopper.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rdzv::ServerCommandLine c;
  try {
    c = rdzv::parseServerCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    return usageError(e.what());
  }
  if (c.action == rdzv::ServerCommandLine::Action::kHelp) {
    std::fputs(rdzv::serverUsage().c_str(), stdout);
    return 0;
  }
  if (c.action == rdzv::ServerCommandLine::Action::kVersion) {
    std::printf("rdzv-server %s\n", DDPL_VERSION);
    return 0;
  }
  try {
    log::init({"rdzv-server", -1, ""}, log::parseLevel(c.log_level));
  } catch (const InvalidArgument& e) {
    return usageError(e.what());
  }
  try {
    return serve(c);
  } catch (const InvalidArgument& e) {
    log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 1;
  }
}
