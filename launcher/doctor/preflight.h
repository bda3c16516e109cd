#pragma once
// The preflight of every job (--preflight): the fast subset of `launch doctor` on this node
// before it joins the rendezvous, so that a bad node is named at start, not after a hang.
#include <string>
#include <vector>

#include "launcher/agent/worker_spec.h"
#include "launcher/cli/options.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {

// The fast checks for a job of `nproc` workers per node: nothing that runs another program or
// waits on the network (the endpoint's name is looked up, not connected to).
std::vector<Finding> runPreflight(const LaunchOptions& options, const Environment& env, int nproc,
                                  const std::string& nvml_library = kDefaultNvmlLibrary);

// The findings that are not ok, one line each, prefixed with `node` ("node0 (host)").
std::vector<std::string> preflightProblems(const std::string& node,
                                           const std::vector<Finding>& findings);

}  // namespace ddpl::launcher
