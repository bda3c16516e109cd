// libFuzzer target: the OpenMPI hostfile parser and the --mpi-args word splitter
// (launcher/mpi/mpi_launch.h, public functions only). UsageError is their documented answer to bad
// input; anything else thrown or any sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "launcher/cli/cli.h"
#include "launcher/mpi/mpi_launch.h"

using namespace ddpl::launcher;
using ddpl::UsageError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& e : parseHostfile(text, "fuzz")) {
      if (e.host.empty() || e.line < 1 || (e.slots && *e.slots < 0)) __builtin_trap();
      if (e.slots && e.max_slots && *e.max_slots < *e.slots) __builtin_trap();
    }
  } catch (const UsageError&) {
  }
  try {
    splitShellWords(text);
  } catch (const UsageError&) {
  }
  return 0;
}
