#include "launcher/health/hang_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace ddpl::launcher {
namespace {

constexpr size_t kShownSource = 60;

// torch.distributed's calls that wait for the other ranks (distributed_c10d.py, torch 2.x).
const std::set<std::string>& collectiveCalls() {
  static const std::set<std::string> calls = {"all_gather",
                                              "all_gather_coalesced",
                                              "all_gather_into_tensor",
                                              "all_gather_object",
                                              "all_reduce",
                                              "all_reduce_coalesced",
                                              "all_to_all",
                                              "all_to_all_single",
                                              "barrier",
                                              "batch_isend_irecv",
                                              "broadcast",
                                              "broadcast_object_list",
                                              "gather",
                                              "gather_object",
                                              "init_process_group",
                                              "monitored_barrier",
                                              "new_group",
                                              "new_subgroups",
                                              "recv",
                                              "recv_object_list",
                                              "reduce",
                                              "reduce_scatter",
                                              "reduce_scatter_tensor",
                                              "scatter",
                                              "scatter_object_list",
                                              "send",
                                              "send_object_list"};
  return calls;
}

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string baseName(const std::string& file) { return file.substr(file.rfind('/') + 1); }

bool isC10dFile(const std::string& file) {
  return file == "distributed_c10d.py" || endsWith(file, "/distributed_c10d.py");
}

// A native frame of a collective's wait (eu-stack, gdb): not the store's (c10d::TCPStore).
bool nativeCollective(const std::string& symbol) {
  for (const char* s : {"ProcessGroup", "gloo::", "nccl", "c10d::Work", "c10d::Backend"})
    if (symbol.find(s) != std::string::npos) return true;
  return false;
}

std::string quoted(const std::string& source) {
  if (source.empty()) return "";
  std::string s = source.size() > kShownSource ? source.substr(0, kShownSource) + "..." : source;
  return " `" + s + "`";
}

// " (sizes [[4]])"; nothing for a collective without tensors (a barrier: "[]").
std::string sizesNote(const std::string& sizes) {
  return sizes.empty() || sizes == "[]" ? "" : " (sizes " + sizes + ")";
}

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string ranksWord(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankList(ranks);
}

// The flight recorder's view of one process group: the newest collective any rank entered,
// who is behind it, and what each rank that entered it entered.
struct GroupView {
  std::string key;
  std::string name;
  uint64_t newest = 0;
  std::vector<size_t> behind;           // indices of ranks whose newest is older
  std::vector<size_t> entered;          // at `newest`
  std::map<size_t, std::string> op_of;  // for `entered`, where the ring still held the entry
  std::string majority_op;              // empty: no operation has more ranks than every other
  std::string sizes;                    // the majority's input sizes
  bool diverges() const;
};

bool GroupView::diverges() const {
  if (!behind.empty()) return true;
  std::set<std::string> ops;
  for (const auto& [i, op] : op_of) ops.insert(op);
  return ops.size() > 1;
}

bool hasRecord(const RankEvidence& r) {
  return r.fr && r.fr->answered && !r.fr->last_enqueued.empty();
}

std::optional<GroupView> focusGroup(const std::vector<RankEvidence>& ranks) {
  std::set<std::string> keys;
  for (const auto& r : ranks)
    if (hasRecord(r))
      for (const auto& [k, n] : r.fr->last_enqueued) keys.insert(k);
  std::optional<GroupView> best;
  auto better = [](const GroupView& a, const GroupView& b) {  // a before b
    if (a.diverges() != b.diverges()) return a.diverges();
    if ((a.key == "0") != (b.key == "0")) return a.key == "0";
    return a.entered.size() + a.behind.size() > b.entered.size() + b.behind.size();
  };
  for (const auto& key : keys) {
    GroupView g;
    g.key = key;
    for (const auto& r : ranks)
      if (hasRecord(r) && r.fr->last_enqueued.count(key))
        g.newest = std::max(g.newest, r.fr->last_enqueued.at(key));
    std::map<std::string, int> count;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const auto& r = ranks[i];
      if (!hasRecord(r) || !r.fr->last_enqueued.count(key)) continue;
      if (r.fr->last_enqueued.at(key) < g.newest) {
        g.behind.push_back(i);
        continue;
      }
      g.entered.push_back(i);
      if (const FlightEntry* e = r.fr->find(key, g.newest)) {
        g.op_of[i] = e->op;
        ++count[e->op];
        if (g.name.empty()) g.name = e->group_name;
      }
    }
    for (const auto& [op, n] : count) {
      bool most = std::all_of(count.begin(), count.end(), [&](const auto& other) {
        return other.first == op || other.second < n;
      });
      if (most) g.majority_op = op;
    }
    for (const auto& [i, op] : g.op_of)
      if (op == g.majority_op && g.sizes.empty())
        if (const FlightEntry* e = ranks[i].fr->find(key, g.newest)) g.sizes = e->sizes;
    if (g.name.empty()) g.name = key == "0" ? "default_pg" : "pg " + key;
    if (!best || better(g, *best)) best = g;
  }
  return best;
}

