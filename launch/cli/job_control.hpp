// How a job ends when something goes wrong, on every rank (docs/reference.md "Exit codes").
//
// Work that involves no communication (parsing, validation, reading inputs, writing this rank's
// rows) runs in agreed phases: every rank runs the phase, then the ranks exchange their status;
// if any failed, rank 0 prints each distinct message once and every rank throws JobFailed with
// the same exit code, so all ranks end together and none waits on another. Errors inside
// communicating phases cannot be agreed on (a peer may be blocked in a transfer): the rank that
// sees one prints it and aborts the whole job (MPI_Abort) with the exit code.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "comm/communicator.hpp"

namespace ringattn {

// Already reported; carries the exit code every rank ends with.
class JobFailed : public std::exception {
 public:
  explicit JobFailed(int code) : code_(code) {}
  int code() const { return code_; }
  const char* what() const noexcept override { return "job failed"; }

 private:
  int code_;
};

// The exit code docs/reference.md assigns to an exception: 2 usage, 3 check, 4 fault.
int exit_code_of(const std::exception& e);

// Runs `phase` on every rank; if it throws on any rank, all ranks throw JobFailed after rank 0
// printed the messages.
void agreed_phase(comm::Communicator& comm, const std::function<void()>& phase);

// Prints "ringattn: error: <message>" (with the rank when there are several; nothing for a
// JobFailed, reported already) and ends every rank with the exception's exit code.
[[noreturn]] void fail_now(comm::Communicator& comm, const std::exception& e);

// The text to report for an exception: the library's argument names as flags
// (launch/cli/argument_names.hpp), out of memory in words.
std::string message_of(const std::exception& e);

// Prints an error line on stderr.
void print_error(const std::string& message);

}  // namespace ringattn
