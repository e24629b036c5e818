#include "launch/cli/summary.hpp"

namespace ringattn {

Json summary_json(const RunSummary& s) {
  Json j = Json::object();
  visit_summary(s, [&](const char* key, Json value) {
    if (!value.is_null()) j[key] = std::move(value);
  });
  return j;
}

}  // namespace ringattn
