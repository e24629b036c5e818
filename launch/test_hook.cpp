#include "launch/test_hook.hpp"

#include <csignal>
#include <cstdlib>

#include <unistd.h>

#include "launch/mask_options.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

TestHook TestHook::from_environment(int rank) {
  TestHook hook;
  const char* value = std::getenv(kVariable);
  if (!value || !*value) return hook;
  const std::string text = value;
  const size_t a = text.find(':'), b = a == std::string::npos ? a : text.find(':', a + 1);
  auto bad = [&] {
    return UsageError(std::string(kVariable) + "=" + text + ": expected RANK:STEP:SIGNAL or RANK:write:SIGNAL, " +
                      "SIGNAL one of STOP, KILL, TERM, INT, HANG");
  };
  if (b == std::string::npos) throw bad();
  const std::string when = text.substr(a + 1, b - a - 1), name = text.substr(b + 1);
  const int target = static_cast<int>(parse_int_list(text.substr(0, a), kVariable, 1)[0]);
  const int sig = name == "STOP"   ? SIGSTOP
                  : name == "KILL" ? SIGKILL
                  : name == "TERM" ? SIGTERM
                  : name == "INT"  ? SIGINT
                  : name == "HANG" ? kHang
                                   : 0;
  if (!sig) throw bad();
  if (when == "write") {
    hook.at_write_ = true;
  } else {
    hook.step_ = static_cast<int>(parse_int_list(when, kVariable, 1)[0]);
    if (hook.step_ < 1) throw bad();
  }
  if (target == rank) hook.signal_ = sig;
  else hook = TestHook{};
  return hook;
}

void TestHook::fire() const {
  if (!signal_ || fired_) return;
  fired_ = true;
  if (signal_ != kHang) {
    std::raise(signal_);
    return;
  }
  for (;;) pause();  // a terminating signal ends the process (launch/main.cpp); SIGCONT does not
}

}  // namespace ringattn
