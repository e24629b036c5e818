// kernels/cudnn/sdpa_engine.hpp in a CUDA build without cudnn-frontend's headers: no engine.
#include "kernels/cudnn/sdpa_engine.hpp"

namespace ringattn::kernels::cudnn {
namespace {

constexpr const char* kWhy = "cuDNN's fused attention is not built in (no cudnn-frontend headers: run launch/setup.sh)";

class NoEngine final : public SdpaEngine {
 public:
  int version() const override { return 0; }
  std::string describe() const override { return kWhy; }
  int sm_version() const override { return 0; }
  bool prepare(const SdpaGraphShape&, std::string* why) override {
    if (why) *why = kWhy;
    return false;
  }
  size_t workspace_bytes(const SdpaGraphShape&) const override { return 0; }
  void run_forward(const SdpaGraphShape&, const SdpaForwardArgs&) override {}
  void run_backward(const SdpaGraphShape&, const SdpaBackwardArgs&) override {}
};

}  // namespace

std::unique_ptr<SdpaEngine> make_sdpa_engine() { return std::make_unique<NoEngine>(); }
std::string validate_graph_offline(const SdpaGraphShape&, int, int) { return kWhy; }

}  // namespace ringattn::kernels::cudnn
