// The bootstrap benchmark's log set-up, in its own translation unit: spdlog (with the system's
// fmt) and LibTorch's headers (with their own fmt) do not compile together.
#include "common/log.h"

void benchLogWarningsOnly() { ddpl::log::init({"bench"}, spdlog::level::warn); }
