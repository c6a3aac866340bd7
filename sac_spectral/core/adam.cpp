// The CPU kernel of sac_spectral::adam_ (the operator core/optim.py defines, with its composite
// form for other devices): the same step without the Python interpreter in the call, which a
// compiled program (inductor's C++ wrapper) otherwise enters for each optimizer step. Each step
// count is incremented in place, each gradient matched to its parameter's layout (the fused
// kernel walks a gradient's memory in its parameter's order), then torch's fused Adam/AdamW
// kernel runs. Built by sac_spectral/core/native.py.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

void adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
              at::TensorList steps, double lr, double beta1, double beta2, double eps, double weight_decay,
              bool decoupled) {
  std::vector<at::Tensor> matched;
  matched.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    matched.push_back(same_layout(params[i], grads[i]) ? grads[i] : at::empty_like(params[i]).copy_(grads[i]));
  }
  for (const at::Tensor& step : steps) {
    if (step.scalar_type() == at::kFloat && step.numel() == 1) {
      *step.data_ptr<float>() += 1.0f;
    } else {
      step.add_(1);
    }
  }
  if (decoupled) {
    at::_fused_adamw_(params, matched, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, weight_decay, eps, false, false);
  } else {
    at::_fused_adam_(params, matched, exp_avgs, exp_avg_sqs, {}, steps, lr, beta1, beta2, weight_decay, eps, false, false);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(sac_spectral, CPU, m) {
  m.impl("adam_", adam_cpu);
}
