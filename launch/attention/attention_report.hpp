// What the attention job reports (rank 0): the one-screen summary and the JSON of docs/reference.md.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "launch/attention/attention_options.hpp"
#include "launch/cli/json.hpp"
#include "runtime/check.hpp"

namespace ringattn {

// The job's measurements, already reduced over ranks.
struct AttentionResults {
  int ranks = 1, nodes = 1;
  const char* backend = "cpu";  // the backend's name
  std::string mask, layout;     // as the plan resolved them
  std::vector<double> forward_s, backward_s;  // per timed repetition, the slowest rank's
  double exposed_mean = 0.0;  // time waiting for data / forward time: summed over repetitions, mean over ranks
  double exposed_max = 0.0;   // the largest of one rank in one repetition
  uint64_t bytes_sent = 0, bytes_needed = 0, a2a_bytes_sent = 0;  // forward, summed over ranks
  double flops = 0.0;  // forward, counted as docs/reference.md says
  // Which kernels ran the ring steps of the last timed forward and backward, summed over ranks,
  // and the cuDNN the backend loaded ("" on the CPU).
  int64_t cudnn_steps = 0, own_steps = 0;
  std::string cudnn;
  uint64_t peak_rss = 0;
  std::optional<CheckReport> check;
  std::optional<Json> auto_choice;  // --auto: the candidates' predicted times and the choice
};

// Writes --json and prints the summary. Returns the exit code (a --json that cannot be written is
// its error's).
int report_attention(const Job& job, const AttentionResults& r);

}  // namespace ringattn
