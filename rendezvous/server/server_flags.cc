#include "rendezvous/server/server_flags.h"

#include <fmt/format.h>

#include <chrono>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/flag_table.h"
#include "common/parse.h"

namespace ddpl::rdzv {
namespace {

using Flag = flag_table::Flag<ServerCommandLine>;
using Action = ServerCommandLine::Action;

// The defaults the texts below state.
static_assert(defaults::kRdzvPort == 29400 && defaults::kHeartbeatWindow.count() == 30,
              "update rdzv-server's --help text");

std::chrono::seconds seconds(const std::string& flag, const std::string& v, int64_t hi) {
  return std::chrono::seconds(parseInteger(flag, v, 0, hi));
}

void parseDashboard(const std::string& flag, const std::string& v, ServerCommandLine& c) {
  c.dashboard = DashboardAddress{};
  if (v.empty()) return;
  const size_t colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw UsageError(fmt::format("--dashboard={}: HOST:PORT, e.g. 127.0.0.1:8265", v));
  c.dashboard->host = parseListenHost(flag, v.substr(0, colon));
  c.dashboard->port = static_cast<int>(parseInteger(flag, v.substr(colon + 1), 0, 65535));
}

// In --help's order. Each text keeps its own line breaks (serverUsage's layout).
const std::vector<Flag>& serverFlags() {
  static const std::vector<Flag> kFlags = {
      {{"--host"},
       true,
       "ADDR",
       "address to listen on (default 127.0.0.1; 0.0.0.0 for all)",
       [](auto& f, auto& v, auto& c) { c.server.host = parseListenHost(f, v); }},
      {{"--port"},
       true,
       "N",
       "port (default 29400; 0 picks a free one, see --port-file)",
       [](auto& f, auto& v, auto& c) {
         c.server.port = static_cast<int>(parseInteger(f, v, 0, 65535));
       }},
      {{"--port-file"},
       true,
       "PATH",
       "write the bound port to PATH once serving",
       [](auto&, auto& v, auto& c) { c.port_file = v; }},
      {{"--token-file"},
       true,
       "PATH",
       "require this shared token on every call (unreadable or empty\n"
       "file: exit 1). Without it, DDPL_RDZV_TOKEN is used if set\n"
       "(the name launch reads too; the old DDPL_STORE_TOKEN is still\n"
       "accepted, with a warning); with neither the server warns that\n"
       "anyone may call it",
       [](auto&, auto& v, auto& c) { c.token_file = v; }},
      {{"--tls-cert"},
       true,
       "PATH",
       "server certificate (PEM); with --tls-key enables TLS",
       [](auto&, auto& v, auto& c) { c.server.tls_cert_file = v; }},
      {{"--tls-key"},
       true,
       "PATH",
       "server private key (PEM)",
       [](auto&, auto& v, auto& c) { c.server.tls_key_file = v; }},
      {{"--tls-client-ca"},
       true,
       "PATH",
       "require client certificates signed by this CA (PEM)",
       [](auto&, auto& v, auto& c) { c.server.tls_client_ca_file = v; }},
      {{"--max-value-bytes"},
       true,
       "N",
       "largest value accepted (default 16777216)",
       [](auto& f, auto& v, auto& c) {
         c.server.max_value_bytes = parseInteger(f, v, 1, int64_t{1} << 30);
       }},
      {{"--heartbeat-window"},
       true,
       "SECS",
       "evict members silent this long (default 30)",
       [](auto& f, auto& v, auto& c) {
         c.server.heartbeat_window = std::chrono::seconds(parseInteger(f, v, 1, 86400));
       }},
      {{"--run-retention"},
       true,
       "SECS",
       "forget a run (and its keys) this long after its last node\n"
       "left or was evicted (default 600)",
       [](auto& f, auto& v, auto& c) { c.server.run_retention = seconds(f, v, 86400 * 365); }},
      {{"--max-stream-pending"},
       true,
       "N",
       "unanswered operations per store stream before the server\n"
       "stops reading it (default 1024)",
       [](auto& f, auto& v, auto& c) {
         c.server.limits.max_stream_pending = parseInteger(f, v, 1, int64_t{1} << 30);
       }},
      {{"--max-stream-queued-bytes"},
       true,
       "N",
       "answer bytes queued per store stream before the server\n"
       "stops reading it (default 67108864)",
       [](auto& f, auto& v, auto& c) {
         c.server.limits.max_stream_queued_bytes = parseInteger(f, v, 1, int64_t{1} << 40);
       }},
      {{"--max-queued-bytes"},
       true,
       "N",
       "answer bytes queued on all streams; past it an answer is\n"
       "RESOURCE_EXHAUSTED (default 268435456)",
       [](auto& f, auto& v, auto& c) {
         c.server.limits.max_queued_bytes = parseInteger(f, v, 1, int64_t{1} << 40);
       }},
      {{"--max-parked"},
       true,
       "N",
       "gets and waits parked at once (default 100000)",
       [](auto& f, auto& v, auto& c) {
         c.server.limits.max_parked = parseInteger(f, v, 1, int64_t{1} << 30);
       }},
      {{"--max-streams-per-connection"},
       true,
       "N",
       "concurrent calls per connection (default 1024)",
       [](auto& f, auto& v, auto& c) {
         c.server.connections.max_streams_per_connection =
             static_cast<int>(parseInteger(f, v, 1, int64_t{1} << 20));
       }},
      {{"--max-connection-idle"},
       true,
       "SECS",
       "close connections without a call this long (default 30)",
       [](auto& f, auto& v, auto& c) {
         c.server.connections.max_connection_idle =
             std::chrono::seconds(parseInteger(f, v, 1, 86400));
       }},
      {{"--max-connections"},
       true,
       "N",
       "connections held at once; silent or refused peers make room\n"
       "for new ones (default 4096; lowered, with a warning, when\n"
       "the open-file limit cannot back 2 files per connection)",
       [](auto& f, auto& v, auto& c) {
         c.server.connections.max_connections = static_cast<int>(parseInteger(f, v, 1, 1 << 24));
       }},
      {{"--no-store-socket"},
       false,
       "",
       "serve the store over gRPC only (by default clients may also\n"
       "reach it on the same port without gRPC, a few times faster;\n"
       "always off with TLS)",
       [](auto&, auto&, auto& c) { c.server.store_socket = false; }},
      {{"--dashboard"},
       false,
       "[=HOST:PORT]",
       "serve a page for every job whose agents run with --dashboard\n"
       "(127.0.0.1 at a free port by default; other addresses need\n"
       "the server's token)",
       parseDashboard},
      {{"--stats-interval"},
       true,
       "SECS",
       "log runs, keys and streams this often when they changed;\n"
       "0: never (default 300)",
       [](auto& f, auto& v, auto& c) { c.server.stats_interval = seconds(f, v, 86400); }},
      {{"--log-level"},
       true,
       "LEVEL",
       "trace, debug, info, warn, error (default info)",
       [](auto&, auto& v, auto& c) { c.log_level = v; }},
      {{"--version"},
       false,
       "",
       "print the version",
       [](auto&, auto&, auto& c) { c.action = Action::kVersion; }},
      {{"--help", "-h"},
       false,
       "",
       "this text",
       [](auto&, auto&, auto& c) { c.action = Action::kHelp; }},
  };
  return kFlags;
}

}  // namespace

ServerCommandLine parseServerCommandLine(const std::vector<std::string>& args) {
  ServerCommandLine c;
  c.server.port = defaults::kRdzvPort;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const size_t eq = name.find('=');
    const bool inline_value = name.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    name = flag_table::canonical(name);
    const Flag* f = flag_table::find(serverFlags(), name, flag_table::Prefixes::kRefuse);
    if (!f) throw UsageError(fmt::format("unknown flag '{}'", args[i]));
    if (f->takes_value && !inline_value) {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", name));
      value = args[++i];
    } else if (!f->takes_value && inline_value && f->metavar.empty()) {
      throw UsageError(fmt::format("{} takes no value", name));
    }
    flag_table::apply(*f, name, value, c);
    if (c.action != Action::kRun) break;
  }
  return c;
}

std::string serverUsage() {
  const flag_table::HelpLayout layout{/*indent=*/2, /*text_column=*/27, /*min_gap=*/2,
                                      /*long_names_own_line=*/true, /*wrap_width=*/0};
  return "usage: rdzv-server [options]\n\n"
         "Serves the ddplaunch rendezvous (membership rounds) and key-value store over gRPC.\n\n" +
         flag_table::helpRows(serverFlags(), layout) +
         "\nEvery flag also accepts underscores (--token_file) and --flag=value.\n";
}

}  // namespace ddpl::rdzv
