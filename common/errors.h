#pragma once
// The small exception hierarchy used inside every ddplaunch library. On the wire these map
// to canonical gRPC status codes (see rendezvous/), never to a second status field.
#include <stdexcept>
#include <string>

namespace ddpl {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A blocking call ran past its deadline. Messages carry the numbers ("after 30s waiting
// for key 'x'; 3/8 joined").
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The store refused or failed an operation (missing key, compare-and-set conflict, ...).
class StoreError : public Error {
 public:
  using Error::Error;
};

// A peer or server could not be reached or the connection broke.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// A collective backend (NCCL, Gloo, MPI) failed.
class BackendError : public Error {
 public:
  using Error::Error;
};

// Input from a user or a peer is malformed or out of range.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Credentials missing or wrong.
class AuthError : public Error {
 public:
  using Error::Error;
};

// A bad flag or value from the person at the keyboard. Programs print what() and exit with
// kUsageExitCode. Not an Error: usage mistakes are caught apart from failures of the job.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kUsageExitCode = 2;

}  // namespace ddpl
