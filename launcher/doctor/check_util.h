#pragma once
// What the doctor's check families share: units, the environment as the checks see it, and
// small readers of /proc and /sys. Internal to launcher/doctor/.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace ddpl::launcher::checks {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;

std::string getEnv(const std::map<std::string, std::string>& env, const char* name);
std::string bytes(uint64_t b);   // "512 MiB", "1.5 GiB"
std::string cudaVersion(int v);  // 12040 -> "12.4"
// "12.4" -> 12040; nullopt when not a version.
std::optional<int> parseCudaVersion(const std::string& s);
std::string readAll(const std::string& path);              // "" when it cannot be read
std::set<std::string> dirEntries(const std::string& dir);  // empty when it cannot be listed
std::string joinSet(const std::set<std::string>& s);       // "a,b", or "none"

}  // namespace ddpl::launcher::checks
