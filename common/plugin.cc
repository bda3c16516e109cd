#include "common/plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl {
namespace {

// What a plugin exports to write its log lines through launch's console (its live status line
// makes room for them): it is handed a function that runs one write as launch runs its own.
using ConsoleFn = void (*)(void (*)(void (*)(void*), void*));

struct Loaded {
  std::unique_ptr<Plugin> plugin;
  std::string error;
};

}  // namespace

std::string Plugin::pathOf(const std::string& file) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return file;
  std::string dir(exe, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/../lib/" + file;
}

Plugin& Plugin::load(const std::string& file, const std::string& what) {
  // One entry per plugin file the program names (two): bounded by the code, not by input.
  static std::mutex mu;
  static std::map<std::string, Loaded> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = loaded.try_emplace(file);
  Loaded& l = it->second;
  if (inserted) {
    std::string path = pathOf(file);
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      l.plugin.reset(new Plugin(h, path, what));
      if (auto* console = reinterpret_cast<ConsoleFn>(dlsym(h, "ddpl_plugin_console")))
        console([](void (*write)(void*), void* arg) {
          log::writeThroughConsole([&] { write(arg); });
        });
    } else {
      l.error = "cannot load " + path + " (" + what + "; rebuild with make build): " + dlerror();
    }
  }
  if (!l.plugin) throw Error(l.error);
  return *l.plugin;
}

void* Plugin::symbol(const char* name) const {
  void* s = dlsym(handle_, name);
  if (!s) throw Error(what_ + " (" + path_ + ") lacks " + name + ": version mismatch?");
  return s;
}

}  // namespace ddpl
