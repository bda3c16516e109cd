// How frames get their names. The mechanism is elfutils' libdw (Dwfl), the library behind
// eu-stack and eu-addr2line, applied to this process at the moment the trace is recorded, while
// its maps are still the ones the addresses refer to:
//   - dwfl_linux_proc_report reads /proc/<pid>/maps, so every module is found where it is mapped
//     (executables, dlopen'ed libraries, PIE or not) without trusting dladdr's view;
//   - dwfl_module_addrinfo names static and hidden functions from .symtab (or a separate debug
//     file), which dladdr and so c10's backtrace ("<unknown function> + 0x8b0cc") cannot;
//   - dwfl_module_getsrc and dwarf_getscopes give file:line and the chain of inlined calls, as
//     eu-addr2line -i does.
// The lookup runs in a forked copy of the process, which has the same maps, and hands its frames
// back through a pipe one by one. That is what bounds it: at the deadline the copy is killed and
// the frames not reached keep module + offset; and nothing libdw does with a damaged or enormous
// debug file (a fault, a hang, gigabytes of DWARF) can turn the error being reported into a crash.
// The price is one fork: the page tables are copied, not the memory (measured in docs/worker.md).
// A thread in this process would be cheaper but could be neither stopped nor survived.
#include "worker/native_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/file_io.h"

