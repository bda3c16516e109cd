#pragma once
// Logging for LibTorch TUs. LibTorch ships its own fmt (v11) headers, which shadow the system
// fmt that spdlog (and so common/log.h) is built against; the two cannot meet in one TU. Torch
// TUs therefore log pre-formatted strings through these functions, implemented in a torch-free TU.
#include <string>

namespace ddpl::worker::wlog {

void init(int rank);
void debug(const std::string& message);
void info(const std::string& message);
void warn(const std::string& message);
void error(const std::string& message);
void flush();

}  // namespace ddpl::worker::wlog
