#include "launcher/cli/values.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/errors.h"
#include "common/parse.h"

namespace ddpl::launcher::cli {

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) { return splitList(s, sep); }

void checkRunId(const std::string& flag, const std::string& id) {
  if (id.empty())
    throw UsageError(fmt::format("{}: empty run id: give the job a name such as 'train-42'", flag));
  if (id.size() > kMaxRunIdLength)
    throw UsageError(fmt::format("{}: the run id is {} characters long; at most {} are allowed",
                                 flag, id.size(), kMaxRunIdLength));
  for (unsigned char c : id)
    if (!std::isalnum(c) && std::strchr("._-:@+=", c) == nullptr)
      throw UsageError(fmt::format(
          "{}: '{}' has the character '{}' ({:#04x}); a run id may use letters, digits and "
          "._-:@+= only",
          flag, id.size() > 64 ? id.substr(0, 64) + "..." : id,
          std::isprint(c) ? std::string(1, static_cast<char>(c)) : std::string("?"), c));
  if (id.front() == '.' || id.front() == '-')
    throw UsageError(fmt::format("{}: '{}' starts with '{}'; start a run id with a letter or digit",
                                 flag, id, id.front()));
}

int endpointPort(const std::string& flag, const std::string& v) {
  if (v.size() > 2 && v.compare(v.size() - 2, 2, ":0") == 0 &&
      std::count(v.begin(), v.end(), ':') == 1) {
    parseHostPort(flag, v.substr(0, v.size() - 2), kDefaultRdzvPort);
    return 0;
  }
  if (v.size() > 3 && v.compare(v.size() - 3, 3, "]:0") == 0) {
    parseHostPort(flag, v.substr(0, v.size() - 2), kDefaultRdzvPort);
    return 0;
  }
  return parseHostPort(flag, v, kDefaultRdzvPort).port;
}

int parseInt(const std::string& flag, const std::string& v, int min_value, int max_value) {
  return static_cast<int>(parseInteger(flag, v, min_value, max_value));
}

double parseSeconds(const std::string& flag, const std::string& v) {
  return parseNumber(flag, v, 0, 1e9);
}

std::vector<std::string> parseFilterList(const std::string& v) {
  std::vector<std::string> items;
  if (v.empty()) return items;
  std::string item;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != ',') {
      item.push_back(v[i]);
    } else if (i + 1 < v.size() && v[i + 1] == ',') {
      item.push_back(',');
      ++i;
    } else {
      items.push_back(std::move(item));
      item.clear();
    }
  }
  items.push_back(std::move(item));
  return items;
}

StreamSelection selectionFromCode(const std::string& flag, const std::string& code) {
  int c = -1;
  if (code.size() == 1 && code[0] >= '0' && code[0] <= '3') c = code[0] - '0';
  if (c < 0)
    throw UsageError(fmt::format(
        "{}: '{}' is not a stream code (0 none, 1 stdout, 2 stderr, 3 both)", flag, code));
  return {(c & 1) != 0, (c & 2) != 0};
}

uint64_t parseSize(const std::string& flag, const std::string& v) {
  std::string t = trim(v);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  std::string number = t.substr(0, i), unit = t.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  int shift = -1;
  const std::string units = "BKMGT";
  if (unit.empty())
    shift = 0;
  else if (unit.size() == 1 && units.find(unit[0]) != std::string::npos)
    shift = 10 * static_cast<int>(units.find(unit[0]));
  char* end = nullptr;
  double n = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (shift < 0 || n < 0 || !end || *end != '\0' || n * std::pow(2.0, shift) > 1e18)
    throw UsageError(flag + ": '" + v + "' is not a size (e.g. 0, 512M, 4G)");
  return static_cast<uint64_t>(n * std::pow(2.0, shift));
}

}  // namespace ddpl::launcher::cli
