// The program's one seam for its tests (tests/cli, tests/cluster), read once at start-up by
// main() and handed to the jobs: TestSeam. Unset, nothing of it does anything, and no code of
// the runtime reads any of it.
//
// RINGATTN_TEST_NODES=ID,ID,...: a node id per rank, so that tests on one machine can place the
// hybrid's groups (--ulysses) on pretend nodes (runtime/session.hpp SessionOptions::pretend_nodes).
//
// A test hook: RINGATTN_TEST_RAISE=RANK:WHEN:SIGNAL makes rank RANK raise
// SIGNAL (STOP, KILL, TERM or INT) once, or hang until a signal ends it (SIGNAL = HANG; unlike a
// stopped process, mpirun cannot resume it with SIGCONT), at WHEN: a number N (when this rank has done N ring
// steps in all, counted over passes: with P ranks a forward pass has P steps, and its backward
// pass P more), or "write" (after this rank wrote its rows of the outputs, before they are
// renamed into place). It is how the tests make a rank die or stop answering at a known point.
// Unset, it does nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/mask/mask.hpp"
#include "ringattn/ringattn.hpp"
#include "runtime/shard_layout.hpp"

namespace ringattn {

class TestHook {
 public:
  static constexpr const char* kVariable = "RINGATTN_TEST_RAISE";

  // Reads the variable; throws ArgumentError naming it when it is malformed.
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

// A second test hook, for the tests of --check only: RINGATTN_TEST_FAULT=KIND makes the job
// compute something slightly wrong while --check judges it against the true inputs, mask and scale,
// so that the tests show the check fails (exit 3) on the errors it exists to catch:
//   output-element       adds 2^-13 to the first element of O at the last position (always sampled)
//   window-off-by-one    the job's window one key wider on the left (needs --window)
//   document-off-by-one  the job's first document boundary one position later (needs 2+ documents)
//   causal-diagonal      each row's own key taken out of its softmax (O and LSE), as a causal mask
//                        written j < i would compute (needs --causal)
//   softmax-scale        the job's scale times 1 + 2^-10
//   gqa-head             K and V heads 0 and 1 swapped in what the job computes (needs 2+ kv heads)
// Unset, nothing changes.
class TestFault {
 public:
  static constexpr const char* kVariable = "RINGATTN_TEST_FAULT";
  enum class Kind { none, output_element, window_off_by_one, document_off_by_one, causal_diagonal, softmax_scale, gqa_head };

  // Reads the variable; throws ArgumentError naming it when it is unknown.
  static TestFault from_environment();
  bool active() const { return kind_ != Kind::none; }

  // What the ring computes with: the job's spec, slightly wrong (ArgumentError when the fault
  // does not apply to the job). `head_dim` resolves the default scale.
  AttentionSpec ring_spec(const AttentionSpec& spec, int64_t head_dim, int64_t kv_heads) const;
  // K or V rows (B, rows, Hkv, D) as fed to the ring: true when they differ from `rows`, then in `faulty`.
  bool ring_rows(const std::vector<float>& rows, bool key_or_value, const kernels::AttentionDims& dims,
                 std::vector<float>& faulty) const;
  // The forward results as the check sees them, given this rank's true inputs (host fp32, rows at
  // `pos`): o (B, rows, H, D) and lse (B, H, rows) are changed in place.
  bool changes_outputs() const { return kind_ == Kind::output_element || kind_ == Kind::causal_diagonal; }
  void outputs(const ShardLayout& layout, int rank, const Mask& mask, const kernels::AttentionDims& dims,
               const float* q, const float* k, const float* v, std::vector<float>& o, std::vector<float>& lse) const;

 private:
  Kind kind_ = Kind::none;
};

// Everything above, read from the environment once.
struct TestSeam {
  TestHook hook;
  TestFault fault;
  std::vector<int> pretend_nodes;  // empty: the real ones

  // Throws ArgumentError naming the variable that is malformed.
  static TestSeam from_environment(int rank, int ranks);
};

}  // namespace ringattn
