#pragma once
// launch's plugins: shared libraries beside the program (<bin>/../lib, where the build and the
// install put them) that only the jobs needing them load: gRPC's ~50 libraries (the embedded
// store, the multi-node backends) and prometheus-cpp with civetweb (the metrics endpoint, the
// dashboard). `launch --version` and a one-node job pay nothing for them. One loader for all.
//
// Errors cross a plugin's boundary as text, never as exceptions: each entry point takes an
// error buffer and returns null on failure; its caller turns that into an exception.
//
// Threads: any. A plugin is loaded once per process and never unloaded.
#include <string>
#include <utility>

namespace ddpl {

class Plugin {
 public:
  // <the running program's directory>/../lib/<file>.
  static std::string pathOf(const std::string& file);

  // Loads pathOf(file) at the first call; later calls return the same plugin, or throw the
  // same error without trying again. `what` names it for the user: ddpl::Error "cannot load
  // PATH (WHAT; rebuild with make build): <the loader's message>". A plugin that exports
  // ddpl_plugin_console writes its log lines through launch's console (log::writeThroughConsole).
  static Plugin& load(const std::string& file, const std::string& what);

  // Throws ddpl::Error "WHAT (PATH) lacks NAME: version mismatch?".
  void* symbol(const char* name) const;
  template <typename Fn>
  Fn function(const char* name) const {
    return reinterpret_cast<Fn>(symbol(name));
  }

  const std::string& path() const { return path_; }

 private:
  Plugin(void* handle, std::string path, std::string what)
      : handle_(handle), path_(std::move(path)), what_(std::move(what)) {}
  void* handle_;
  std::string path_, what_;
};

}  // namespace ddpl
