// The exit codes of docs/reference.md and the one error kind the runtime adds to the public ones
// (include/ringattn/errors.hpp: ArgumentError exits 2, Fault 4).
#pragma once

#include <stdexcept>
#include <string>

#include "ringattn/errors.hpp"

namespace ringattn {

enum ExitCode : int { kExitOk = 0, kExitUsage = 2, kExitCheckFailed = 3, kExitFault = 4 };

// A bad argument or input described by a message that begins with its name: a flag or a file the
// caller named with the label it gave ("--q /data/q.npy: not a .npy file"), or an argument in
// braces for each interface to name in its words ("{weights} /data/w: not a directory").
inline ArgumentError usage_error(const std::string& message) {
  std::string argument = message.substr(0, message.find_first_of(" :="));
  if (argument.size() > 2 && argument.front() == '{' && argument.back() == '}')
    argument = argument.substr(1, argument.size() - 2);
  return ArgumentError(argument, message);
}

// A --check comparison against the fp64 reference failed (exit 3).
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ringattn