namespace ddpl::worker {
namespace {

using Clock = std::chrono::steady_clock;

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

std::string hex(uintptr_t value) {
  char buf[2 + 16 + 1];
  std::snprintf(buf, sizeof(buf), "0x%lx", static_cast<unsigned long>(value));
  return buf;
}

// --- the forked copy --------------------------------------------------------------------------

// Return addresses point after the call; one byte back is the call itself, which lies on the
// calling line and, when the callee never returns and the call ends its function, still inside
// the calling function.
Dwarf_Addr callSite(uintptr_t returnAddress) { return returnAddress - 1; }

// Through inlined copies to the abstract definition, and through out-of-class definitions to the
// declaration: the DIE that carries the names and sits in its namespaces and classes.
Dwarf_Die declarationOf(Dwarf_Die die) {
  for (int hops = 0; hops < 8; ++hops) {
    Dwarf_Attribute attr;
    Dwarf_Die next;
    if ((dwarf_attr(&die, DW_AT_abstract_origin, &attr) != nullptr ||
         dwarf_attr(&die, DW_AT_specification, &attr) != nullptr) &&
        dwarf_formref_die(&attr, &next) != nullptr) {
      die = next;
      continue;
    }
    break;
  }
  return die;
}

// The mangled name has namespaces and parameter types; GCC gives none to functions with
// internal linkage (static, anonymous namespace), so those are named from their scopes.
std::string linkageName(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
  if (name == nullptr)
    name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
  return name ? demangle(name) : "";
}

std::string scopedName(Dwarf_Die* die) {
  Dwarf_Die decl = declarationOf(*die);
  const char* name = dwarf_diename(&decl);
  if (name == nullptr) return "";
  std::string qualified = name;
  Dwarf_Die* scopes = nullptr;
  const int count = dwarf_getscopes_die(&decl, &scopes);
  for (int i = 1; i < count; ++i) {
    const int tag = dwarf_tag(&scopes[i]);
    // Functions too: a lambda's or local class's member is named inside the function around it.
    if (tag != DW_TAG_namespace && tag != DW_TAG_class_type && tag != DW_TAG_structure_type &&
        tag != DW_TAG_union_type && tag != DW_TAG_subprogram)
      continue;
    const char* scope = dwarf_diename(&scopes[i]);
    // GCC leaves lambdas' closure classes unnamed (and an unnamed struct is a structure_type).
    const char* unnamed = tag == DW_TAG_namespace    ? "(anonymous namespace)"
                          : tag == DW_TAG_class_type ? "{lambda}"
                                                     : "<anonymous>";
    qualified = std::string(scope ? scope : unnamed) + "::" + qualified;
  }
  std::free(scopes);
  return qualified;
}

bool isFunctionScope(Dwarf_Die* die) {
  const int tag = dwarf_tag(die);
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine || tag == DW_TAG_entry_point;
}

// File:line of the call site, innermost function first, then each function it was inlined
// into at the line of that call (eu-addr2line -i's walk).
std::vector<FrameLocation> dwarfLocations(Dwfl_Module* mod, Dwarf_Addr pc,
                                          const std::string& symbol) {
  std::vector<FrameLocation> out;
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = dwfl_module_addrdie(mod, pc, &bias);
  if (cu == nullptr) return out;
  // Sources compiled by a relative path (ccache's base_dir rewrites them so) are named relative
  // to the directory of the compilation: made absolute, they can be opened from anywhere.
  Dwarf_Attribute compDirAttr;
  const char* compDir = dwarf_formstring(dwarf_attr(cu, DW_AT_comp_dir, &compDirAttr));
  const auto sourcePath = [compDir](const char* src) -> std::string {
    if (src == nullptr) return "";
    if (src[0] == '/' || compDir == nullptr || compDir[0] != '/') return src;
    return (std::filesystem::path(compDir) / src).lexically_normal().string();
  };
  std::string file;
  int line = 0;
  if (Dwfl_Line* l = dwfl_module_getsrc(mod, pc))
    file = sourcePath(dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr));
  Dwarf_Die* scopes = nullptr;
  int count = dwarf_getscopes(cu, pc - bias, &scopes);
  if (count > 0) {
    // dwarf_getscopes continues from an inlined copy into the abstract definition's scopes;
    // the scopes around the concrete DIE are the chain of callers we want.
    Dwarf_Die innermost;
    Dwarf_Addr dwbias = 0;
    Dwarf* dwarf = dwfl_module_getdwarf(mod, &dwbias);
    const bool found =
        dwarf != nullptr && dwarf_offdie(dwarf, dwarf_dieoffset(&scopes[0]), &innermost) != nullptr;
    std::free(scopes);
    scopes = nullptr;
    count = found ? dwarf_getscopes_die(&innermost, &scopes) : 0;
  }
  Dwarf_Files* files = nullptr;
  if (dwarf_getsrcfiles(cu, &files, nullptr) != 0) files = nullptr;
  for (int i = 0; i < count; ++i) {
    if (!isFunctionScope(&scopes[i])) continue;
    const bool inlined = dwarf_tag(&scopes[i]) == DW_TAG_inlined_subroutine;
    std::string function = linkageName(&scopes[i]);
    // The function the code lies in is also the symbol covering it, which has the parameter
    // types that scopedName lacks (unless identical code folding gave it another's name).
    if (function.empty() && !inlined && !symbol.empty()) {
      const char* plain = dwarf_diename(&scopes[i]);
      if (plain != nullptr && symbol.find(plain) != std::string::npos) function = symbol;
    }
    if (function.empty()) function = scopedName(&scopes[i]);
    out.push_back({function, file, line});
    if (!inlined) break;
    // The function this one was inlined into continues at the call.
    Dwarf_Attribute attr;
    Dwarf_Word value = 0;
    file.clear();
    line = 0;
    if (files != nullptr &&
        dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &value) == 0)
      file = sourcePath(dwarf_filesrc(files, value, nullptr, nullptr));
    if (dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attr), &value) == 0)
      line = static_cast<int>(value);
  }
  std::free(scopes);
  // Line information without scopes (no DW_TAG_subprogram covers the address): still a place.
  if (out.empty() && !file.empty()) out.push_back({"", file, line});
  return out;
}

nlohmann::json resolveOne(Dwfl* dwfl, size_t index, uintptr_t address) {
  nlohmann::json j;
  j["i"] = index;
  const Dwarf_Addr pc = callSite(address);
  Dwfl_Module* mod = dwfl_addrmodule(dwfl, pc);
  if (mod == nullptr) return j;
  Dwarf_Addr low = 0;
  const char* name =
      dwfl_module_info(mod, nullptr, &low, nullptr, nullptr, nullptr, nullptr, nullptr);
  j["m"] = name ? name : "";
  Dwarf_Addr bias = 0;
  j["mo"] = dwfl_module_getelf(mod, &bias) != nullptr ? address - bias : address - low;
  GElf_Off offset = 0;
  GElf_Sym sym;
  std::string symbol;
  if (const char* s = dwfl_module_addrinfo(mod, pc, &offset, &sym, nullptr, nullptr, nullptr)) {
    symbol = demangle(s);
    j["s"] = symbol;
    j["so"] = offset + (address - pc);
  }
  nlohmann::json locations = nlohmann::json::array();
  for (const auto& l : dwarfLocations(mod, pc, symbol))
    locations.push_back({l.function, l.file, l.line});
  j["l"] = std::move(locations);
  return j;
}

