#include "launch/plan/cluster_file.hpp"

#include "runtime/errors.hpp"
#include "runtime/io/json_reader.hpp"

namespace ringattn {
namespace {

double non_negative(const JsonValue& j, const char* key, double fallback, const std::string& where) {
  const JsonValue* v = j.find(key);
  if (!v) return fallback;
  if (!v->is_number() || v->number() < 0)
    throw usage_error(where + ": \"" + key + "\" must be a non-negative number");
  return v->number();
}

}  // namespace

ClusterSpec read_cluster_file(const std::string& path, const std::string& flag) {
  const JsonValue j = read_json_file(path, flag);
  const std::string where = flag + " " + path;
  if (!j.is_object()) throw usage_error(where + ": expected a JSON object");
  ClusterSpec c;
  c.name = j.string_or("name", path);
  c.ranks_per_node = static_cast<int>(non_negative(j, "ranks_per_node", 1, where));
  c.intra = {non_negative(j, "intra_bandwidth_gbps", 0, where), non_negative(j, "intra_latency_us", 0, where)};
  c.inter = {non_negative(j, "inter_bandwidth_gbps", 0, where), non_negative(j, "inter_latency_us", 0, where)};
  c.inter_links = static_cast<int>(non_negative(j, "inter_links", 1, where));
  c.forward_gflops = non_negative(j, "forward_gflops", non_negative(j, "forward_tflops", 0, where) * 1e3, where);
  c.backward_gflops = non_negative(j, "backward_gflops", non_negative(j, "backward_tflops", 0, where) * 1e3, where);
  c.step_overhead_us = non_negative(j, "step_overhead_us", 0, where);
  c.message_overhead_us = non_negative(j, "message_overhead_us", 0, where);
  c.host_copy_gbps = non_negative(j, "host_copy_gbps", 0, where);
  c.memory_gib = non_negative(j, "memory_gib", 0, where);
  return c;
}

Json cluster_json(const ClusterSpec& c) {
  Json j = Json::object();
  j["name"] = c.name;
  j["ranks_per_node"] = c.ranks_per_node;
  j["intra_bandwidth_gbps"] = c.intra.gbps;
  j["intra_latency_us"] = c.intra.latency_us;
  j["inter_bandwidth_gbps"] = c.inter.gbps;
  j["inter_links"] = c.inter_links;
  j["inter_latency_us"] = c.inter.latency_us;
  j["forward_gflops"] = c.forward_gflops;
  j["backward_gflops"] = c.backward_gflops;
  j["step_overhead_us"] = c.step_overhead_us;
  j["message_overhead_us"] = c.message_overhead_us;
  j["host_copy_gbps"] = c.host_copy_gbps;
  j["memory_gib"] = c.memory_gib;
  return j;
}

}  // namespace ringattn
