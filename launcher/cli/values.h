#pragma once
// The value parsers the flag table, --rdzv-conf, Slurm's defaults and the topology checks share.
// Internal to launcher/cli/: each throws UsageError (or InvalidArgument, which applyFlag turns
// into one) naming the flag or variable the value came from.
#include <string>
#include <vector>

#include "launcher/cli/options.h"

namespace ddpl::launcher::cli {

std::string trim(const std::string& s);
std::vector<std::string> split(const std::string& s, char sep);
int parseInt(const std::string& flag, const std::string& v, int min_value,
             int max_value = 1'000'000'000);
double parseSeconds(const std::string& flag, const std::string& v);

// A size in bytes: 123, 512K, 640M, 4G, 1T (powers of 1024; a trailing B or iB is allowed).
uint64_t parseSize(const std::string& flag, const std::string& v);

// A run id names directories (<log-dir>/<run id>), cgroups and keys: it must never climb out of
// the log directory (../../x) or exceed what a file name may hold (issue 33).
void checkRunId(const std::string& flag, const std::string& id);

// HOST[:PORT] of --rdzv-endpoint; port 0 is accepted (torchx's single-node jobs pass
// localhost:0, which torchrun reads as "pick a free port"); validateTopology says where it
// cannot work.
int endpointPort(const std::string& flag, const std::string& v);

// torchrun's comma_separated_list (--duplicate-stdout-filters): items split at ',', where ",,"
// stands for a literal comma: "a,,b,c" -> {"a,b", "c"}. Empty items are kept (torchrun's
// empty needle matches every line); an empty value is no item at all.
std::vector<std::string> parseFilterList(const std::string& v);

// One stream code of --redirects/--tee: 0 none, 1 stdout, 2 stderr, 3 both.
StreamSelection selectionFromCode(const std::string& flag, const std::string& code);

}  // namespace ddpl::launcher::cli