bool writeAll(int fd, const std::string& text) {
  return ddpl::writeAll(fd, text.data(), text.size()) == 0;
}

std::string jsonLine(const nlohmann::json& j) {
  // Paths and names are bytes, not necessarily UTF-8.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

char* debuginfoPath = nullptr;  // libdw's default search: beside the file, .debug/, /usr/lib/debug
const Dwfl_Callbacks kCallbacks = {dwfl_linux_proc_find_elf, dwfl_standard_find_debuginfo, nullptr,
                                   &debuginfoPath};

[[noreturn]] void runChild(int fd, const std::vector<uintptr_t>& addresses, pid_t parent) {
  // This copy must never outlive the process it serves, nor report errors as if it were it
  // (the parent's terminate handler writes the error file).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) std::_Exit(2);
  std::set_terminate([] { std::_Exit(3); });
  try {
    // The standard debuginfo search ends by asking debuginfod servers when DEBUGINFOD_URLS is
    // set: a network download of gigabytes for LibTorch. Local files only (this copy's own
    // environment; the process's is untouched).
    ::unsetenv("DEBUGINFOD_URLS");
    Dwfl* dwfl = dwfl_begin(&kCallbacks);
    if (dwfl == nullptr) {
      writeAll(fd, jsonLine({{"error", std::string("dwfl_begin: ") + dwfl_errmsg(-1)}}));
      std::_Exit(4);
    }
    dwfl_report_begin(dwfl);
    const int rc = dwfl_linux_proc_report(dwfl, ::getpid());  // same maps as the parent's
    if (rc != 0 || dwfl_report_end(dwfl, nullptr, nullptr) != 0) {
      writeAll(fd, jsonLine({{"error", std::string("reading /proc/self/maps: ") +
                                           (rc > 0 ? std::strerror(rc) : dwfl_errmsg(-1))}}));
      std::_Exit(4);
    }
    for (size_t i = 0; i < addresses.size(); ++i) {
      if (!writeAll(fd, jsonLine(resolveOne(dwfl, i, addresses[i])))) std::_Exit(5);
    }
    // No dwfl_end: the process ends here, and unmapping gigabytes of debug files is time spent.
  } catch (...) {
    std::_Exit(6);
  }
  std::_Exit(0);
}

// --- the process being reported ---------------------------------------------------------------

bool applyLine(const std::string& text, SymbolizedTrace& trace, std::string& error) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  if (j.contains("error") && j["error"].is_string()) {
    error = j["error"].get<std::string>();
    return true;
  }
  if (!j.contains("i") || !j["i"].is_number_unsigned()) return false;
  const size_t i = j["i"].get<size_t>();
  if (i >= trace.frames.size()) return false;
  SymbolizedFrame& f = trace.frames[i];
  f.resolved = true;
  if (j.contains("m") && j["m"].is_string()) f.module = j["m"].get<std::string>();
  if (j.contains("mo") && j["mo"].is_number_unsigned()) f.module_offset = j["mo"].get<uintptr_t>();
  if (j.contains("s") && j["s"].is_string()) f.symbol = j["s"].get<std::string>();
  if (j.contains("so") && j["so"].is_number_unsigned()) f.symbol_offset = j["so"].get<uintptr_t>();
  if (j.contains("l") && j["l"].is_array()) {
    for (const auto& l : j["l"]) {
      if (!l.is_array() || l.size() != 3 || !l[0].is_string() || !l[1].is_string() ||
          !l[2].is_number_integer())
        continue;
      f.locations.push_back({l[0].get<std::string>(), l[1].get<std::string>(), l[2].get<int>()});
    }
  }
  return true;
}

