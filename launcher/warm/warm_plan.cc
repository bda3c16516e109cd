#include "launcher/warm/warm_plan.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>

#include "common/errors.h"

namespace ddpl::launcher::warm {
namespace {

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool dottedName(const std::string& m) {
  if (m.empty() || m.front() == '.' || m.back() == '.') return false;
  bool at_start = true;
  for (char c : m) {
    if (c == '.') {
      if (at_start) return false;  // ".." or a leading dot
      at_start = true;
      continue;
    }
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    if (!ok || (at_start && std::isdigit(static_cast<unsigned char>(c)))) return false;
    at_start = false;
  }
  return true;
}

// What the first bytes of a script say it is, when not Python source.
std::optional<std::string> notSource(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "'" + path + "' cannot be read";
  if (!S_ISREG(st.st_mode)) return "'" + path + "' is not a regular file";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "'" + path + "' cannot be read";
  unsigned char head[4] = {0, 0, 0, 0};
  ssize_t n = read(fd, head, sizeof(head));
  close(fd);
  if (n == 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4)
    return "'" + path + "' is a zip archive (python runs its __main__.py)";
  if (n == 4 && head[2] == '\r' && head[3] == '\n')
    return "'" + path + "' is compiled bytecode (.pyc)";
  return std::nullopt;
}

}  // namespace

std::vector<std::string> parseModules(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  if (value.empty() || value == "0" || value == "off") return out;
  size_t pos = 0;
  while (pos <= value.size()) {
    size_t comma = value.find(',', pos);
    std::string m = value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!dottedName(m))
      throw UsageError(fmt::format(
          "{}: '{}' is not a Python module name (give modules separated by commas, e.g. "
          "{}=torch,numpy)",
          flag, m, flag));
    out.push_back(m);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::optional<std::string> whyNotWarm(const std::vector<std::string>& cmd, bool launched_python,
                                      bool binds_memory) {
  if (!launched_python || cmd.size() < 3)
    return std::string("the program is not a Python script or module run by launch's interpreter");
  if (binds_memory)
    return std::string(
        "--numa-binding binds memory, which a forked worker cannot do before its first "
        "allocation");
  if (cmd[1] != "-u") return "the interpreter's options are '" + cmd[1] + "', not launch's -u";
  if (cmd[2] == "-m") {
    if (cmd.size() < 4 || !dottedName(cmd[3])) return std::string("-m names no importable module");
    return std::nullopt;
  }
  if (startsWith(cmd[2], "-")) return "the interpreter option '" + cmd[2] + "' is not forwarded";
  return notSource(cmd[2]);
}

bool readAtStart(const std::string& n) {
  static const char* const kPrefixes[] = {"PYTHON", "LD_",      "LC_",       "OMP_",  "GOMP_",
                                          "KMP_",   "MKL_",     "OPENBLAS_", "GOTO_", "MALLOC_",
                                          "TORCH_", "PYTORCH_", "GLIBC_"};
  for (const char* p : kPrefixes)
    if (startsWith(n, p)) return true;
  return n == "LANG" || n == "LANGUAGE" || n == "TZ" || n == "HOME" || n == "PATH";
}

std::optional<std::string> startupDifference(const Environment& t, const Environment& w) {
  auto value = [](const Environment& e, const std::string& k) -> std::string {
    auto it = e.find(k);
    return it == e.end() ? "<unset>" : "'" + it->second + "'";
  };
  // Both maps are sorted: the first differing name in either.
  auto ti = t.begin();
  auto wi = w.begin();
  while (ti != t.end() || wi != w.end()) {
    const std::string* name;
    if (wi == w.end() || (ti != t.end() && ti->first < wi->first))
      name = &(ti++)->first;
    else if (ti == t.end() || wi->first < ti->first)
      name = &(wi++)->first;
    else {
      bool same = ti->second == wi->second;
      name = &ti->first;
      ++ti;
      ++wi;
      if (same) continue;
    }
    if (readAtStart(*name))
      return fmt::format("{}: {} in the worker, {} in the template", *name, value(w, *name),
                         value(t, *name));
  }
  return std::nullopt;
}

Environment templateEnvironment(const Environment& base, const Environment& first,
                                const Environment& extra) {
  Environment env = base;
  for (const auto& [k, v] : first)
    if (readAtStart(k)) env[k] = v;
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

}  // namespace ddpl::launcher::warm
