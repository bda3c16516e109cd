// libFuzzer target: launch's command-line parser (launcher/cli/cli.h, through its public
// functions only). The input is NUL-separated arguments; a leading "PET_X=v" run of them is
// the environment. A UsageError is the documented answer to bad input; anything else thrown
// (std::out_of_range from a number, say) or any sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launcher/cli/cli.h"

using namespace ddpl::launcher;
using ddpl::UsageError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  std::string cur;
  for (size_t i = 0; i <= size; ++i) {
    if (i == size || data[i] == 0) {
      if (args.empty() && cur.rfind("PET_", 0) == 0 && cur.find('=') != std::string::npos)
        env[cur.substr(0, cur.find('='))] = cur.substr(cur.find('=') + 1);
      else
        args.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(data[i]);
    }
  }
  try {
    ParseResult r = parseCommandLine(args, env);
    validateTopology(r.options);
  } catch (const UsageError&) {
  }
  try {
    expandSlurmNodeList(args.empty() ? std::string() : args.front());
  } catch (const UsageError&) {
  }
  return 0;
}
