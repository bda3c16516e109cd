#pragma once
// A program's flags as one table: each flag's names, --help text and how its value lands in the
// program's options. launch (launcher/cli/flags.cc) and rdzv-server
// (rendezvous/server/server_flags.cc) each keep their own table and their own grammar (launch's
// abbreviations, short flags and PET_ variables; rdzv-server's --flag=value only); what they
// share is here: the spelling rule (--flag_name is --flag-name), the lookup, the one call that
// turns a checked parser's error into a usage error, and the columns of --help.
#include <functional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace ddpl::flag_table {

template <typename Options>
struct Flag {
  std::vector<std::string> names;  // canonical spelling with dashes; first is the main one
  bool takes_value;
  // After the names in --help: the value's name ("N" shows as "--port N"); for a switch, what
  // may follow it inline ("[=HOST:PORT]" shows as "--dashboard[=HOST:PORT]").
  std::string metavar;
  std::string help;
  std::function<void(const std::string& flag, const std::string& value, Options&)> apply;
};

// "--nproc_per_node" -> "--nproc-per-node"; anything not starting with "--" as it is.
std::string canonical(const std::string& name);

enum class Prefixes {
  kRefuse,  // only whole names
  kAccept,  // as argparse's allow_abbrev: a prefix of exactly one flag's main name names it
};

// Throws UsageError "ambiguous option 'NAME' could match A, B" for a prefix of several flags.
UsageError ambiguous(const std::string& name, const std::vector<std::string>& matches);

// The flag `name` names (any spelling), or nullptr.
template <typename Options>
const Flag<Options>* find(const std::vector<Flag<Options>>& table, const std::string& name,
                          Prefixes prefixes) {
  const std::string c = canonical(name);
  for (const auto& f : table)
    for (const auto& n : f.names)
      if (n == c) return &f;
  if (prefixes == Prefixes::kRefuse || c.rfind("--", 0) != 0 || c.size() < 3) return nullptr;
  std::vector<const Flag<Options>*> matches;
  for (const auto& f : table)
    if (f.names[0].rfind(c, 0) == 0) matches.push_back(&f);
  if (matches.size() > 1) {
    std::vector<std::string> names;
    for (const auto* f : matches) names.push_back(f->names[0]);
    throw ambiguous(name, names);
  }
  return matches.empty() ? nullptr : matches[0];
}

// Every value goes through one call, so that a checked parser's InvalidArgument becomes a
// UsageError with the same message (the flag and the value in it).
template <typename Options>
void apply(const Flag<Options>& f, const std::string& name, const std::string& value,
           Options& options) {
  try {
    f.apply(name, value, options);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

// The environment variable a flag falls back to: ("PET_", "--nproc-per-node") ->
// "PET_NPROC_PER_NODE".
std::string envName(const std::string& prefix, const std::string& flag);

// Where --help puts a flag's names and its text: the names at `indent`, the text from
// `text_column`, at least `min_gap` spaces between them.
struct HelpLayout {
  size_t indent = 2;
  size_t text_column = 37;
  size_t min_gap = 1;
  // Names too long for the gap: the text starts on the next line (else after the gap anyway).
  bool long_names_own_line = false;
  // The text wrapped at this width; 0: its own line breaks kept.
  size_t wrap_width = 100;
};

// "-r, --max-restarts N": the names, the short ones first, and the metavar.
template <typename Options>
std::string label(const Flag<Options>& f) {
  std::string out;
  for (auto it = f.names.rbegin(); it != f.names.rend(); ++it)
    out += (out.empty() ? "" : ", ") + *it;
  return out + (f.takes_value ? " " : "") + f.metavar;
}

// One flag's lines of --help, ending in a newline.
std::string helpRow(const std::string& label, const std::string& help, const HelpLayout& layout);

template <typename Options>
std::string helpRows(const std::vector<Flag<Options>>& table, const HelpLayout& layout) {
  std::string out;
  for (const auto& f : table) out += helpRow(label(f), f.help, layout);
  return out;
}

}  // namespace ddpl::flag_table
