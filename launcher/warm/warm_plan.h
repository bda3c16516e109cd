#pragma once
// Whether a worker can be forked from the warm template (docs/warm-restarts.md), as pure
// functions of the command and the environments: a worker is forked only where the result is
// what a cold `python -u ...` would have given it, and otherwise starts cold with the reason said
// once. tests/unit/warm_plan_test.cc checks each rule.
#include <optional>
#include <string>
#include <vector>

#include "common/environment.h"

namespace ddpl::launcher::warm {

// --prewarm=MODULES: "torch,numpy" -> {"torch", "numpy"}. Each a dotted Python name; throws
// UsageError naming the bad one. "" or "0" or "off": none.
std::vector<std::string> parseModules(const std::string& flag, const std::string& value);

// Why workers running `command` (resolved, argv[0] the interpreter) cannot be forked from a
// template, or nullopt when they can: launch must have chosen the interpreter itself
// (`launched_python`), the command must be `PYTHON -u SCRIPT ...` or `PYTHON -u -m MODULE ...`,
// SCRIPT a readable source file (not a directory, zip or .pyc), and no NUMA memory binding
// (`binds_memory`: a forked worker cannot set its policy before its first allocation).
std::optional<std::string> whyNotWarm(const std::vector<std::string>& command, bool launched_python,
                                      bool binds_memory);

// Variables an interpreter, or the libraries the template imported, read once at start: the
// template's value is the one a forked worker lives with, whatever its environment says
// (PYTHON*, LD_*, locale, OpenMP/BLAS/allocator settings, TORCH_*).
bool readAtStart(const std::string& name);

// The first such variable on which the two environments differ ("OMP_NUM_THREADS: '1' in the
// worker, '4' in the template"), or nullopt.
std::optional<std::string> startupDifference(const Environment& template_env,
                                             const Environment& worker_env);

// The template's environment: launch's own, plus what launch sets for every worker and is read
// at start (`first_worker_env`'s values of readAtStart variables), plus `extra` (the marker).
Environment templateEnvironment(const Environment& base, const Environment& first_worker_env,
                                const Environment& extra);

}  // namespace ddpl::launcher::warm
