#include "launch/options_util.hpp"

#include <boost/any.hpp>
#include <cstdint>
#include <map>
#include <sstream>

#include "runtime/errors.hpp"

namespace po = boost::program_options;

namespace ringattn {

po::variables_map parse_options(const po::options_description& desc, const std::vector<std::string>& args,
                                const std::string& command) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (see ringattn " + command + " --help)");
  }
  return vm;
}

DType parse_dtype_option(const std::string& name) {
  if (name == "fp32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  throw UsageError("--dtype " + name + ": expected fp32 or bf16");
}

LayoutKind layout_option(const std::string& name, bool causal) {
  if (name.empty()) return causal ? LayoutKind::zigzag : LayoutKind::contiguous;
  return parse_layout(name);
}

namespace {
std::string any_to_string(const boost::any& a) {
  if (const auto* s = boost::any_cast<std::string>(&a)) return *s;
  if (const auto* b = boost::any_cast<bool>(&a)) return *b ? "true" : "false";
  if (const auto* i = boost::any_cast<int>(&a)) return std::to_string(*i);
  if (const auto* l = boost::any_cast<int64_t>(&a)) return std::to_string(*l);
  if (const auto* u = boost::any_cast<uint64_t>(&a)) return std::to_string(*u);
  if (const auto* d = boost::any_cast<double>(&a)) {
    std::ostringstream os;
    os.precision(17);
    os << *d;
    return os.str();
  }
  return "?";
}
}  // namespace

std::string canonical_options(const po::variables_map& vm) {
  std::string out;
  for (const auto& [name, value] : vm) out += name + "=" + any_to_string(value.value()) + "\n";
  return out;
}

void agree_on_options(comm::Communicator& comm, const std::string& canonical) {
  uint64_t size = canonical.size();
  comm.broadcast(&size, sizeof size, 0);
  std::string root(size, '\0');
  if (comm.rank() == 0) root = canonical;
  comm.broadcast(root.data(), size, 0);
  if (root == canonical) return;
  auto lines = [](const std::string& text) {
    std::map<std::string, std::string> m;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      m[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return m;
  };
  const auto mine = lines(canonical), theirs = lines(root);
  for (const auto& [name, value] : theirs) {
    auto it = mine.find(name);
    const std::string here = it == mine.end() ? "(not given)" : it->second;
    if (here != value)
      throw UsageError("the ranks were started with different options: --" + name + " is '" + value +
                       "' on rank 0 but '" + here + "' on rank " + std::to_string(comm.rank()));
  }
  for (const auto& [name, value] : mine)
    if (!theirs.count(name))
      throw UsageError("the ranks were started with different options: --" + name + " is given on rank " +
                       std::to_string(comm.rank()) + " but not on rank 0");
}

}  // namespace ringattn
