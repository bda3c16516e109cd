#include "common/flag_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <sstream>

namespace ddpl::flag_table {
namespace {

// Word-wraps `text` for a column starting at `indent`, lines at most `width` wide.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  std::istringstream words(text);
  std::string w;
  while (words >> w) {
    if (!line.empty() && indent + line.size() + 1 + w.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  return out + line + "\n";
}

// The text's own lines, each after the first at `indent`.
std::string indentLines(const std::string& text, size_t indent) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    out += text.substr(start, end == std::string::npos ? std::string::npos : end - start) + "\n";
    if (end == std::string::npos) return out;
    out += std::string(indent, ' ');
    start = end + 1;
  }
}

}  // namespace

std::string canonical(const std::string& name) {
  if (name.size() < 3 || name[0] != '-' || name[1] != '-') return name;
  std::string c = name;
  std::replace(c.begin() + 2, c.end(), '_', '-');
  return c;
}

UsageError ambiguous(const std::string& name, const std::vector<std::string>& matches) {
  std::string names;
  for (const auto& m : matches) names += (names.empty() ? "" : ", ") + m;
  return UsageError(fmt::format("ambiguous option '{}' could match {}", name, names));
}

std::string envName(const std::string& prefix, const std::string& flag) {
  std::string n = flag.substr(std::min<size_t>(2, flag.size()));
  std::transform(n.begin(), n.end(), n.begin(),
                 [](char ch) { return ch == '-' ? '_' : static_cast<char>(::toupper(ch)); });
  return prefix + n;
}

std::string helpRow(const std::string& label, const std::string& help, const HelpLayout& layout) {
  const std::string text = layout.wrap_width > 0 ? wrap(help, layout.text_column, layout.wrap_width)
                                                 : indentLines(help, layout.text_column);
  const size_t names_width = layout.text_column - layout.indent - layout.min_gap;
  std::string out = std::string(layout.indent, ' ') + label;
  if (label.size() > names_width && layout.long_names_own_line)
    return out + "\n" + std::string(layout.text_column, ' ') + text;
  if (label.size() < names_width) out += std::string(names_width - label.size(), ' ');
  return out + std::string(layout.min_gap, ' ') + text;
}

}  // namespace ddpl::flag_table
