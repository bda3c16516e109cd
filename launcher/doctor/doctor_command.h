#pragma once
// `launch doctor [--json] [--python PATH] [--log-dir DIR] [--rdzv-endpoint HOST:PORT]
// [--nproc-per-node N] [PROGRAM]`: the checks of launcher/doctor/doctor.h, printed.
#include <string>
#include <vector>

#include "launcher/agent/worker_spec.h"

namespace ddpl::launcher {

// `args` follow "doctor". `default_python`: the interpreter of launch's own environment (as
// for a job). Prints the report on stdout; returns 0 when nothing fails, 1 otherwise, 2 for
// bad arguments.
int runDoctorCommand(const std::vector<std::string>& args, const Environment& env,
                     const std::string& default_python);

std::string doctorHelp();

}  // namespace ddpl::launcher
