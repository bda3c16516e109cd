#pragma once
// Sizes as people read them, one spelling wherever launch prints one (the live view, the
// end-of-run summary, the checkpoint tier's log lines).
#include <cstdint>
#include <string>

namespace ddpl {

// "512B", "12KiB", "340MiB", "1.2GiB".
std::string humanBytes(int64_t bytes);

// "13M", "1.2G": for a status line, which has no room for "MiB".
std::string shortBytes(int64_t bytes);

}  // namespace ddpl