// What the dynamic loader knows (exported symbols and the module), as c10's backtrace shows it:
// the fallback for frames the lookup did not reach.
void describeFromLoader(SymbolizedFrame& f) {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(callSite(f.address)), &info) == 0) return;
  if (info.dli_fname != nullptr) f.module = info.dli_fname;
  f.module_offset = f.address - reinterpret_cast<uintptr_t>(info.dli_fbase);
  if (info.dli_sname != nullptr) {
    f.symbol = demangle(info.dli_sname);
    f.symbol_offset = f.address - reinterpret_cast<uintptr_t>(info.dli_saddr);
  }
}

// The copy exits right after its last frame; a killed one dies at once. Never block for long
// on it: a process stuck in the kernel must not hold the error report up.
void reap(pid_t child) {
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child || (r < 0 && errno != EINTR)) return;  // ECHILD: SIGCHLD ignored, reaped already
    if (Clock::now() > deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string indexText(size_t i) { return "#" + std::to_string(i); }

}  // namespace

__attribute__((noinline)) std::vector<uintptr_t> captureStack(size_t skip, size_t max_frames) {
  std::vector<void*> raw(max_frames + skip + 1);
  const int n = ::backtrace(raw.data(), static_cast<int>(raw.size()));
  std::vector<uintptr_t> out;
  for (int i = static_cast<int>(skip) + 1; i < n && out.size() < max_frames; ++i)  // +1: this frame
    out.push_back(reinterpret_cast<uintptr_t>(raw[i]));
  return out;
}

SymbolizedTrace symbolize(const std::vector<uintptr_t>& addresses,
                          const NativeTraceOptions& options) {
  SymbolizedTrace trace;
  for (uintptr_t a : addresses) trace.frames.push_back(SymbolizedFrame{a});
  if (addresses.empty() || !options.symbolize) {
    for (auto& f : trace.frames) describeFromLoader(f);
    return trace;
  }
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  std::string failure;
  int fds[2];
  pid_t child = -1;
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    failure = std::string("pipe: ") + std::strerror(errno);
  } else {
    const pid_t parent = ::getpid();
    child = ::fork();
    if (child == 0) {
      ::close(fds[0]);
      runChild(fds[1], addresses, parent);
    }
    ::close(fds[1]);
    if (child < 0) failure = std::string("fork: ") + std::strerror(errno);
  }
  size_t received = 0;
  bool timedOut = false;
  if (child > 0) {
    std::string buffer, childError;
    bool eof = false;
    while (!eof) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        timedOut = true;
        break;
      }
      pollfd p{fds[0], POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        failure = std::string("poll: ") + std::strerror(errno);
        break;
      }
      if (r == 0) continue;  // the deadline check above ends the loop
      char chunk[16384];
      const ssize_t n = ::read(fds[0], chunk, sizeof(chunk));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        eof = true;
        break;
      }
      buffer.append(chunk, static_cast<size_t>(n));
      size_t start_of_line = 0;
      for (size_t nl; (nl = buffer.find('\n', start_of_line)) != std::string::npos;
           start_of_line = nl + 1) {
        if (applyLine(buffer.substr(start_of_line, nl - start_of_line), trace, childError) &&
            childError.empty())
          ++received;
      }
      buffer.erase(0, start_of_line);
    }
    ::close(fds[0]);
    if (timedOut || !eof) ::kill(child, SIGKILL);
    reap(child);
    if (!childError.empty())
      failure = childError;
    else if (eof && received < addresses.size() && failure.empty())
      failure = "the symbolising process ended early";
  }
  size_t firstMissing = addresses.size();
  for (size_t i = 0; i < trace.frames.size(); ++i) {
    if (trace.frames[i].resolved) continue;
    describeFromLoader(trace.frames[i]);
    firstMissing = std::min(firstMissing, i);
  }
  if (firstMissing < addresses.size()) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    if (timedOut)
      trace.note = "symbolisation stopped after " + std::to_string(ms) + " ms (limit " +
                   std::to_string(options.timeout.count()) + " ms): frames from " +
                   indexText(firstMissing) + " on are as captured";
    else
      trace.note = "not symbolised from frame " + indexText(firstMissing) +
                   " on: " + (failure.empty() ? "no result" : failure);
  }
  return trace;
}

