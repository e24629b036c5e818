// `ringattn layer` end to end: the test writes small .npy files, runs the command under mpirun
// with 2 ranks, and compares what it wrote with the fp64 reference of the layer (lora_reference.hpp):
// Y, dX and the LoRA gradients, merged weights (and a run from them), a training step, bad input
// (exit code 2 and the message), and the demo's loss curve at 1 and 2 ranks; rotary embeddings and
// biases; the same layer from a safetensors checkpoint and a PEFT adapter folder, written back by
// --save-adapter and --merge-out FILE.safetensors; bad safetensors files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/runtime/lora/lora_reference.hpp"
#include "tests/support/test_util.hpp"
#include "runtime/lora/projection.hpp"
#include "runtime/lora/weights.hpp"
#include "runtime/io/npy.hpp"
#include "runtime/io/safetensors.hpp"
#include "runtime/io/safetensors_output.hpp"

namespace ringattn::testing {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_layer(int ranks, const std::string& args) {
  const std::string command = std::string(RINGATTN_MPIEXEC) + " -np " + std::to_string(ranks) + " " +
                              RINGATTN_MPIEXEC_FLAGS + " " + RINGATTN_EXE + " layer " + args + " 2>&1";
  CommandResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return run;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) run.output.append(buf, n);
  const int status = pclose(pipe);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// The loss column of the training table ("   step   loss   seconds").
std::vector<double> losses_of(const std::string& output) {
  std::vector<double> losses;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    int step = 0;
    double loss = 0, seconds = 0;
    if (line.empty() || line[0] == '#' || !(fields >> step >> loss >> seconds)) continue;
    losses.push_back(loss);
  }
  return losses;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

class LayerCli : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, L = 40, d = 64, H = 4, Hkv = 2, r = 4;
  static constexpr double kAlpha = 8.0;

  void SetUp() override {
    dir = fs::temp_directory_path() / ("ringattn_layer_cli_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "weights");
    mask.causal = true;
    ref.batch = B, ref.seq_len = L, ref.d_model = d, ref.heads = H, ref.kv_heads = Hkv;
    ref.scaling = kAlpha / double(r);
    ref.mask = mask.view();
    const int64_t D = d / H;
    const int64_t outs[4] = {H * D, Hkv * D, Hkv * D, d}, ins[4] = {d, d, d, H * D};
    for (int p = 0; p < 4; ++p) {  // LoRA on q, k, v; o has none (no files)
      RefProjection& pr = ref.proj[size_t(p)];
      pr.out = outs[p], pr.in = ins[p], pr.rank = p < 3 ? r : 0;
      const float w = float(1.0 / std::sqrt(double(pr.in)));
      pr.w0 = to_double(random_vector(size_t(pr.out * pr.in), 50 + 3 * p, w));
      pr.a = to_double(random_vector(size_t(pr.rank * pr.in), 51 + 3 * p, w));
      pr.b = to_double(random_vector(size_t(pr.out * pr.rank), 52 + 3 * p, 0.3f));
      write(dir / "weights" / weight_file_name(p, ProjectionPart::w0), {pr.out, pr.in}, pr.w0);
      if (pr.rank == 0) continue;
      write(dir / "weights" / weight_file_name(p, ProjectionPart::lora_a), {r, pr.in}, pr.a);
      write(dir / "weights" / weight_file_name(p, ProjectionPart::lora_b), {pr.out, r}, pr.b);
    }
    x = to_double(random_vector(size_t(B * L * d), 60));
    dy = to_double(random_vector(x.size(), 61));
    write(dir / "x.npy", {B, L, d}, x);
    write(dir / "dy.npy", {B, L, d}, dy);
  }
  void TearDown() override { fs::remove_all(dir); }

  static void write(const fs::path& path, const std::vector<int64_t>& shape, const std::vector<double>& data) {
    const std::vector<float> f = to_float(data);
    write_npy(path.string(), "test", shape, f.data());
  }
  std::vector<double> read(const fs::path& path, const std::vector<int64_t>& expected_shape) {
    std::vector<int64_t> shape;
    const std::vector<float> data = read_npy_float(path.string(), "test", &shape);
    EXPECT_EQ(shape, expected_shape) << path;
    return to_double(data);
  }
  void expect_close(const fs::path& path, const std::vector<int64_t>& shape, const std::vector<double>& want,
                    double tol = 2e-5) {
    const std::vector<double> got = read(path, shape);
    ASSERT_EQ(got.size(), want.size()) << path;
    EXPECT_LE(max_abs_diff(got, want), tol * std::max(1.0, max_abs(want))) << path;
  }
  // y.npy, grads/dx.npy and the LoRA gradients of q, k and v (rank r) in dir against the fp64
  // reference layer's y and backward.
  void expect_outputs_match_reference(const std::vector<double>& y) {
    const RefGrads g = reference_layer_backward(ref, x, dy);
    expect_close(dir / "y.npy", {B, L, d}, y);
    expect_close(dir / "grads" / "dx.npy", {B, L, d}, g.dx);
    for (int p = 0; p < 3; ++p) {
      const RefProjection& pr = ref.proj[size_t(p)];
      expect_close(dir / "grads" / weight_file_name(p, ProjectionPart::lora_a), {r, pr.in}, g.da[size_t(p)]);
      expect_close(dir / "grads" / weight_file_name(p, ProjectionPart::lora_b), {pr.out, r}, g.db[size_t(p)]);
    }
  }
  std::string files() const {
    return "--x " + (dir / "x.npy").string() + " --weights " + (dir / "weights").string() +
           " --heads 4 --kv-heads 2 --lora-alpha 8 --causal";
  }

  fs::path dir;
  Mask mask;
  RefLayer ref;
  std::vector<double> x, dy;
};

TEST_F(LayerCli, ForwardBackwardAndMergedWeightsMatchFp64) {
  const CommandResult run =
      run_layer(2, files() + " --dy " + (dir / "dy.npy").string() + " --out " + (dir / "y.npy").string() + " --grads " +
                       (dir / "grads").string() + " --merge-out " + (dir / "merged").string() + " --json " +
                       (dir / "summary.json").string());
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("on q,k,v"), std::string::npos) << run.output;
  const std::vector<double> y = reference_layer_forward(ref, x);
  expect_outputs_match_reference(y);
  EXPECT_FALSE(fs::exists(dir / "grads" / "lora_o_A.npy"));  // o has no LoRA
  for (int p = 0; p < 4; ++p)
    expect_close(dir / "merged" / weight_file_name(p, ProjectionPart::w0),
                 {ref.proj[size_t(p)].out, ref.proj[size_t(p)].in}, ref.effective(p), 1e-6);
  EXPECT_TRUE(fs::exists(dir / "summary.json"));

