#include "worker/log_bridge.h"

#include "common/log.h"

namespace ddpl::worker::wlog {

void init(int rank) { log::init(log::Identity{"worker", rank, ""}); }
void debug(const std::string& message) { log::debug("{}", message); }
void info(const std::string& message) { log::info("{}", message); }
void warn(const std::string& message) { log::warn("{}", message); }
void error(const std::string& message) { log::error("{}", message); }
void flush() { log::logger().flush(); }

}  // namespace ddpl::worker::wlog
