#include "launcher/membership/etcd/etcd_round_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace ddpl::launcher::etcd_detail {

using json = nlohmann::json;

bool RoundState::has(const std::string& id) const {
  return std::any_of(nodes.begin(), nodes.end(), [&](const NodeEntry& n) { return n.id == id; });
}

std::string RoundState::encode() const {
  json j;
  j["round"] = round;
  j["phase"] = complete ? "complete" : "joining";
  j["nodes"] = json::array();
  for (const auto& n : nodes)
    j["nodes"].push_back({{"id", n.id}, {"nproc", n.nproc}, {"addr", n.addr}});
  j["expected"] = expected;
  j["reason"] = reason;
  j["min"] = min_nodes;
  j["max"] = max_nodes;
  if (epoch_ms > 0) j["epoch_ms"] = epoch_ms;
  if (!stopped.empty()) {
    j["stopped"] = stopped;
    j["stopped_until"] = stopped_until;
  }
  return j.dump();
}

std::map<std::string, std::string> RoundState::stops(double now) const {
  return now < stopped_until ? stopped : std::map<std::string, std::string>{};
}

RoundState RoundState::decode(const std::string& key, const std::string& v) {
  try {
    json j = json::parse(v);
    RoundState s;
    s.round = j.at("round").get<int64_t>();
    s.complete = j.at("phase").get<std::string>() == "complete";
    for (const auto& n : j.at("nodes"))
      s.nodes.push_back({n.at("id").get<std::string>(), n.at("nproc").get<int>(),
                         n.at("addr").get<std::string>()});
    s.expected = j.at("expected").get<std::vector<std::string>>();
    s.reason = j.at("reason").get<std::string>();
    s.min_nodes = j.at("min").get<int>();
    s.max_nodes = j.at("max").get<int>();
    if (j.contains("epoch_ms")) {
      s.epoch_ms = j.at("epoch_ms").get<int64_t>();
      // Unix ms up to the year 9999: anything else was not written by an agent.
      if (s.epoch_ms < 0 || s.epoch_ms > 253402300799999)
        throw std::out_of_range(fmt::format("epoch_ms {} is no time", s.epoch_ms));
    }
    if (j.contains("stopped")) {
      s.stopped = j.at("stopped").get<std::map<std::string, std::string>>();
      s.stopped_until = j.at("stopped_until").get<double>();
    }
    return s;
  } catch (const std::exception& e) {
    throw StoreError(
        fmt::format("etcd key '{}' does not hold a rendezvous round ({}): another "
                    "program uses this prefix?",
                    key, e.what()));
  }
}

std::string encodeJoin(const NodeEntry& n) {
  return json{{"nproc", n.nproc}, {"addr", n.addr}}.dump();
}

NodeEntry decodeJoin(const std::string& key, const std::string& id, const std::string& v) {
  try {
    json j = json::parse(v);
    return {id, j.at("nproc").get<int>(), j.at("addr").get<std::string>()};
  } catch (const std::exception& e) {
    throw StoreError(fmt::format("etcd key '{}' does not hold a node's place ({})", key, e.what()));
  }
}

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace ddpl::launcher::etcd_detail
