#include "launcher/doctor/doctor_command.h"

#include <cstdio>
#include <filesystem>

#include "common/errors.h"
#include "common/parse.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {

std::string doctorHelp() {
  return "usage: launch doctor [--json] [--python PATH] [--log-dir DIR] [--rdzv-endpoint "
         "HOST:PORT]\n"
         "                     [--nproc-per-node N] [PROGRAM]\n\n"
         "Checks the machine for a distributed PyTorch job: the NVIDIA driver and the CUDA\n"
         "version it supports, each GPU (model, compute capability, memory, ECC errors, MIG,\n"
         "temperature, throttling), CUDA_VISIBLE_DEVICES, NCCL_SOCKET_IFNAME /\n"
         "GLOO_SOCKET_IFNAME / NCCL_IB_HCA, /dev/shm, memlock and open-files limits, threads\n"
         "against cores, free space for logs and checkpoints, MASTER_ADDR and the rendezvous\n"
         "endpoint. For a Python PROGRAM, --python, or with no PROGRAM the interpreter launch\n"
         "would run a .py with (PYTHON_EXEC, else python3 from PATH): torch, its CUDA, cuDNN\n"
         "and NCCL, whether\n"
         "CUDA is available, and its compiled architectures against each GPU ('no kernel image'\n"
         "predicted). For a native PROGRAM: the CUDA, NCCL and cuDNN libraries it would load.\n"
         "One line a check: ok, warn or fail, the value found, and what to do.\n"
         "Exit status: 0 when nothing fails, 1 otherwise.\n";
}

int runDoctorCommand(const std::vector<std::string>& args, const Environment& env,
                     const std::string& default_python) {
  DoctorOptions d;
  d.env = env;
  bool json = false;
  std::string python, log_dir;
  LaunchOptions lo;
  lo.python = default_python;
  size_t i = 0;
  auto value = [&](const std::string& flag) {
    if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
    return args[++i];
  };
  try {
    for (; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "--") {
        ++i;
        break;
      }
      if (a.empty() || a[0] != '-') break;
      if (a == "-h" || a == "--help") {
        fputs(doctorHelp().c_str(), stdout);
        return 0;
      } else if (a == "--json") {
        json = true;
      } else if (a == "--python") {
        python = value(a);
      } else if (a == "--log-dir") {
        log_dir = value(a);
      } else if (a == "--rdzv-endpoint") {
        d.rdzv_endpoint = value(a);
      } else if (a == "--nproc-per-node") {
        d.nproc = static_cast<int>(parseInteger(a, value(a), 1, kMaxNprocPerNode));
      } else if (a == "-m" || a == "--module") {
        lo.target_kind = TargetKind::kModule;
      } else if (a == "--no-python") {
        lo.target_kind = TargetKind::kNoPython;
      } else {
        throw UsageError("launch doctor: unknown option '" + a + "' (see launch doctor --help)");
      }
    }
    if (i < args.size()) {
      lo.program = args[i];
      auto cmd = resolveCommand(lo, env);
      if (cmd.size() > 1 && cmd[1] == "-u") {
        if (python.empty()) python = cmd[0];
      } else {
        d.program = cmd[0];
      }
    }
    if (!python.empty()) {
      Environment path_only = env;  // --python wins over PYTHON_EXEC
      path_only.erase("PYTHON_EXEC");
      LaunchOptions p;
      p.python = python;
      d.python = pythonFor(p, path_only);
    } else if (d.program.empty()) {
      // No program named: whether torch sees CUDA is the first thing every GPU guide asks, so
      // the interpreter `launch train.py` would use is checked (issue 33).
      try {
        d.python = pythonFor(lo, env, &d.python_origin);
        d.python_is_default = true;
      } catch (const UsageError&) {
        // No python3 at all: a machine for native programs; nothing to check.
      }
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "launch doctor: error: %s\n", e.what());
    return kUsageExitCode;
  }
  d.data_paths = {log_dir.empty() ? std::filesystem::temp_directory_path().string() : log_dir,
                  std::filesystem::current_path().string()};
  if (d.data_paths[0] == d.data_paths[1]) d.data_paths.pop_back();
  std::vector<Finding> findings = runDoctor(d);
  std::string out = json ? findingsJson(findings) + "\n" : formatFindings(findings);
  fputs(out.c_str(), stdout);
  if (!json) {
    int warn = 0, fail = 0;
    for (const auto& f : findings) {
      warn += f.verdict == Verdict::kWarn;
      fail += f.verdict == Verdict::kFail;
    }
    printf("%zu check(s): %d warning(s), %d failure(s)\n", findings.size(), warn, fail);
  }
  return anyFailed(findings) ? 1 : 0;
}

}  // namespace ddpl::launcher
