#pragma once
// launch's flag table: every option's names, --help text and how its value lands in
// LaunchOptions, over the table machinery rdzv-server uses too (common/flag_table.h). Internal
// to launcher/cli/ (parseCommandLine, helpText and the completion scripts read it).
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/flag_table.h"
#include "launcher/cli/options.h"

namespace ddpl::launcher::cli {

using Flag = flag_table::Flag<LaunchOptions>;

const std::vector<Flag>& flags();

// Exact names first; then, as argparse's allow_abbrev, a prefix that names exactly one flag
// ("--stand" for --standalone). Throws UsageError for an ambiguous prefix; nullptr: unknown.
const Flag* findFlag(const std::string& name);
// The error for an unknown option, with the nearest flag suggested once.
UsageError unknownOption(const std::string& name);
// Every value goes through one call, so that a checked-parser error becomes a usage error.
void applyFlag(const Flag& f, const std::string& name, const std::string& value, LaunchOptions& o);
// The environment variable a flag falls back to: --nproc-per-node -> PET_NPROC_PER_NODE.
std::string petName(const Flag& f);

}  // namespace ddpl::launcher::cli
