#include "common/parse.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace ddpl {
namespace {

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

int64_t parseInteger(std::string_view source, std::string_view text, int64_t min, int64_t max) {
  std::string_view t = text;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  int64_t n = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
  bool whole = !t.empty() && ec == std::errc() && end == t.data() + t.size();
  if (whole && n >= min && n <= max) return n;
  if (ec == std::errc::result_out_of_range || (whole && (n < min || n > max)))
    throw InvalidArgument(fmt::format("{}: {} is out of range: use a whole number from {} to {}",
                                      source, text, min, max));
  throw InvalidArgument(
      fmt::format("{}: '{}' is not a whole number (expected {} to {})", source, text, min, max));
}

double parseNumber(std::string_view source, std::string_view text, double min, double max) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  double d = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  bool whole = !s.empty() && end == s.c_str() + s.size() && !std::isspace((unsigned char)s[0]);
  bool overflow = whole && errno == ERANGE && !std::isfinite(d);
  if (whole && !overflow && !std::isfinite(d)) whole = false;  // nan, inf: not numbers here
  if (whole && !overflow && d >= min && d <= max) return d;
  if (whole)
    throw InvalidArgument(
        fmt::format("{}: {} is out of range: use a number from {} to {}", source, text, min, max));
  throw InvalidArgument(
      fmt::format("{}: '{}' is not a number (expected {} to {})", source, text, min, max));
}

bool parseBool(std::string_view source, std::string_view text) {
  std::string l(trimmed(text));
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off" || l.empty()) return false;
  throw InvalidArgument(fmt::format(
      "{}: '{}' is not a boolean (use 1/0, true/false, yes/no or on/off)", source, text));
}

int parsePort(std::string_view source, std::string_view text, bool allow_zero) {
  return static_cast<int>(parseInteger(source, text, allow_zero ? 0 : 1, 65535));
}

HostPort parseHostPort(std::string_view source, std::string_view text, int default_port) {
  std::string_view t = trimmed(text);
  HostPort hp;
  hp.port = default_port;
  std::string_view port_text;
  bool has_port = false;
  if (!t.empty() && t.front() == '[') {
    auto close = t.find(']');
    if (close == std::string_view::npos)
      throw InvalidArgument(
          fmt::format("{}: '{}' has '[' without ']' (use [IPv6]:PORT)", source, text));
    hp.host = std::string(t.substr(1, close - 1));
    std::string_view rest = t.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':')
        throw InvalidArgument(
            fmt::format("{}: '{}' has text after ']' that is not :PORT", source, text));
      port_text = rest.substr(1);
      has_port = true;
    }
  } else if (std::count(t.begin(), t.end(), ':') > 1) {
    hp.host = std::string(t);  // a bare IPv6 address: no port
  } else if (auto colon = t.rfind(':'); colon != std::string_view::npos) {
    hp.host = std::string(t.substr(0, colon));
    port_text = t.substr(colon + 1);
    has_port = true;
  } else {
    hp.host = std::string(t);
  }
  if (hp.host.empty())
    throw InvalidArgument(fmt::format("{}: '{}' names no host (use HOST[:PORT])", source, text));
  if (has_port) {
    if (port_text.empty())
      throw InvalidArgument(fmt::format(
          "{}: '{}' ends in ':' without a port (use HOST:PORT with a port from 1 to 65535, or "
          "HOST alone for the default {})",
          source, text, default_port));
    hp.port = parsePort(fmt::format("{} port", source), port_text);
  }
  return hp;
}

std::string parseListenHost(std::string_view source, std::string_view text) {
  std::string t(trimmed(text));
  if (t.empty())
    throw InvalidArgument(fmt::format(
        "{}: empty address: give an IPv4 or IPv6 address or a host name (0.0.0.0 for every "
        "IPv4 interface)",
        source));
  if (t.size() > 2 && t.front() == '[' && t.back() == ']') t = t.substr(1, t.size() - 2);
  if (t.find(':') != std::string::npos) {
    in6_addr a6{};
    if (inet_pton(AF_INET6, t.c_str(), &a6) != 1)
      throw InvalidArgument(fmt::format("{}: '{}' is not an IPv6 address", source, text));
    return t;
  }
  if (t.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr a4{};
    if (inet_pton(AF_INET, t.c_str(), &a4) != 1)
      throw InvalidArgument(fmt::format(
          "{}: '{}' is not an IPv4 address (four numbers from 0 to 255, like 127.0.0.1)", source,
          text));
    return t;
  }
  bool label_start = true;
  for (size_t i = 0; i < t.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(t[i]);
    const bool ok = std::isalnum(c) || (c == '-' && !label_start) || (c == '.' && !label_start);
    if (!ok || t.size() > 253)
      throw InvalidArgument(fmt::format(
          "{}: '{}' is not an address or a host name (letters, digits, '-' and '.')", source,
          text));
    label_start = c == '.';
  }
  return t;
}

std::vector<std::string> splitList(std::string_view text, char sep) {
  std::vector<std::string> out;
  if (trimmed(text).empty()) return out;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    out.emplace_back(
        trimmed(text.substr(start, end == std::string_view::npos ? end : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

}  // namespace ddpl
