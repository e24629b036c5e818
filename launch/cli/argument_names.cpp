#include "launch/cli/argument_names.hpp"

#include <new>

#include "ringattn/errors.hpp"

namespace ringattn {

namespace {

// Arguments of the library (include/ringattn/ringattn.hpp, runtime/lora) and the flags that set
// them (docs/reference.md). A name spelled the same way in both needs no entry: it gets "--" and
// its underscores become dashes (lora_rank -> --lora-rank).
const std::map<std::string, std::string, std::less<>>& flags() {
  static const std::map<std::string, std::string, std::less<>> table = {
      {"softmax_scale", "--scale"},
      {"timeout_s", "--timeout"},
      {"emulate_bandwidth_gbps", "--emulate-bandwidth"},
      {"emulate_latency_us", "--emulate-latency"},
      {"emulate_intra_bandwidth_gbps", "--emulate-intra-bandwidth"},
      {"emulate_intra_latency_us", "--emulate-intra-latency"},
      {"rows", "the rows of a rank"},
      {"spec", "the mask and layout options"},
      {"options", "options"},
      {"pretend_nodes", "RINGATTN_TEST_NODES"},
  };
  return table;
}

const ArgumentNames* innermost = nullptr;

}  // namespace

ArgumentNames::ArgumentNames(std::map<std::string, std::string, std::less<>> names)
    : names_(std::move(names)), outer_(innermost) {
  innermost = this;
}

ArgumentNames::~ArgumentNames() { innermost = outer_; }

std::string flag_of(std::string_view argument) {
  for (const ArgumentNames* scope = innermost; scope; scope = scope->outer_)
    if (auto it = scope->names_.find(argument); it != scope->names_.end()) return it->second;
  if (auto it = flags().find(argument); it != flags().end()) return it->second;
  std::string flag = "--" + std::string(argument);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::string message_in_flags(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return std::string("out of memory: an allocation failed (") + e.what() + ")";
  if (const auto* a = dynamic_cast<const ArgumentError*>(&e)) return a->render(flag_of);
  // Other messages may carry labels in braces too (a file's read error names it as "{weights}").
  return ArgumentError::render_template(e.what(), flag_of);
}

}  // namespace ringattn