  // The merged weights alone (no LoRA files) give the same output.
  const CommandResult merged =
      run_layer(2, "--x " + (dir / "x.npy").string() + " --weights " + (dir / "merged").string() +
                       " --heads 4 --kv-heads 2 --causal --out " + (dir / "y_merged.npy").string());
  ASSERT_EQ(merged.code, 0) << merged.output;
  EXPECT_NE(merged.output.find("on none"), std::string::npos) << merged.output;
  expect_close(dir / "y_merged.npy", {B, L, d}, read(dir / "y.npy", {B, L, d}), 1e-5);

  // X of shape (L, d_model) is batch 1.
  const std::vector<double> x0(x.begin(), x.begin() + L * d);
  write(dir / "x0.npy", {L, d}, x0);
  const CommandResult single =
      run_layer(2, "--x " + (dir / "x0.npy").string() + " --weights " + (dir / "weights").string() +
                       " --heads 4 --kv-heads 2 --lora-alpha 8 --causal --out " + (dir / "y0.npy").string());
  ASSERT_EQ(single.code, 0) << single.output;
  RefLayer one = ref;
  one.batch = 1;
  expect_close(dir / "y0.npy", {L, d}, reference_layer_forward(one, x0));
}

// One SGD step from files; o has no LoRA files, so --lora-init gives it fresh factors (B = 0).
TEST_F(LayerCli, SgdStepFromFilesMatchesFp64) {
  const std::vector<double> target = to_double(random_vector(x.size(), 62, 0.5f));
  write(dir / "target.npy", {B, L, d}, target);
  const double lr = 0.5;
  const CommandResult run =
      run_layer(2, files() + " --target " + (dir / "target.npy").string() +
                       " --steps 1 --optimizer sgd --lr 0.5 --lora-init --lora-rank 4 --seed 3 --save-lora " +
                       (dir / "trained").string());
  ASSERT_EQ(run.code, 0) << run.output;
  RefProjection& o = ref.proj[3];  // the factors --lora-init draws, the same on any number of ranks
  ShardedProjection fresh(ProjectionShape{o.out, o.in, r}, 1, 0);
  init_lora_factors(fresh, 3, lora_init_stream(3));
  o.rank = r;
  o.a.assign(size_t(r * o.in), 0.0);
  o.b.assign(size_t(o.out * r), 0.0);
  fresh.for_each_owned(ProjectionPart::lora_a,
                       [&](int64_t i, int64_t j, size_t k) { o.a[size_t(i * o.in + j)] = fresh.lora()[k]; });
  const std::vector<double> y = reference_layer_forward(ref, x);
  std::vector<double> dy_mse(y.size());
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    loss += (y[i] - target[i]) * (y[i] - target[i]) / double(y.size());
    dy_mse[i] = 2.0 * (y[i] - target[i]) / double(y.size());
  }
  const std::vector<double> losses = losses_of(run.output);
  ASSERT_EQ(losses.size(), 1u) << run.output;
  EXPECT_NEAR(losses[0], loss, 1e-5 * loss);
  RefLayer trained = ref;
  reference_step(trained, reference_layer_backward(ref, x, dy_mse), RefOptimizer::sgd, lr);
  for (int p = 0; p < 4; ++p) {
    const RefProjection& pr = trained.proj[size_t(p)];
    expect_close(dir / "trained" / weight_file_name(p, ProjectionPart::lora_a), {r, pr.in}, pr.a, 1e-6);
    expect_close(dir / "trained" / weight_file_name(p, ProjectionPart::lora_b), {pr.out, r}, pr.b, 1e-6);
  }
}

