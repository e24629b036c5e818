// launch/cli/summary.hpp: the one list of docs/reference.md's summary fields that the job, the layer and every
// point of the scaling benchmark write.
#include "launch/cli/summary.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ringattn {
namespace {

const std::vector<std::string> kSpecKeys = {
    "ranks", "batch", "seq_len", "heads", "kv_heads", "head_dim", "mask", "layout", "schedule", "dtype", "backend",
    "comm", "threads", "forward_s", "backward_s", "flops_forward", "gflops_per_rank", "comm_bytes_sent",
    "comm_bytes_needed", "exposed_comm_fraction", "nodes", "peak_rss_bytes", "max_abs_err"};

TEST(Summary, VisitsEverySpecKeyInOrderWithNullForWhatDidNotRun) {
  RunSummary s;
  std::vector<std::string> keys, nulls;
  visit_summary(s, [&](const char* key, const Json& value) {
    keys.push_back(key);
    if (value.is_null()) nulls.push_back(key);
  });
  EXPECT_EQ(keys, kSpecKeys);
  EXPECT_EQ(nulls, (std::vector<std::string>{"backward_s", "max_abs_err"}));
}

TEST(Summary, JsonLeavesOutWhatDidNotRun) {
  RunSummary s;
  s.ranks = 2, s.forward_s = 0.5, s.comm_bytes_sent = 1ull << 40, s.mask = "causal";
  Json j = summary_json(s);
  EXPECT_FALSE(j.contains("backward_s"));
  EXPECT_FALSE(j.contains("max_abs_err"));
  const std::string text = j.dump();
  EXPECT_NE(text.find("\"comm_bytes_sent\": 1099511627776"), std::string::npos) << text;
  EXPECT_NE(text.find("\"mask\": \"causal\""), std::string::npos) << text;
  s.backward_s = 1.25, s.max_abs_err = 0.0;
  j = summary_json(s);
  EXPECT_TRUE(j.contains("backward_s"));
  EXPECT_TRUE(j.contains("max_abs_err"));
}

TEST(Summary, RatePerRankIsGflopsPerRankAndZeroWhenUntimed) {
  EXPECT_DOUBLE_EQ(rate_per_rank(8e9, 2.0, 2), 2.0);
  EXPECT_DOUBLE_EQ(rate_per_rank(8e9, 0.0, 2), 0.0);
}

}  // namespace
}  // namespace ringattn
