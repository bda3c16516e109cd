#include "launcher/doctor/check_util.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddpl::launcher::checks {
namespace fs = std::filesystem;

std::string getEnv(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

std::string bytes(uint64_t b) {
  if (b >= kGiB) return fmt::format("{:.1f} GiB", static_cast<double>(b) / kGiB);
  return fmt::format("{} MiB", b / kMiB);
}

std::string cudaVersion(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

std::optional<int> parseCudaVersion(const std::string& s) {
  int major = 0, minor = 0;
  if (sscanf(s.c_str(), "%d.%d", &major, &minor) < 1) return std::nullopt;
  return major * 1000 + minor * 10;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> dirEntries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::string joinSet(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "none" : out;
}

}  // namespace ddpl::launcher::checks