TEST_F(LayerCli, BadInputExitsWithCode2AndNamesTheProblem) {
  struct Case {
    std::string args, message;
  };
  write(dir / "bad_wk.npy", {10, d}, std::vector<double>(size_t(10 * d), 0.0));
  fs::create_directories(dir / "bad");
  for (const char* f : {"wq.npy", "wv.npy", "wo.npy"}) fs::copy(dir / "weights" / f, dir / "bad" / f);
  fs::copy(dir / "bad_wk.npy", dir / "bad" / "wk.npy");
  fs::create_directories(dir / "unpaired");
  for (const char* f : {"wq.npy", "wk.npy", "wv.npy", "wo.npy", "lora_q_A.npy"})
    fs::copy(dir / "weights" / f, dir / "unpaired" / f);
  const std::string x_arg = "--x " + (dir / "x.npy").string();
  const std::vector<Case> cases = {
      {x_arg + " --weights " + (dir / "bad").string() + " --heads 4 --kv-heads 2",
       "wk.npy: shape (10, 64), expected (32, 64)"},
      {x_arg + " --weights " + (dir / "weights").string() + " --heads 5", "'s d_model 64 (the head dim is d_model / heads)"},
      {x_arg + " --weights " + (dir / "weights").string() + " --heads 4 --kv-heads 3",
       "--kv-heads 3 must divide --heads 4"},
      {x_arg + " --weights " + (dir / "weights").string() + " --heads 4 --kv-heads 2 --lora-rank 8",
       "lora_q_A.npy: shape (4, 64), expected (8, 64)"},
      {x_arg + " --weights " + (dir / "unpaired").string() + " --heads 4 --kv-heads 2", "lora_q_B.npy is missing"},
      {"--weights " + (dir / "weights").string(), "--x is required"},
      {files() + " --steps 2", "--steps needs a loss"},
      {files() + " --dy " + (dir / "bad_wk.npy").string(),
       "--dy " + (dir / "bad_wk.npy").string() + ": shape (10, 64)"},
      {files() + " --backend cpu --comm nccl", "--comm nccl needs --backend cuda"},
      {"--demo --check", "--check compares a pass of --x"},
  };
  for (const Case& c : cases) {
    const CommandResult run = run_layer(2, c.args);
    EXPECT_EQ(run.code, 2) << c.args << "\n" << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << run.output;
  }
}

// --check runs the pass again on the CPU backend in fp32: with bf16 GEMM operands and ring storage
// it passes (their rounding is within the bf16 tolerance) and says by how much; with an output
// file it writes it.
TEST_F(LayerCli, CheckComparesWithTheCpuInFp32) {
  const CommandResult run = run_layer(2, files() + " --dtype bf16 --rope-theta 1000 --dy " + (dir / "dy.npy").string() +
                                             " --check --out " + (dir / "y_checked.npy").string());
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("check     passed against the CPU backend in fp32: Y "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("dA/dB"), std::string::npos) << run.output;
  EXPECT_TRUE(fs::exists(dir / "y_checked.npy"));
}

