#include "launch/cli/options_util.hpp"

#include <boost/any.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>

#include "launch/cli/job_control.hpp"
#include "runtime/errors.hpp"
#include "runtime/ring_attention.hpp"
#include "runtime/ring_plan.hpp"

namespace po = boost::program_options;

namespace ringattn {

po::variables_map parse_options(const po::options_description& desc, const std::vector<std::string>& args,
                                const std::string& command) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw usage_error(std::string(e.what()) + " (see ringattn " + command + " --help)");
  }
  // An empty value (--out "$UNSET") would read as "not given" and be silently ignored.
  for (const auto& [name, value] : vm) {
    const po::option_description* option = desc.find_nothrow(name, false);
    const bool takes_value = option && option->semantic()->max_tokens() > 0;  // not a flag such as --help
    if (const auto* text = boost::any_cast<std::string>(&value.value());
        takes_value && text && text->empty() && !value.defaulted())
      throw usage_error("--" + name + " is given an empty value (see ringattn " + command + " --help)");
  }
  return vm;
}

DType parse_dtype_option(const std::string& name) {
  if (name == "fp32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  throw usage_error("--dtype " + name + ": expected fp32 or bf16");
}

std::vector<DType> parse_dtype_list(const std::string& text, const std::string& option) {
  std::vector<DType> types;
  std::stringstream ss(text);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t != "fp32" && t != "bf16") throw usage_error(option + ": '" + t + "' is not fp32 or bf16");
    types.push_back(t == "fp32" ? DType::f32 : DType::bf16);
  }
  return types;
}

SequenceLayout layout_spec(const std::string& name) {
  if (name.empty()) return SequenceLayout::automatic;
  switch (parse_layout(name)) {
    case LayoutKind::zigzag: return SequenceLayout::zigzag;
    case LayoutKind::striped: return SequenceLayout::striped;
    default: return SequenceLayout::contiguous;
  }
}

KeyValueSchedule schedule_spec(const std::string& name) {
  return parse_schedule(name) == Schedule::ring ? KeyValueSchedule::ring : KeyValueSchedule::direct;
}

AttentionKernel kernel_spec(const std::string& name) {
  switch (parse_kernel_choice(name)) {
    case KernelChoice::cudnn: return AttentionKernel::cudnn;
    case KernelChoice::own: return AttentionKernel::own;
    default: return AttentionKernel::automatic;
  }
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

std::optional<Difference> differs_from_rank0(comm::Communicator& comm, const std::string& lines) {
  uint64_t size = lines.size();
  comm.broadcast(&size, sizeof size, 0);
  std::string root(size, '\0');
  if (comm.rank() == 0) root = lines;
  comm.broadcast(root.data(), size, 0);
  if (root == lines) return std::nullopt;
  auto parse = [](const std::string& text) {
    std::map<std::string, std::string> m;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      m[line.substr(0, eq)] = eq == std::string::npos ? "" : line.substr(eq + 1);
    }
    return m;
  };
  const auto mine = parse(lines), theirs = parse(root);
  for (const auto& [name, value] : theirs) {
    auto it = mine.find(name);
    const std::string here = it == mine.end() ? "(not given)" : it->second;
    if (here != value) return Difference{name, value, here};
  }
  for (const auto& [name, value] : mine)
    if (!theirs.count(name)) return Difference{name, "(not given)", value};
  return Difference{"(order)", root, lines};  // same lines, another order: not from canonical_options
}

void agree_on_options(comm::Communicator& comm, const std::string& canonical) {
  const std::optional<Difference> d = differs_from_rank0(comm, canonical);
  if (!d) return;
  const std::string rank = std::to_string(comm.rank());
  if (d->on_rank0 == "(not given)")
    throw usage_error("the ranks were started with different options: --" + d->name + " is given on rank " + rank +
                     " but not on rank 0");
  if (d->here == "(not given)")
    throw usage_error("the ranks were started with different options: --" + d->name + " is given on rank 0 but not on rank " + rank);
  throw usage_error("the ranks were started with different options: --" + d->name + " is '" + d->on_rank0 +
                   "' on rank 0 but '" + d->here + "' on rank " + rank);
}

po::variables_map parse_and_agree(comm::Communicator& comm, const po::options_description& desc,
                                  const std::vector<std::string>& args, const std::string& command) {
  po::variables_map vm;
  agreed_phase(comm, [&] { vm = parse_options(desc, args, command); });
  agreed_phase(comm, [&] { agree_on_options(comm, canonical_options(vm)); });
  return vm;
}

