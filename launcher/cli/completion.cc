// --print-completion: shell completion scripts made from the flag table, as torchrun makes its
// own from its argparse parser (with shtab). Options, the values of options with a fixed set
// of them, and files for PROGRAM and its arguments.
#include <fmt/format.h>

#include <cctype>

#include "launcher/cli/cli.h"
#include "launcher/cli/flags.h"

namespace ddpl::launcher {
namespace {

using cli::Flag;
using cli::flags;

// The fixed values a metavar names: "auto|live|log|off" -> auto live log off; "N|gpu|cpu|auto"
// -> gpu cpu auto (N is a placeholder, not a value). Empty: a free value.
std::vector<std::string> choices(const Flag& f) {
  std::vector<std::string> out;
  if (!f.takes_value) return out;
  size_t start = 0;
  while (start <= f.metavar.size()) {
    size_t bar = f.metavar.find('|', start);
    std::string part =
        f.metavar.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
    bool word = !part.empty() && std::islower(static_cast<unsigned char>(part[0]));
    for (char c : part)
      word = word && (std::islower(static_cast<unsigned char>(c)) ||
                      std::isdigit(static_cast<unsigned char>(c)) || c == '-');
    if (word) out.push_back(part);
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

std::string joined(const std::vector<std::string>& words, const std::string& sep = " ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

// A value that names a file or directory (--log-dir DIR, --hostfile FILE): files complete.
bool namesFile(const Flag& f) {
  return f.metavar.find("DIR") != std::string::npos || f.metavar.find("FILE") != std::string::npos;
}

// The help's first clause, short enough for a completion menu.
std::string shortHelp(const std::string& help) {
  std::string h = help;
  for (const char* stop : {": ", "; ", " ("}) h = h.substr(0, h.find(stop));
  if (h.size() > 70) {
    h = h.substr(0, 70);
    h = h.substr(0, h.rfind(' ')) + "...";
  }
  while (!h.empty() && (h.back() == ' ' || h.back() == ',')) h.pop_back();
  return h;
}

std::string bashScript() {
  std::vector<std::string> names, valued, files;
  std::string cases;
  for (const auto& f : flags()) {
    for (const auto& n : f.names) {
      names.push_back(n);
      if (f.takes_value) valued.push_back(n);
      if (namesFile(f)) files.push_back(n);
    }
    auto c = choices(f);
    if (c.empty()) continue;
    std::string pattern;
    for (const auto& n : f.names) {
      pattern += (pattern.empty() ? "" : "|") + n;
      if (n.rfind("--", 0) == 0) {
        std::string underscored = n;
        for (size_t i = 2; i < underscored.size(); ++i)
          if (underscored[i] == '-') underscored[i] = '_';
        if (underscored != n) pattern += "|" + underscored;
      }
    }
    cases += fmt::format("    {}) COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")); return 0;;\n",
                         pattern, joined(c));
  }
  return fmt::format(R"(# bash completion for launch (ddplaunch): launch --print-completion bash
_launch() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} i=1 w
  local valued=" {valued} " files=" {files} "
  # Past PROGRAM (or --), every word is the program's own: complete files.
  while [ "$i" -lt "$COMP_CWORD" ]; do
    w=${{COMP_WORDS[i]}}
    if [ "${{COMP_WORDS[i+1]}}" = "=" ]; then i=$((i + 3)); continue; fi
    case "$w" in
      --) COMPREPLY=($(compgen -f -- "$cur")); return 0;;
      -*) case "$valued" in *" ${{w//_/-}} "*) i=$((i + 2));; *) i=$((i + 1));; esac; continue;;
    esac
    COMPREPLY=($(compgen -f -- "$cur")); return 0
  done
  # --flag=VALUE: bash splits it into --flag, =, VALUE.
  if [ "$cur" = "=" ]; then prev=${{COMP_WORDS[COMP_CWORD-1]}}; cur=""; fi
  if [ "$prev" = "=" ]; then prev=${{COMP_WORDS[COMP_CWORD-2]}}; fi
  case "$prev" in
{cases}  esac
  case "$files" in *" ${{prev//_/-}} "*) COMPREPLY=($(compgen -f -- "$cur")); return 0;; esac
  case "$valued" in *" ${{prev//_/-}} "*) COMPREPLY=(); return 0;; esac
  case "$cur" in
    -*) COMPREPLY=($(compgen -W "{names} --help --version" -- "$cur"));;
    *) COMPREPLY=($(compgen -f -- "$cur"));;
  esac
}}
complete -o filenames -F _launch launch
)",
                     fmt::arg("valued", joined(valued)), fmt::arg("files", joined(files)),
                     fmt::arg("cases", cases), fmt::arg("names", joined(names)));
}

// zsh's _arguments spec wants ':', '[', ']' and '\' escaped; the script single-quotes it.
std::string zshEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
      continue;
    }
    if (c == ':' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

std::string zshScript() {
  std::string specs;
  for (const auto& f : flags()) {
    std::string help = zshEscape(shortHelp(f.help));
    std::string value;
    if (f.takes_value) {
      auto c = choices(f);
      std::string meta = zshEscape(f.metavar);
      // A free value (a number, an address) completes nothing: ' ' shows the metavar only.
      value = ":" + meta + ":" +
              (!c.empty()     ? "(" + joined(c) + ")"
               : namesFile(f) ? "_files"
                              : " ");
    }
    for (const auto& n : f.names) {
      // --flag=VALUE or --flag VALUE; a short flag takes its value attached or next.
      std::string spelling = n + (f.takes_value ? (n.rfind("--", 0) == 0 ? "=" : "+") : "");
      specs += fmt::format("  '{}[{}]{}' \\\n", spelling, help, value);
    }
  }
  return fmt::format(R"(#compdef launch
# zsh completion for launch (ddplaunch): launch --print-completion zsh > ~/.zsh/completions/_launch
_arguments -S \
{specs}  '(- *)--help[show the help]' \
  '(- *)--version[print the version]' \
  '1:program:_files' \
  '*::program arguments:_files'
)",
                     fmt::arg("specs", specs));
}

std::string tcshScript() {
  std::vector<std::string> long_names;
  std::string values;
  for (const auto& f : flags()) {
    for (const auto& n : f.names)
      if (n.rfind("--", 0) == 0) long_names.push_back(n.substr(2));
    auto c = choices(f);
    if (c.empty()) continue;
    for (const auto& n : f.names) values += fmt::format(" 'n/{}/({})/'", n, joined(c));
  }
  long_names.push_back("help");
  long_names.push_back("version");
  // One line and no comment: `eval "`launch --print-completion tcsh`"` works as well as
  // sourcing a file.
  return fmt::format("complete launch 'c/--/({})/'{} 'p/*/f/'\n", joined(long_names), values);
}

}  // namespace

std::string completionScript(const std::string& shell) {
  if (shell == "bash") return bashScript();
  if (shell == "zsh") return zshScript();
  if (shell == "tcsh") return tcshScript();
  throw UsageError("--print-completion: '" + shell + "' is not bash, zsh or tcsh");
}

}  // namespace ddpl::launcher