namespace {

std::string placeOf(const SymbolizedFrame& f) {
  return f.module.empty() ? hex(f.address) : f.module + " + " + hex(f.module_offset);
}

std::string atSource(const FrameLocation& l) {
  return l.file.empty() ? "" : " at " + l.file + ":" + std::to_string(l.line);
}

// One frame's lines; `label` is its "frame #N: " prefix.
std::string formatFrame(const std::string& label, const SymbolizedFrame& f) {
  if (!f.locations.empty()) {
    std::string s;
    for (size_t k = 0; k < f.locations.size(); ++k) {
      const FrameLocation& l = f.locations[k];
      const bool outermost = k + 1 == f.locations.size();
      std::string function = l.function;
      if (function.empty())
        function = outermost && !f.symbol.empty() ? f.symbol : "<unknown function>";
      if (k == 0)
        s += label + function + atSource(l) + " (" + placeOf(f) + ")\n";
      else
        s += "    inlined into " + function + atSource(l) + "\n";
    }
    return s;
  }
  if (!f.symbol.empty())
    return label + f.symbol + " + " + hex(f.symbol_offset) + " (" + placeOf(f) + ")\n";
  return label + "<unknown function> (" + placeOf(f) + ")\n";
}

std::string frameLabel(size_t number) { return "frame #" + std::to_string(number) + ": "; }

// "frame #N: ... (0xADDR in MODULE)": the number and the address, or false.
bool parseC10Frame(const std::string& line, size_t& number, uintptr_t& address) {
  static const std::string prefix = "frame #";
  if (line.compare(0, prefix.size(), prefix) != 0 || line.empty() || line.back() != ')')
    return false;
  char* end = nullptr;
  number = std::strtoul(line.c_str() + prefix.size(), &end, 10);
  if (end == line.c_str() + prefix.size() || *end != ':') return false;
  const size_t open = line.rfind(" (0x");
  if (open == std::string::npos) return false;
  const size_t in = line.find(" in ", open);
  if (in == std::string::npos) return false;
  const std::string digits = line.substr(open + 4, in - open - 4);
  if (digits.empty() || digits.size() > 16 ||
      digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return false;
  address = static_cast<uintptr_t>(std::strtoull(digits.c_str(), nullptr, 16));
  return address != 0;
}

}  // namespace

std::string formatTrace(const SymbolizedTrace& trace) {
  std::string s = trace.note.empty() ? "" : "(" + trace.note + ")\n";
  for (size_t i = 0; i < trace.frames.size(); ++i) s += formatFrame(frameLabel(i), trace.frames[i]);
  return s;
}

__attribute__((noinline)) std::string currentTrace(size_t skip, const NativeTraceOptions& options) {
  auto trace = formatTrace(symbolize(captureStack(skip + 1, options.max_frames), options));
  asm volatile("");  // not a tail call: this frame is the one captureStack skips
  return trace;
}

std::string symbolizeBacktraceText(const std::string& text, const NativeTraceOptions& options) {
  struct Line {
    std::string text;
    bool frame = false;
    size_t number = 0;
    size_t index = 0;  // into addresses
  };
  std::vector<Line> lines;
  std::vector<uintptr_t> addresses;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    Line l{text.substr(pos, nl - pos)};
    uintptr_t address = 0;
    if (addresses.size() < options.max_frames && parseC10Frame(l.text, l.number, address)) {
      l.frame = true;
      l.index = addresses.size();
      addresses.push_back(address);
    }
    lines.push_back(std::move(l));
    pos = nl + 1;
  }
  if (addresses.empty() || !options.symbolize) return text;
  const SymbolizedTrace trace = symbolize(addresses, options);
  std::string out = trace.note.empty() ? "" : "(" + trace.note + ")\n";
  for (const auto& l : lines) {
    const SymbolizedFrame* f = l.frame ? &trace.frames[l.index] : nullptr;
    // A frame that was not looked up, or that the lookup found in no module, keeps c10's line:
    // it names the module as the loader saw it then.
    if (f != nullptr && f->resolved && !f->module.empty())
      out += formatFrame(frameLabel(l.number), *f);
    else
      out += l.text + "\n";
  }
  return out;
}

}  // namespace ddpl::worker
