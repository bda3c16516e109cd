#pragma once
// What the servers on civetweb (the metrics endpoint, the dashboard) share about starting and
// stopping it. Internal to web/'s servers.
#include <CivetServer.h>

#include <functional>
#include <string>

namespace ddpl::web {

// `host` ("" or null: every interface) as the numeric IPv4 address civetweb listens on; civetweb
// would call a name it cannot resolve an "invalid port spec". Throws ddpl::NetworkError
// "<who> cannot listen on <address>: cannot resolve '<host>' to an IPv4 address: ...".
std::string listenIpv4(const char* host, const std::string& who, const std::string& address);

// Runs `start`, which constructs a civetweb server with the callbacks given. civetweb says why it
// cannot listen only through its log callback, on the starting thread: a failure becomes
// ddpl::NetworkError "<who> cannot listen on <address>: <what civetweb logged>". Later log lines
// go to launch's log at debug level.
void startCivet(const std::string& who, const std::string& address,
                const std::function<void(const CivetCallbacks*)>& start);

// civetweb's listener thread polls in 2 s quanta and looks at its stop flag only between them:
// shutting the listening socket on `port` down wakes the poll, so that stopping a server takes
// milliseconds (measured on the metrics endpoint: 1.7 s -> 13 ms).
void wakeCivetListener(int port);

}  // namespace ddpl::web
