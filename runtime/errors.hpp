// The error kinds of the runtime, each with its exit code (SPEC.md "Exit codes").
#pragma once

#include <stdexcept>
#include <string>

namespace ringattn {

enum ExitCode : int { kExitOk = 0, kExitUsage = 2, kExitCheckFailed = 3, kExitFault = 4 };

// Bad usage or bad input; the message names the option or file and what is wrong.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A --check comparison against the fp64 reference failed.
class CheckFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A fault at run time that is not the user's input: I/O error, device error.
// (Communication faults are comm::CommError; both end the job with exit code 4.)
class RuntimeFault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ringattn
