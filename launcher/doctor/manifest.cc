#include "launcher/doctor/manifest.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/secrets.h"
#include "launcher/doctor/doctor.h"
#include "launcher/process/child_process.h"

namespace ddpl::launcher {
namespace {

using nlohmann::json;

constexpr double kProbeTimeoutSec = 120;  // importing torch on a cold file system takes a while

// Prints a sorted name==version list's SHA-256: two environments with the same packages hash
// the same, whatever order pip installed them in.
constexpr const char* kPackagesScript = R"PY(
import hashlib, importlib.metadata as m
names = sorted({(d.metadata["Name"] or "?").lower() + "==" + d.version for d in m.distributions()})
print(hashlib.sha256("\n".join(names).encode()).hexdigest(), len(names))
)PY";

std::string readText(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("cannot read '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

std::string nowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

json optionsJson(const LaunchOptions& o) {
  const char* target = o.target_kind == TargetKind::kModule     ? "module"
                       : o.target_kind == TargetKind::kNoPython ? "no-python"
                                                                : "auto";
  return {{"nnodes", fmt::format("{}:{}", o.nnodes_min, o.nnodes_max)},
          {"node_rank", o.node_rank},
          {"standalone", o.standalone},
          {"rdzv_backend", o.rdzv_backend},
          {"rdzv_endpoint", o.rdzv_endpoint},
          {"rdzv_id", o.rdzv_id},
          {"master_addr", o.master_addr},
          {"master_port", o.master_port ? std::to_string(*o.master_port) : "auto"},
          {"max_restarts", o.max_restarts},
          {"role", o.role},
          {"log_dir", o.log_dir},
          {"preflight", o.preflight},
          {"target", target},
          {"program", o.program},
          {"program_args", o.program_args}};
}

// The environment, the command line, a GPU's name and what git and pip print are bytes, not
// necessarily UTF-8 (a variable holding a Latin-1 path): what is not comes out as U+FFFD
// rather than failing the whole manifest, as strict JSON output would.
std::string dumpJson(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace

std::string manifestJson(const ManifestFacts& f) {
  json j = {{"manifest_version", 1},
            {"launch_version", f.version},
            {"run_id", f.run_id},
            {"written_at", nowUtc()},
            {"command_line", maskCommandLine(f.command_line)},
            {"options", optionsJson(f.options)},
            {"host", f.host},
            {"cpus", f.cpus},
            {"cwd", f.cwd},
            {"nnodes", f.options.nnodes_max},
            {"nproc_per_node", f.nproc},
            {"world_size", f.options.nnodes_max * f.nproc},
            {"environment", maskEnvironment(f.env)},
            {"gpus", kNotProbed},
            {"python", f.python.empty() ? json("not a Python program")
                                        : json{{"interpreter", f.python}, {"torch", kNotProbed}}},
            {"git", kNotProbed}};
  return dumpJson(j);
}

// Written through a temporary and a rename (common/file_io.h): a reader, or a second writer
// killed half way, never sees half a manifest. Not synced: it is a diagnostic record written on
// launch's start-up path, where an fsync costs milliseconds, and it is rewritten by every run.
static void writeManifestText(const std::string& path, const std::string& text) {
  // Private: it holds the command line and the environment, masked by rules that cannot know
  // every name a secret goes by.
  writeFileAtomically(path, text, {.mode = 0600, .durable = false});
}

void startManifestProbe(const std::string& path, const std::string& self_exe,
                        const std::string& nvml_library) {
  // Left in launch's group, as posix_spawn left it (it dies with launch: runManifestProbe), its
  // signal mask cleared (launch blocks its signals for the signalfd). Nothing waits for it.
  ChildSetup setup;
  setup.group = ProcessGroup::kInherit;
  startDetached({self_exe, kManifestProbeFlag, path, nvml_library}, setup);
}

void writeManifest(const ManifestFacts& facts, const std::string& path) {
  writeManifestText(path, manifestJson(facts));
}

int runManifestProbe(const std::string& path, const std::string& nvml_library) {
  // Nothing of launch's outlives it: the probe dies with it (a short run records "not probed").
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  setpriority(PRIO_PROCESS, 0, 19);  // never at the workers' expense
  try {
    json j = json::parse(readText(path));
    auto save = [&] { writeManifestText(path, dumpJson(j)); };

    GpuFacts g = readGpuFacts(nvml_library);
    json gpus = {{"driver", g.driver ? g.driver_version : "none: " + g.why_none}};
    gpus["cuda_driver"] = g.cuda_driver_version
                              ? fmt::format("{}.{}", *g.cuda_driver_version / 1000,
                                            (*g.cuda_driver_version % 1000) / 10)
                              : "";
    json devices = json::array();
    for (const auto& d : g.devices)
      devices.push_back({{"index", d.index},
                         {"name", d.name},
                         {"uuid", d.uuid},
                         {"capability", d.compute_major ? fmt::format("{}.{}", *d.compute_major,
                                                                      d.compute_minor.value_or(0))
                                                        : ""},
                         {"memory_bytes", d.memory_total_bytes.value_or(0)}});
    gpus["devices"] = devices;
    j["gpus"] = gpus;
    save();

    std::string cwd = j.value("cwd", ".");
    // --no-optional-locks: this probe is killed with the run, and a `git status` killed while
    // refreshing the index would leave the user's repository locked (index.lock).
    std::string out;
    if (captureOutput({"git", "-C", cwd, "rev-parse", "HEAD"}, 30, &out) == 0) {
      std::string commit = trimmed(out);
      bool dirty = captureOutput({"git", "--no-optional-locks", "-C", cwd, "status", "--porcelain"},
                                 60, &out) == 0 &&
                   !trimmed(out).empty();
      j["git"] = {{"commit", commit}, {"dirty", dirty}};
    } else {
      j["git"] = "not a repository";
    }
    save();

    if (j["python"].is_object()) {
      std::string python = j["python"]["interpreter"];
      TorchProbe t = probeTorch(python, kProbeTimeoutSec);
      json p = {{"interpreter", python}};
      if (t.probed && t.error.empty()) {
        p["torch"] = t.torch_version;
        p["cuda"] = t.cuda_version;
        p["cudnn"] = t.cudnn_version;
        p["nccl"] = t.nccl_version;
        std::string arch;
        for (const auto& a : t.arch_list) arch += (arch.empty() ? "" : " ") + a;
        p["arch_list"] = arch;
      } else {
        p["torch"] = "unknown: " + t.error;
      }
      if (captureOutput({python, "-c", kPackagesScript}, kProbeTimeoutSec, &out) == 0) {
        std::istringstream words(out);
        std::string hash;
        int count = 0;
        words >> hash >> count;
        p["packages_sha256"] = hash;
        p["packages"] = count;
      } else {
        p["packages_sha256"] = "unknown: " + trimmed(out).substr(0, 200);
      }
      j["python"] = p;
      save();
    }
    return 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "launch: manifest probe of %s: %s\n", path.c_str(), e.what());
    return 1;
  }
}

std::vector<std::string> diffManifests(const std::string& a_text, const std::string& b_text) {
  // A manifest nests four levels. One from elsewhere nested a hundred thousand deep parsed
  // (the parser keeps its own stack) and then flatten() recursed once per level, overflowing
  // the stack: deeper than kMaxDepth is not a manifest.
  static constexpr int kMaxDepth = 32;
  auto parse = [](const std::string& text) {
    bool too_deep = false;
    json j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      too_deep = too_deep || depth > kMaxDepth;
      return !too_deep;
    });
    if (too_deep)
      throw InvalidArgument(fmt::format("not a manifest: nested deeper than {}", kMaxDepth));
    // A bare number or string flattens to the key "", whose name below was substr(1) of it.
    if (!j.is_object())
      throw InvalidArgument(std::string("not a manifest: a JSON ") + j.type_name());
    return j.flatten();
  };
  json a, b;
  try {
    a = parse(a_text);
    b = parse(b_text);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("not a manifest: ") + e.what());
  }
  // Most consequential first: what decides whether kernels and collectives work at all, then
  // what changes numbers, then what changes behaviour.
  static const std::vector<std::string> kOrder = {"/gpus/driver",
                                                  "/gpus/cuda_driver",
                                                  "/python/cuda",
                                                  "/python/torch",
                                                  "/python/cudnn",
                                                  "/python/nccl",
                                                  "/gpus/devices",
                                                  "/gpus",
                                                  "/world_size",
                                                  "/nnodes",
                                                  "/nproc_per_node",
                                                  "/python/arch_list",
                                                  "/python/packages_sha256",
                                                  "/python",
                                                  "/git",
                                                  "/environment",
                                                  "/launch_version",
                                                  "/command_line",
                                                  "/options",
                                                  "/host",
                                                  "/cpus"};
  static const std::set<std::string> kNoise = {"/written_at", "/run_id", "/manifest_version",
                                               "/python/packages"};
  auto rank = [&](const std::string& key) {
    for (size_t i = 0; i < kOrder.size(); ++i)
      if (key == kOrder[i] || key.rfind(kOrder[i] + "/", 0) == 0) return i;
    return kOrder.size();
  };
  std::set<std::string> keys;
  for (auto& [k, v] : a.items()) keys.insert(k);
  for (auto& [k, v] : b.items()) keys.insert(k);
  std::vector<std::pair<size_t, std::string>> lines;
  auto show = [](const json& j, const std::string& k) {
    if (!j.contains(k)) return std::string("(absent)");
    const json& v = j[k];
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  for (const auto& k : keys) {
    if (kNoise.count(k)) continue;
    bool in_a = a.contains(k), in_b = b.contains(k);
    if (in_a && in_b && a[k] == b[k]) continue;
    std::string name = k.substr(1);
    std::replace(name.begin(), name.end(), '/', '.');
    if (name.rfind("environment.", 0) == 0) name = "environment " + name.substr(12);
    lines.push_back({rank(k), fmt::format("{}: {} -> {}", name, show(a, k), show(b, k))});
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (auto& l : lines) out.push_back(std::move(l.second));
  return out;
}

int runManifestDiff(const std::string& a, const std::string& b) {
  auto file = [](const std::string& p) {
    std::ifstream dir_probe(p + "/manifest.json");
    return dir_probe ? p + "/manifest.json" : p;
  };
  try {
    auto lines = diffManifests(readText(file(a)), readText(file(b)));
    for (const auto& l : lines) printf("%s\n", l.c_str());
    if (lines.empty()) printf("no differences\n");
    return lines.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "launch manifest-diff: %s\n", e.what());
    return 2;
  }
}

}  // namespace ddpl::launcher
