#include "launch/cli/test_seam.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>

#include <unistd.h>

#include "launch/cli/mask_options.hpp"
#include "runtime/api/arguments.hpp"
#include "runtime/errors.hpp"

namespace ringattn {

TestHook TestHook::from_environment(int rank) {
  TestHook hook;
  const char* value = std::getenv(kVariable);
  if (!value || !*value) return hook;
  const std::string text = value;
  const size_t a = text.find(':'), b = a == std::string::npos ? a : text.find(':', a + 1);
  auto bad = [&] {
    return usage_error(std::string(kVariable) + "=" + text + ": expected RANK:STEP:SIGNAL or RANK:write:SIGNAL, " +
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

TestFault TestFault::from_environment() {
  TestFault fault;
  const char* value = std::getenv(kVariable);
  if (!value || !*value) return fault;
  const std::string text = value;
  const std::pair<const char*, Kind> kinds[] = {
      {"output-element", Kind::output_element},   {"window-off-by-one", Kind::window_off_by_one},
      {"document-off-by-one", Kind::document_off_by_one}, {"causal-diagonal", Kind::causal_diagonal},
      {"softmax-scale", Kind::softmax_scale},     {"gqa-head", Kind::gqa_head}};
  for (const auto& [name, kind] : kinds)
    if (text == name) fault.kind_ = kind;
  if (!fault.active())
    throw usage_error(std::string(kVariable) + "=" + text + ": expected one of output-element, window-off-by-one, " +
                     "document-off-by-one, causal-diagonal, softmax-scale, gqa-head");
  return fault;
}

AttentionSpec TestFault::ring_spec(const AttentionSpec& spec, int64_t head_dim, int64_t kv_heads) const {
  AttentionSpec s = spec;
  auto needs = [&](bool ok, const char* what) {
    if (!ok) throw usage_error(std::string(kVariable) + ": the job needs " + what);
  };
  switch (kind_) {
    case Kind::window_off_by_one:
      needs(spec.mask.window_left >= 0, "a left window (--window)");
      ++s.mask.window_left;
      break;
    case Kind::document_off_by_one: {
      const std::vector<int64_t>& lengths = spec.mask.doc_lens;
      needs(lengths.size() >= 2 && lengths[1] >= 2, "two documents, the second of two positions or more");
      ++s.mask.doc_lens[0], --s.mask.doc_lens[1];
      break;
    }
    case Kind::causal_diagonal: needs(spec.mask.causal, "--causal"); break;
    case Kind::softmax_scale: s.softmax_scale = api::softmax_scale(spec, head_dim) * (1.0 + 1.0 / 1024.0); break;
    case Kind::gqa_head: needs(kv_heads >= 2, "--kv-heads 2 or more"); break;
    default: break;
  }
  return s;
}

bool TestFault::ring_rows(const std::vector<float>& rows, bool key_or_value, const kernels::AttentionDims& dims,
                          std::vector<float>& faulty) const {
  if (kind_ != Kind::gqa_head || !key_or_value) return false;
  faulty = rows;
  const size_t D = static_cast<size_t>(dims.head_dim), width = static_cast<size_t>(dims.kv_heads) * D;
  for (size_t row = 0; row < rows.size() / width; ++row)
    std::swap_ranges(&faulty[row * width], &faulty[row * width + D], &faulty[row * width + D]);
  return true;
}

void TestFault::outputs(const ShardLayout& layout, int rank, const Mask& mask, const kernels::AttentionDims& dims,
                        const float* q, const float* k, const float* v, std::vector<float>& o,
                        std::vector<float>& lse) const {
  const int64_t B = dims.batch, H = dims.heads, Hkv = dims.kv_heads, D = dims.head_dim, rows = layout.rows(rank);
  if (kind_ == Kind::output_element) {
    const ShardLayout::Location last = layout.locate(layout.seq_len() - 1);
    if (last.rank == rank) o[static_cast<size_t>(last.row * H * D)] += 1.0f / 8192.0f;
  }
  if (kind_ != Kind::causal_diagonal) return;
  // Take the diagonal term out of each row's softmax: with w = exp(s_ii - LSE), its share,
  // O' = (O - w v_i) / (1 - w) and LSE' = LSE + log(1 - w). Query i and key i share a rank and a row.
  const MaskView mv = mask.view();
  const std::vector<int64_t> pos = layout.positions(rank);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      if (!visible(mv, pos[static_cast<size_t>(i)], pos[static_cast<size_t>(i)])) continue;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / (H / Hkv);
        const float* qi = q + ((b * rows + i) * H + h) * D;
        const float* ki = k + ((b * rows + i) * Hkv + kvh) * D;
        const float* vi = v + ((b * rows + i) * Hkv + kvh) * D;
        float* oi = &o[static_cast<size_t>(((b * rows + i) * H + h) * D)];
        float& l = lse[static_cast<size_t>((b * H + h) * rows + i)];
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d) s += double(qi[d]) * double(ki[d]);
        const double w = std::exp(s * dims.scale - double(l));
        if (w >= 1.0 - 1e-6) continue;  // left alone: the check must fail on rows that see many keys
        for (int64_t d = 0; d < D; ++d) oi[d] = static_cast<float>((double(oi[d]) - w * double(vi[d])) / (1.0 - w));
        l = static_cast<float>(double(l) + std::log1p(-w));
      }
    }
}

TestSeam TestSeam::from_environment(int rank, int ranks) {
  TestSeam seam;
  seam.hook = TestHook::from_environment(rank);
  seam.fault = TestFault::from_environment();
  const char* pretend = std::getenv("RINGATTN_TEST_NODES");
  if (!pretend || !*pretend) return seam;
  const std::string what = std::string("RINGATTN_TEST_NODES=") + pretend;
  for (const char* c = pretend; *c;) {
    char* end = nullptr;
    const long id = std::strtol(c, &end, 10);
    if (end == c) throw usage_error(what + ": not a comma-separated list of node ids");
    seam.pretend_nodes.push_back(static_cast<int>(id));
    c = *end == ',' ? end + 1 : end;
  }
  if (seam.pretend_nodes.size() != size_t(ranks))
    throw usage_error(what + ": " + std::to_string(seam.pretend_nodes.size()) + " node ids for " +
                      std::to_string(ranks) + " ranks (one per rank)");
  return seam;
}

}  // namespace ringattn
