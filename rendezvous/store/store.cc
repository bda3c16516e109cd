#include "rendezvous/store/store.h"

#include <fmt/format.h>

namespace ddpl::rdzv {

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += fmt::format(" and {} more", keys.size() - 8);
  return out;
}

}  // namespace ddpl::rdzv
