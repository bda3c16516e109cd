#include "launcher/agent/run_dir.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/errors.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {

LogBase makeLogBase(const std::string& log_dir) {
  if (log_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "ddpl-launch-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw Error(std::string("cannot create a temporary log directory: ") + strerror(errno));
    return {tmpl, true};
  }
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  if (ec) throw InvalidArgument("--log-dir '" + log_dir + "' cannot be created: " + ec.message());
  return {log_dir, false};
}

void removeAfterFailedStart(const LogBase& base, const std::string& run_dir) {
  std::error_code ec;
  if (base.temporary)
    fs::remove_all(base.path, ec);
  else if (!run_dir.empty())
    fs::remove_all(run_dir, ec);
}

void removeTemporaryBase(const LogBase& base, const std::string& run_dir,
                         const std::vector<std::string>& evidence) {
  if (!base.temporary) return;
  std::error_code ec;
  if (evidence.empty())
    fs::remove_all(base.path, ec);
  else
    keepOnlyEvidence(base.path, run_dir, evidence);
}

// Never an earlier run's logs: a reused run id gets a numbered sibling. Created by this mkdir,
// exclusively and private (0700): a --log-dir may be a shared directory, where a name planted in
// advance (a symlink to somewhere else) must never be written through, and the files inside
// hold the command line and environment (issue 33).
std::string makeRunDir(const std::string& base, const std::string& run_id) {
  for (int k = 0; k < 10000; ++k) {
    fs::path p = fs::path(base) / (k == 0 ? run_id : run_id + "." + std::to_string(k));
    if (mkdir(p.c_str(), 0700) == 0) return p.string();
    if (errno != EEXIST)
      throw Error("cannot create the run directory " + p.string() + ": " + strerror(errno));
  }
  throw Error("cannot create a run directory for run id '" + run_id + "' in " + base +
              ": 10000 names taken");
}

void makePrivateDirs(const std::string& base, const std::string& dir) {
  fs::path p = base;
  for (const auto& part : fs::path(dir).lexically_relative(base)) {
    p /= part;
    if (mkdir(p.c_str(), 0750) != 0 && errno != EEXIST)
      throw Error("cannot create " + p.string() + ": " + strerror(errno));
  }
}

// Deleting the evidence of a hang as the user goes to read it helps nobody (issue 33).
void keepOnlyEvidence(const std::string& log_base, const std::string& run_dir,
                      const std::vector<std::string>& evidence) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::recursive_directory_iterator it(log_base, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) continue;
    std::string p = it->path().string();
    bool keep = p == run_dir + "/manifest.json" ||
                std::any_of(evidence.begin(), evidence.end(), [&](const std::string& e) {
                  return p == e || p.rfind(e + "/", 0) == 0;
                });
    if (!keep) doomed.push_back(it->path());
  }
  for (const auto& p : doomed) fs::remove(p, ec);
  // Directories left empty go too, deepest first.
  std::vector<fs::path> dirs;
  for (fs::recursive_directory_iterator it(log_base, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && !it->is_symlink(ec)) dirs.push_back(it->path());
  std::sort(dirs.begin(), dirs.end(), [](const fs::path& a, const fs::path& b) {
    return a.string().size() > b.string().size();
  });
  for (const auto& d : dirs) fs::remove(d, ec);  // removes only an empty one
}

}  // namespace ddpl::launcher