std::string lastCollective(const RankEvidence& r, const GroupView& g) {
  auto it = r.fr->last_enqueued.find(g.key);
  if (it == r.fr->last_enqueued.end() || it->second == 0) return "no collective yet";
  const FlightEntry* e = r.fr->find(g.key, it->second);
  return fmt::format("last collective #{}{}", it->second, e ? " (" + e->op + ")" : "");
}

// Where a rank stands, in words, and the key of its place for grouping.
struct Place {
  std::string key;
  std::string text;
  std::optional<StackCollective> collective;
};

Place placeOf(const RankEvidence& r, const std::optional<GroupView>& g) {
  Place p;
  const auto& frames = r.stack.frames;
  p.collective = collectiveOf(frames);
  for (const auto& f : frames) p.key += readFrame(f).key() + "\n";
  std::string fr_part;  // the collective numbered, or the rank's last one
  bool fr_numbered = false;
  if (hasRecord(r)) {
    // The group whose newest collective here is the one the stack is in; the focus first.
    std::vector<std::string> keys;
    if (g && r.fr->last_enqueued.count(g->key)) keys.push_back(g->key);
    for (const auto& [k, n] : r.fr->last_enqueued)
      if (!g || k != g->key) keys.push_back(k);
    for (const auto& k : keys) {
      if (!p.collective) break;
      uint64_t n = r.fr->last_enqueued.at(k);
      const FlightEntry* e = r.fr->find(k, n);
      if (!e || (!p.collective->op.empty() && p.collective->op != e->op)) continue;
      if (p.collective->op.empty()) p.collective->op = e->op;
      fr_part = fmt::format(" #{} of {}{}", n, e->group_name, sizesNote(e->sizes));
      fr_numbered = true;
      break;
    }
    if (!fr_numbered && g && r.fr->last_enqueued.count(g->key))
      fr_part = ", " + lastCollective(r, *g);
  }
  p.key += fr_part;
  if (r.stack.stopped) {
    p.text = "stopped (SIGSTOP or a debugger) ";
    p.key += "stopped";
  }
  if (frames.empty()) {
    p.text += "with no stack taken (see its stacks.txt)" + fr_part;
    return p;
  }
  if (p.collective) {
    const auto& c = *p.collective;
    p.text += "waits in " + (c.op.empty() ? std::string("a collective") : c.op);
    if (fr_numbered) p.text += fr_part;
    p.text += " at " + c.site;
    if (!c.caller.empty()) p.text += " <- " + c.caller + quoted(c.caller_source);
    if (!fr_numbered) p.text += fr_part;
    return p;
  }
  // Outside any collective: the innermost frame of the program's own, and what it called.
  size_t own = frames.size();
  for (size_t i = 0; i < frames.size(); ++i)
    if (frames[i].user) {
      own = i;
      break;
    }
  if (own == frames.size()) {
    p.text += "in " + readFrame(frames[0]).shown();
  } else {
    ReadFrame f = readFrame(frames[own]);
    p.text += "in " + f.shown() + quoted(f.source);
    if (own > 0) p.text += " -> " + readFrame(frames[own - 1]).shown();
  }
  p.text += fr_part;
  return p;
}

}  // namespace

std::string ReadFrame::key() const {
  if (native || line < 0 || user) return shown();
  return func + " (" + file + ")";
}

std::string ReadFrame::shown() const {
  if (native || file.empty()) return func;
  return func + " (" + file + (line >= 0 ? ":" + std::to_string(line) : "") + ")";
}

