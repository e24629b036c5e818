// The command line's one table from the library's argument names to its flags. The runtime names
// arguments in its own words inside ArgumentError's message templates ("{kv_heads} 3 must divide
// {heads} 8", include/ringattn/errors.hpp); every message the program prints goes through this
// table, so a user of the command line reads "--kv-heads 3 must divide --heads 8".
#pragma once

#include <exception>
#include <map>
#include <string>
#include <string_view>

namespace ringattn {

// The flag of a library argument ("kv_heads" -> "--kv-heads"); an argument the command line has
// no flag for is named as the library names it.
std::string flag_of(std::string_view argument);

// While alive, some arguments read otherwise (a job whose shapes come from its input files says
// "the heads of --q q.npy", not "--heads"). Scopes nest; the innermost wins.
class ArgumentNames {
 public:
  explicit ArgumentNames(std::map<std::string, std::string, std::less<>> names);
  ~ArgumentNames();
  ArgumentNames(const ArgumentNames&) = delete;
  ArgumentNames& operator=(const ArgumentNames&) = delete;

 private:
  friend std::string flag_of(std::string_view argument);
  std::map<std::string, std::string, std::less<>> names_;
  const ArgumentNames* outer_;
};

// What the program prints for an exception: its message with the library's argument names
// written as flags.
std::string message_in_flags(const std::exception& e);

}  // namespace ringattn
