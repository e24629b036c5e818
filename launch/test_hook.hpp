// A test hook, for tests/cli only: RINGATTN_TEST_RAISE=RANK:WHEN:SIGNAL makes rank RANK raise
// SIGNAL (STOP, KILL, TERM or INT) once, or hang until a signal ends it (SIGNAL = HANG; unlike a
// stopped process, mpirun cannot resume it with SIGCONT), at WHEN: a number N (when this rank has done N ring
// steps in all, counted over passes: with P ranks a forward pass has P steps, and its backward
// pass P more), or "write" (after this rank wrote its rows of the outputs, before they are
// renamed into place). It is how the tests make a rank die or stop answering at a known point.
// Unset, it does nothing.
#pragma once

#include <string>

namespace ringattn {

class TestHook {
 public:
  static constexpr const char* kVariable = "RINGATTN_TEST_RAISE";

  // Reads the variable; throws UsageError naming it when it is malformed.
  static TestHook from_environment(int rank);

  // Called after each ring step.
  void at_step() const {
    if (step_ > 0 && ++steps_done_ == step_) fire();
  }
  void at_write() const {
    if (at_write_) fire();
  }

 private:
  void fire() const;

  static constexpr int kHang = -1;
  int signal_ = 0;  // 0: the hook is off on this rank; kHang: hang
  int step_ = 0;
  bool at_write_ = false;
  mutable int steps_done_ = 0;
  mutable bool fired_ = false;
};

}  // namespace ringattn
