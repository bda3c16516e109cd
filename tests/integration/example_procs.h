#pragma once
// Helpers for the example's process-level tests (torch-free): where the binaries are, a free
// port, the summary ddp_resnet writes, and finding one rank among launch's descendants.
#include "tests/common/subprocess.h"
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace ddpl::example::testing {

inline std::string binary(const std::string& name) {
  return std::string(DDPL_BIN_DIR) + "/" + name;
}
inline std::string trainer() { return binary("ddp_resnet"); }
inline std::string torchrun() {
  const std::string python = DDPL_PYTHON;
  return python.substr(0, python.rfind('/')) + "/torchrun";
}

inline int freePort() { return ddpl::testing::freeLoopbackPort(); }

inline std::string slurp(const std::string& path) { return ddpl::testing::readFile(path); }

// Empty object when the run wrote no summary (it failed before the end).
inline nlohmann::json summary(const std::string& path) {
  const std::string text = slurp(path);
  return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
}

inline pid_t parentOf(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  char state;
  pid_t ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

inline std::string environOf(pid_t pid) {
  std::string env = slurp("/proc/" + std::to_string(pid) + "/environ");
  for (char& c : env) {
    if (c == '\0') c = '\n';
  }
  return "\n" + env;
}

// A live descendant of root whose environment has RANK=<rank> and that runs ddp_resnet; -1 if
// none (yet).
inline pid_t findRank(pid_t root, int rank) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return -1;
  std::vector<pid_t> pids;
  while (const dirent* e = ::readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid > 0) pids.push_back(pid);
  }
  ::closedir(proc);
  for (pid_t pid : pids) {
    bool descendant = false;
    for (pid_t p = parentOf(pid); p > 1; p = parentOf(p)) {
      if (p == root) {
        descendant = true;
        break;
      }
    }
    if (!descendant) continue;
    if (slurp("/proc/" + std::to_string(pid) + "/cmdline").find("ddp_resnet") == std::string::npos)
      continue;
    if (environOf(pid).find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return pid;
  }
  return -1;
}

}  // namespace ddpl::example::testing
