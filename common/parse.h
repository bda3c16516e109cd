#pragma once
// The one checked parser for numbers, booleans and endpoints that every program's command line
// and environment go through (launch, rdzv-server, the example, the benchmarks). Pure: a bad
// value throws InvalidArgument naming the source (a flag or a variable) and the value, never
// std::out_of_range or a silent wrap.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.h"

namespace ddpl {

// A whole number in [min, max]: decimal digits with an optional sign, nothing else.
int64_t parseInteger(std::string_view source, std::string_view text, int64_t min = 0,
                     int64_t max = std::numeric_limits<int64_t>::max());

// A finite decimal number in [min, max].
double parseNumber(std::string_view source, std::string_view text, double min, double max);

// 1/0, true/false, yes/no, on/off (any case). An empty value is false: `--flag=` turns off.
bool parseBool(std::string_view source, std::string_view text);

// A TCP port 1..65535, or 0 too when `allow_zero` (bind: pick a free one).
int parsePort(std::string_view source, std::string_view text, bool allow_zero = false);

struct HostPort {
  std::string host;
  int port = 0;
};

// HOST[:PORT], [IPv6]:PORT or a bare IPv6 address; `default_port` when no port is given.
HostPort parseHostPort(std::string_view source, std::string_view text, int default_port);

// An address to listen on: an IPv4 address (each part 0-255), an IPv6 address (bare or in
// brackets, returned without them) or a host name (letters, digits, '-' and '.', as RFC 1123
// has them). Throws InvalidArgument naming `source` for anything else, an empty value included.
std::string parseListenHost(std::string_view source, std::string_view text);

// Splits on `sep` and trims blanks around each item; "" gives no items.
std::vector<std::string> splitList(std::string_view text, char sep);

// The candidate closest to `word` by edit distance, or "" when none is close enough to be a
// plausible typo (distance <= 1/3 of the word's length, at least 2).
std::string closestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ddpl
