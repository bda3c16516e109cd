#pragma once
// rdzv-server's command line: its flag table over the machinery launch's uses too
// (common/flag_table.h), and its grammar: --flag VALUE or --flag=VALUE, underscores for dashes,
// whole names only; a switch takes no value, unless its help shows one that may follow it
// inline (--dashboard[=HOST:PORT]). Pure; tests/fault/rdzv_fault_test.cc runs it through the
// binary.
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/server/server.h"

namespace ddpl::rdzv {

struct DashboardAddress {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                    // 0: a free one
};

struct ServerCommandLine {
  enum class Action { kRun, kHelp, kVersion };
  Action action = Action::kRun;
  ServerOptions server;  // the port defaults::kRdzvPort unless given
  std::string token_file, port_file;
  std::string log_level = "info";  // checked by log::parseLevel where logging starts
  std::optional<DashboardAddress> dashboard;
};

// `args`: argv without argv[0]. --help and --version end the parse where they stand. Throws
// UsageError with what rdzv-server prints before " (see --help)".
ServerCommandLine parseServerCommandLine(const std::vector<std::string>& args);

// rdzv-server --help.
std::string serverUsage();

}  // namespace ddpl::rdzv
