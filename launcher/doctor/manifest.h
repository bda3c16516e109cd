#pragma once
// The run manifest (manifest.json beside a run's logs): what ran, where, with what, so that
// "it worked on that machine" can be answered by `launch manifest-diff A B`.
//
// Written in two steps so that nothing slow sits on the start-up path: launch writes the fast
// facts (its version, the command line, resolved options, the masked environment, host, CPUs)
// before the workers start, then a child of its own (`launch __manifest-probe`) adds the slow
// ones (GPUs and driver, the interpreter's torch/CUDA/cuDNN/NCCL, git, the hash of the
// installed packages) and replaces the file. What the child has not finished when the run
// ends reads "not probed".
#include <string>
#include <vector>

#include "launcher/agent/worker_spec.h"
#include "launcher/cli/options.h"

namespace ddpl::launcher {

inline constexpr const char* kManifestProbeFlag = "__manifest-probe";
inline constexpr const char* kNotProbed = "not probed";

struct ManifestFacts {
  std::string version;  // launch's
  std::vector<std::string> command_line;
  LaunchOptions options;
  Environment env;  // masked here (common/secrets.h), whatever the caller passes
  std::string run_id;
  std::string host;
  int nproc = 1;
  int cpus = 0;
  std::string cwd;
  std::string python;  // the workers' interpreter; empty: not a Python program
};

// The fast manifest, as JSON text.
std::string manifestJson(const ManifestFacts& facts);

// Writes the fast manifest to `path`. Throws ddpl::Error when it cannot be written.
void writeManifest(const ManifestFacts& facts, const std::string& path);

// Starts the probe child (`self_exe __manifest-probe PATH NVML_LIBRARY`, output to /dev/null,
// signals unblocked, lowest priority) that adds the slow facts to the manifest at `path` and
// dies with launch; nothing waits for it. The agent calls it a few seconds into the job, so
// that importing torch and running git never compete with the workers' own start.
void startManifestProbe(const std::string& path, const std::string& self_exe,
                        const std::string& nvml_library);

// The child's work: reads `path`, adds the slow facts, writes it back. Returns 0, or 1 with
// the reason on stderr.
int runManifestProbe(const std::string& path, const std::string& nvml_library);

// What differs between two manifests (JSON texts), most consequential first: driver, CUDA,
// torch, GPU model, world size, packages, code, then the environment and the rest. One line a
// difference: "torch: 2.4.0 -> 2.5.1". Throws ddpl::InvalidArgument for text that is not a
// manifest.
std::vector<std::string> diffManifests(const std::string& a, const std::string& b);

// `launch manifest-diff A B` (files or run directories holding manifest.json): prints the
// differences; 0 when there are none, 1 when there are, 2 when a manifest cannot be read.
int runManifestDiff(const std::string& a, const std::string& b);

}  // namespace ddpl::launcher
