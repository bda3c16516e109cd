#include "web/civet_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

#include "common/errors.h"
#include "common/log.h"

namespace ddpl::web {
namespace {

// What civetweb logs while a server starts, on the starting thread (for its exception).
thread_local std::string* t_start_errors = nullptr;

int civetLog(const mg_connection*, const char* message) {
  if (t_start_errors) {
    if (!t_start_errors->empty()) *t_start_errors += "; ";
    *t_start_errors += message;
  } else {
    log::debug("civetweb: {}", message);
  }
  return 1;  // handled: civetweb must not print to stderr itself
}

}  // namespace

std::string listenIpv4(const char* host, const std::string& who, const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host, "0", &hints, &found); rc != 0)
    throw NetworkError(who + " cannot listen on " + address + ": cannot resolve '" +
                       (host ? host : "") + "' to an IPv4 address: " + gai_strerror(rc));
  char numeric[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, numeric,
            sizeof numeric);
  freeaddrinfo(found);
  return numeric;
}

void startCivet(const std::string& who, const std::string& address,
                const std::function<void(const CivetCallbacks*)>& start) {
  CivetCallbacks callbacks;
  callbacks.log_message = civetLog;
  std::string errors;
  t_start_errors = &errors;
  try {
    start(&callbacks);
  } catch (const std::exception& e) {
    t_start_errors = nullptr;
    throw NetworkError(who + " cannot listen on " + address + ": " +
                       (errors.empty() ? e.what() : errors));
  }
  t_start_errors = nullptr;
}

void wakeCivetListener(int port) {
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      int fd = std::atoi(e->d_name);
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      int listening = 0;
      socklen_t size = sizeof listening;
      if (fd <= 2 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
          address.ss_family != AF_INET ||
          ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port) != port ||
          getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening)
        continue;
      shutdown(fd, SHUT_RD);
    }
    closedir(d);
  }
}

}  // namespace ddpl::web
