#pragma once
// The process environment as a value. Programs read it once in main and hand it to the
// libraries' option parsers, which never call getenv behind the caller's back.
#include <map>
#include <string>

namespace ddpl {

using Environment = std::map<std::string, std::string>;

Environment processEnvironment();

}  // namespace ddpl