void add_ring_options(po::options_description& desc, const RingOptionFields& f) {
  auto add = desc.add_options();
  if (f.layout)
    add("layout", po::value(f.layout)->value_name("contiguous|zigzag|striped"),
        "token sharding over ranks (default: zigzag when causal, else contiguous)");
  if (f.schedule)
    add("schedule", po::value(f.schedule)->default_value("direct")->value_name("direct|ring"),
        "direct: each rank's rows straight to the ranks that need them; ring: neighbour relay");
  if (f.dtype)
    add("dtype", po::value(f.dtype)->default_value("fp32")->value_name("fp32|bf16"),
        "storage and transfer type of Q, K, V (accumulation is fp32)");
  if (f.backend)
    add("backend", po::value(f.backend)->value_name("cpu|cuda"), "default: cuda when a GPU is visible, else cpu");
  if (f.comm)
    add("comm", po::value(f.comm)->value_name("mpi|nccl"),
        "default: nccl with the cuda backend when every rank of a node has its own GPU, else mpi");
  if (f.kernel)
    add("kernel", po::value(f.kernel)->default_value("auto")->value_name("auto|cudnn|own"),
        "CUDA backend: cuDNN's fused attention for the ring steps it can express (auto: where it can, "
        "our kernels for the rest; cudnn: refuse a job it cannot run), or our kernels only (own)");
  if (f.deterministic)
    add("deterministic", po::bool_switch(f.deterministic),
        "a bitwise-deterministic backward (cuDNN's where its workspace stays linear, else our kernels)");
  if (f.threads)
    add("threads", po::value(f.threads)->default_value(0)->value_name("N"),
        "CPU threads per rank (0 = the cores this rank may run on, at most the node's shared among its ranks)");
  if (f.timeout)
    add("timeout", po::value(f.timeout)->default_value(300.0)->value_name("SECONDS"),
        "end the job (exit 4) when a rank waits longer than this for a peer");
  if (f.emulate_bandwidth)
    add("emulate-bandwidth", po::value(f.emulate_bandwidth)->default_value(0.0)->value_name("GBPS"),
        "MPI: deliver transfers no sooner than a link of this bandwidth would (GB/s, 0 = off)");
  if (f.emulate_latency)
    add("emulate-latency", po::value(f.emulate_latency)->default_value(0.0)->value_name("US"),
        "MPI: add this latency to every transfer (microseconds)");
  if (f.iters)
    add("iters", po::value(f.iters)->default_value(*f.iters)->value_name("N"),
        "timed repetitions (the median is reported)");
  if (f.warmup)
    add("warmup", po::value(f.warmup)->default_value(*f.warmup)->value_name("N"), "untimed repetitions first");
}

void check_execution_options(const ExecutionOptions& v) {
  // (--threads, --timeout and the link emulation are the library's: api::check_options.)
  if (v.iters < 1) throw usage_error("--iters " + std::to_string(v.iters) + ": must be at least 1");
  if (v.warmup < 0) throw usage_error("--warmup " + std::to_string(v.warmup) + ": must not be negative");
}

void add_hybrid_options(po::options_description& desc, int* ulysses, double* emulate_intra_bandwidth,
                        double* emulate_intra_latency) {
  auto add = desc.add_options();
  if (ulysses)
    add("ulysses", po::value(ulysses)->default_value(1)->value_name("U"),
        "hybrid parallelism: groups of U consecutive ranks swap sequence for heads by all-to-all "
        "(DeepSpeed-Ulysses), the ring runs across the P/U groups (U divides P and the heads; 1 = ring only)");
  if (emulate_intra_bandwidth)
    add("emulate-intra-bandwidth", po::value(emulate_intra_bandwidth)->default_value(0.0)->value_name("GBPS"),
        "MPI, --ulysses > 1: the link inside a group (the all-to-all), as --emulate-bandwidth is the ring's "
        "link between groups (GB/s, 0 = off)");
  if (emulate_intra_latency)
    add("emulate-intra-latency", po::value(emulate_intra_latency)->default_value(0.0)->value_name("US"),
        "MPI, --ulysses > 1: latency of the link inside a group (microseconds)");
}

}  // namespace ringattn