ReadFrame readFrame(const StackFrame& frame) {
  ReadFrame f;
  f.user = frame.user;
  f.source = frame.source;
  const std::string& t = frame.text;
  if (!t.empty() && t[0] == '#') {  // eu-stack or gdb: "#1  0x00007f... symbol ..."
    f.native = true;
    std::istringstream in(t);
    std::string word;
    in >> word;  // "#1"
    while (in >> word) {
      if (word.rfind("0x", 0) == 0 || word == "in") continue;
      f.func = word;
      break;
    }
    return f;
  }
  // py-spy: "function (file:line)"
  auto open = t.rfind(" (");
  if (open == std::string::npos || t.back() != ')') {
    f.func = t;
    return f;
  }
  f.func = t.substr(0, open);
  std::string where = t.substr(open + 2, t.size() - open - 3);
  auto colon = where.rfind(':');
  if (colon != std::string::npos && colon + 1 < where.size() &&
      where.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
      where.size() - colon - 1 <= 9) {
    f.file = where.substr(0, colon);
    f.line = std::stoi(where.substr(colon + 1));
  } else {
    f.file = where;
  }
  return f;
}

std::optional<StackCollective> collectiveOf(const std::vector<StackFrame>& frames) {
  std::vector<ReadFrame> read;
  for (const auto& f : frames) read.push_back(readFrame(f));
  // Outermost first: the program's own call into the API, not what that call uses inside.
  for (size_t i = read.size(); i-- > 0;) {
    const ReadFrame& f = read[i];
    if (f.native || !isC10dFile(f.file) || !collectiveCalls().count(f.func)) continue;
    StackCollective c;
    c.op = f.func;
    c.site = baseName(f.file) + (f.line >= 0 ? ":" + std::to_string(f.line) : "");
    for (size_t j = i + 1; j < read.size(); ++j) {
      const ReadFrame& out = read[j];
      if (out.user) {
        c.caller = out.file + (out.line >= 0 ? ":" + std::to_string(out.line) : "");
        c.caller_source = out.source;
        break;
      }
      // No frame of the program's own (a library called it, or none was recognised): the
      // nearest caller outside torch.distributed's wrappers.
      if (c.caller.empty() && out.file.rfind("torch/distributed/", 0) != 0) c.caller = out.shown();
    }
    return c;
  }
  for (const auto& f : read)
    if (f.native && nativeCollective(f.func)) return StackCollective{"", f.func, "", ""};
  return std::nullopt;
}