// A float32 safetensors file of whole tensors.
void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                       const std::vector<const std::vector<double>*>& data) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, shape] : shapes) entries.push_back({name, shape});
  SafetensorsOutput out = SafetensorsOutput::create(path.string(), "test", entries, {{"format", "pt"}});
  const std::vector<int64_t> zero{0};
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::vector<float> f = to_float(*data[i]);
    out.write_rows(i, RowSelection{1, 1, int64_t(f.size()), zero}, f.data());
  }
  out.commit();
}

std::vector<double> read_tensor(const fs::path& path, const std::string& name, const std::vector<int64_t>& shape) {
  const SafetensorsInfo info = inspect_safetensors(path.string(), "test");
  const SafetensorsTensor& t = require_float_tensor(info, name, shape);
  std::vector<float> out(size_t(t.elements()));
  const std::vector<int64_t> zero{0};
  read_safetensors_rows(info, t, RowSelection{1, 1, t.elements(), zero}, out.data());
  return to_double(out);
}

// RoPE (interleaved, partial) with biases at 3 ranks, zigzag; then the same layer from a
// safetensors checkpoint + PEFT adapter, saved back as an adapter and merged weights.
TEST_F(LayerCli, RopeBiasesAndSafetensorsCheckpointsMatchFp64) {
  const std::string names[4] = {"q", "k", "v", "o"};
  for (int p = 0; p < 4; ++p) {
    ref.bias[size_t(p)] = to_double(random_vector(size_t(ref.proj[size_t(p)].out), 70 + p, 0.5f));
    write(dir / "weights" / ("b" + names[p] + ".npy"), {ref.proj[size_t(p)].out}, ref.bias[size_t(p)]);
  }
  ref.rope_theta = 500.0, ref.rope_interleaved = true, ref.rope_dims = 8;
  const std::string rope = " --rope-theta 500 --rope-interleaved --rope-dims 8 --layout zigzag";
  const CommandResult run = run_layer(3, files() + rope + " --dy " + (dir / "dy.npy").string() + " --out " +
                                             (dir / "y.npy").string() + " --grads " + (dir / "grads").string());
  ASSERT_EQ(run.code, 0) << run.output;
  const std::vector<double> y = reference_layer_forward(ref, x);
  expect_outputs_match_reference(y);

  // The same parameters as an HF checkpoint and a PEFT adapter (LoRA on q, k, v).
  const std::string prefix = "model.layers.3.self_attn.";
  std::vector<std::pair<std::string, std::vector<int64_t>>> base_shapes, lora_shapes;
  std::vector<const std::vector<double>*> base_data, lora_data;
  for (int p = 0; p < 4; ++p) {
    const RefProjection& pr = ref.proj[size_t(p)];
    base_shapes.push_back({prefix + names[p] + "_proj.weight", {pr.out, pr.in}});
    base_data.push_back(&pr.w0);
    base_shapes.push_back({prefix + names[p] + "_proj.bias", {pr.out}});
    base_data.push_back(&ref.bias[size_t(p)]);
    if (pr.rank == 0) continue;
    lora_shapes.push_back({"base_model.model." + prefix + names[p] + "_proj.lora_A.weight", {r, pr.in}});
    lora_data.push_back(&pr.a);
    lora_shapes.push_back({"base_model.model." + prefix + names[p] + "_proj.lora_B.weight", {pr.out, r}});
    lora_data.push_back(&pr.b);
  }
  write_safetensors(dir / "model.safetensors", base_shapes, base_data);
  fs::create_directories(dir / "adapter");
  write_safetensors(dir / "adapter" / "adapter_model.safetensors", lora_shapes, lora_data);
  {
    std::ofstream config(dir / "adapter" / "adapter_config.json");
    config << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": false,
                 "target_modules": ["v_proj", "q_proj", "k_proj"], "lora_dropout": 0.0, "bias": "none"})";
  }
  const std::string checkpoint = "--x " + (dir / "x.npy").string() + " --weights " +
                                 (dir / "model.safetensors").string() + " --weights-prefix " + prefix +
                                 " --adapter " + (dir / "adapter").string() + " --heads 4 --kv-heads 2 --causal" + rope;
  const CommandResult st = run_layer(2, checkpoint + " --out " + (dir / "y_st.npy").string() + " --save-adapter " +
                                            (dir / "saved").string() + " --merge-out " +
                                            (dir / "merged.safetensors").string());
  ASSERT_EQ(st.code, 0) << st.output;
  expect_close(dir / "y_st.npy", {B, L, d}, y);
  for (size_t i = 0; i < lora_shapes.size(); ++i)
    EXPECT_LE(max_abs_diff(read_tensor(dir / "saved" / "adapter_model.safetensors", lora_shapes[i].first,
                                       lora_shapes[i].second),
                           *lora_data[i]),
              1e-6)
        << lora_shapes[i].first;
  EXPECT_TRUE(fs::exists(dir / "saved" / "adapter_config.json"));
  for (int p = 0; p < 4; ++p) {
    const RefProjection& pr = ref.proj[size_t(p)];
    const std::vector<double> merged =
        read_tensor(dir / "merged.safetensors", prefix + names[p] + "_proj.weight", {pr.out, pr.in});
    EXPECT_LE(max_abs_diff(merged, ref.effective(p)), 1e-6 * std::max(1.0, max_abs(ref.effective(p)))) << names[p];
    EXPECT_LE(max_abs_diff(read_tensor(dir / "merged.safetensors", prefix + names[p] + "_proj.bias", {pr.out}),
                           ref.bias[size_t(p)]),
              1e-7)
        << names[p];
  }
  // The saved adapter loads again: the same Y.
  const CommandResult again = run_layer(
      1, "--x " + (dir / "x.npy").string() + " --weights " + (dir / "model.safetensors").string() +
             " --weights-prefix " + prefix + " --adapter " + (dir / "saved").string() +
             " --heads 4 --kv-heads 2 --causal" + rope + " --out " + (dir / "y_again.npy").string());
  ASSERT_EQ(again.code, 0) << again.output;
  expect_close(dir / "y_again.npy", {B, L, d}, y);

  // Bad checkpoints: exit 2, naming the file and the tensor.
  const std::string model = (dir / "model.safetensors").string();
  {
    std::ofstream config(dir / "config.json");
    config << R"({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "rope_theta": 500.0, "attention_bias": true})";
  }
  fs::remove(dir / "weights" / "bo.npy");
  const auto size = fs::file_size(model);
  fs::copy_file(model, dir / "truncated.safetensors");
  fs::resize_file(dir / "truncated.safetensors", size - 100);
  struct Case {
    std::string args, message;
  };
  const std::string x_arg = "--x " + (dir / "x.npy").string() + " --heads 4 --kv-heads 2 ";
  const std::vector<Case> cases = {
      {x_arg + "--weights " + (dir / "truncated.safetensors").string() + " --weights-prefix " + prefix,
       "truncated.safetensors: tensor \"" + prefix + "o_proj.bias\": data_offsets"},
      {x_arg + "--weights " + model + " --weights-prefix model.layers.9.self_attn.",
       "tensor \"model.layers.9.self_attn.q_proj.weight\" is missing"},
      {"--x " + (dir / "x.npy").string() + " --heads 4 --kv-heads 4 --weights " + model + " --weights-prefix " + prefix,
       "tensor \"" + prefix + "k_proj.weight\": shape (32, 64), expected (64, 64)"},
      {x_arg + "--weights " + model + " --weights-prefix " + prefix + " --adapter " + (dir / "adapter").string() +
           " --lora-alpha 3",
       "--lora-alpha: --adapter"},
      {x_arg + "--weights " + (dir / "weights").string() + " --rope-dims 6", "need --rope-theta"},
      {"--x " + (dir / "x.npy").string() + " --heads 8 --config " + (dir / "config.json").string() + " --weights " +
           (dir / "weights").string(),
       "--heads 8 contradicts --config " + (dir / "config.json").string() + " (num_attention_heads 4)"},
      {"--x " + (dir / "x.npy").string() + " --config " + (dir / "config.json").string() + " --weights " +
           (dir / "weights").string(),
       "attention_bias is true, but --weights has no bias for o_proj"},
      {x_arg + "--weights " + (dir / "weights").string() + " --rope-theta 100 --rope-per-document", "--doc-lens"},
  };
  for (const Case& c : cases) {
    const CommandResult bad = run_layer(2, c.args);
    EXPECT_EQ(bad.code, 2) << c.args << "\n" << bad.output;
    EXPECT_NE(bad.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << bad.output;
  }
}

TEST_F(LayerCli, DemoLossCurveIsTheSameAtOneAndTwoRanks) {
  const std::string args = "--demo --causal --seq-len 256 --d-model 64 --heads 4 --kv-heads 2 --steps 12";
  const CommandResult one = run_layer(1, args), two = run_layer(2, args);
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  const std::vector<double> a = losses_of(one.output), b = losses_of(two.output);
  ASSERT_EQ(a.size(), 12u) << one.output;
  ASSERT_EQ(b.size(), 12u) << two.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front());
}

}  // namespace
}  // namespace ringattn::testing