HangReport analyzeHang(const std::vector<RankEvidence>& ranks) {
  HangReport report;
  const std::optional<GroupView> g = focusGroup(ranks);
  std::vector<Place> places;
  for (const auto& r : ranks) places.push_back(placeOf(r, g));

  // Groups of ranks that stand in the same place, in the order of their first rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // (text, global ranks)
  std::map<std::string, size_t> group_of;
  std::vector<size_t> order(ranks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return ranks[a].global_rank < ranks[b].global_rank; });
  for (size_t i : order) {
    auto [it, fresh] = group_of.emplace(places[i].key, groups.size());
    if (fresh) groups.push_back({places[i].text, {}});
    groups[it->second].second.push_back(ranks[i].global_rank);
  }
  for (auto [text, members] : groups) {
    auto verb = text.find("waits in ");
    if (members.size() > 1 && verb != std::string::npos) text.erase(verb + 4, 1);  // "wait in"
    report.groups.push_back(ranksWord(members) + " " + text);
  }

  // What the others wait in, in words: numbered by the flight recorder where it can.
  std::map<std::string, std::vector<size_t>> by_stack_op;  // ranks in a collective, by op
  for (size_t i : order)
    if (places[i].collective) by_stack_op[places[i].collective->op].push_back(i);
  std::string stack_majority;
  size_t stack_majority_n = 0;
  bool stack_tie = false;
  for (const auto& [op, members] : by_stack_op) {
    if (members.size() > stack_majority_n) {
      stack_majority = op, stack_majority_n = members.size(), stack_tie = false;
    } else if (members.size() == stack_majority_n) {
      stack_tie = true;
    }
  }
  std::vector<int> waiting;  // global ranks in the awaited collective
  std::string awaited;
  if (g && !g->majority_op.empty()) {
    for (size_t i : g->entered)
      if (g->op_of.count(i) && g->op_of.at(i) == g->majority_op)
        waiting.push_back(ranks[i].global_rank);
    awaited = fmt::format("{} #{} of {}", g->majority_op, g->newest, g->name);
  }
  if (!stack_tie && stack_majority_n > 0) {
    for (size_t i : by_stack_op[stack_majority])
      if (std::find(waiting.begin(), waiting.end(), ranks[i].global_rank) == waiting.end())
        waiting.push_back(ranks[i].global_rank);
    if (awaited.empty())
      awaited = stack_majority.empty() ? std::string("a collective") : stack_majority;
  }
  std::sort(waiting.begin(), waiting.end());

  // The culprits, each with its reason.
  std::map<int, std::string> why;  // by global rank
  auto others = [&](int self) {
    std::vector<int> o;
    for (int r : waiting)
      if (r != self) o.push_back(r);
    return o;
  };
  if (g && !g->majority_op.empty()) {
    for (size_t i : g->behind) {
      const std::string sizes = sizesNote(g->sizes);
      auto o = others(ranks[i].global_rank);
      why[ranks[i].global_rank] = fmt::format(
          "never entered {}{}{}; {}", awaited, sizes,
          o.empty() ? "" : ", where " + ranksWord(o) + (o.size() == 1 ? " waits" : " wait"),
          lastCollective(ranks[i], *g));
    }
    for (const auto& [i, op] : g->op_of)
      if (op != g->majority_op) {
        auto o = others(ranks[i].global_rank);
        why[ranks[i].global_rank] =
            fmt::format("in {} #{} of {} while {} {} in {}: mismatched collectives", op, g->newest,
                        g->name, o.empty() ? std::string("the others") : ranksWord(o),
                        o.size() == 1 ? "is" : "are", awaited);
      }
  }
  // Ranks the flight recorder cannot speak for: their stacks.
  for (size_t i : order) {
    const RankEvidence& r = ranks[i];
    if (hasRecord(r) && g && r.fr->last_enqueued.count(g->key)) continue;
    if (why.count(r.global_rank) || waiting.empty()) continue;
    auto o = others(r.global_rank);
    if (o.empty()) continue;
    const std::string where =
        ", while " + ranksWord(o) + (o.size() == 1 ? " waits in " : " wait in ") + awaited;
    const auto& c = places[i].collective;
    if (r.stack.stopped && !c)
      why[r.global_rank] = "stopped (SIGSTOP or a debugger) outside any collective" + where;
    else if (!c && !r.stack.frames.empty())
      why[r.global_rank] = "not inside a collective" + where;
    else if (c && !stack_tie && !c->op.empty() && !stack_majority.empty() &&
             c->op != stack_majority)
      why[r.global_rank] = "in " + c->op + where + ": mismatched collectives";
    else if (r.stack.stopped)
      why[r.global_rank] = "stopped (SIGSTOP or a debugger)" + where;
  }
  // "rank(s) 1, 2 (<why>)", or each its own where the reasons differ.
  std::set<std::string> reasons;
  for (const auto& [rank, w] : why) {
    report.culprits.push_back(rank);
    reasons.insert(w);
  }
  if (reasons.size() == 1) {
    report.why = *reasons.begin();
  } else {
    for (const auto& [rank, w] : why)
      report.why += (report.why.empty() ? "" : "; ") + fmt::format("rank {}: {}", rank, w);
  }
  if (report.culprits.empty() && g && g->majority_op.empty() && g->diverges()) {
    std::map<std::string, std::vector<int>> by_op;
    for (const auto& [i, op] : g->op_of) by_op[op].push_back(ranks[i].global_rank);
    std::string sides;
    for (auto& [op, members] : by_op) {
      std::sort(members.begin(), members.end());
      sides += (sides.empty() ? "" : ", ") + ranksWord(members) + " in " + op;
    }
    report.note = fmt::format("mismatched collectives as #{} of {}: {}", g->newest, g->name, sides);
  }
  if (report.culprits.empty() && g && !g->diverges() && !g->majority_op.empty())
    report.note = fmt::format(
        "every rank that answered entered {}: none of them is missing from it (look at the "
        "other nodes' ranks, or the network)",
        awaited);
  return report;
}

}  // namespace ddpl::launcher
