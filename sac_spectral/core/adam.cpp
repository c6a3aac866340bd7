// The CPU kernel of sac_spectral::adam_ (the operator core/optim.py defines, with its composite
// form for other devices): the same step without the Python interpreter in the call, which a
// compiled program (inductor's C++ wrapper) otherwise enters for each optimizer step. The sizes are
// checked first (one tensor per parameter in each list, of its parameter's shape: the composite
// form's check), each step count is incremented in place, each gradient matched to its parameter's
// layout (the fused kernel walks a gradient's memory in its parameter's order), then torch's fused
// Adam/AdamW kernel runs. Built by sac_spectral/core/native.py.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

void check_sizes(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList steps) {
  const std::pair<const char*, at::TensorList> lists[] = {
      {"gradients", grads}, {"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}, {"steps", steps}};
  for (const auto& [name, tensors] : lists) {
    TORCH_CHECK_VALUE(tensors.size() == params.size(), "sac_spectral::adam_: ", tensors.size(), " ", name, " for ",
                      params.size(), " parameters");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto shape = params[i].sizes();
    TORCH_CHECK_VALUE(grads[i].sizes() == shape && exp_avgs[i].sizes() == shape && exp_avg_sqs[i].sizes() == shape &&
                          steps[i].numel() == 1,
                      "sac_spectral::adam_: parameter ", i, " of shape ", shape, " has gradient ", grads[i].sizes(),
                      ", exp_avg ", exp_avgs[i].sizes(), ", exp_avg_sq ", exp_avg_sqs[i].sizes(), " and step ",
                      steps[i].sizes());
  }
}

void adam_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
              at::TensorList steps, double lr, double beta1, double beta2, double eps, double weight_decay,
              bool decoupled) {
  check_sizes(params, grads, exp_avgs, exp_avg_sqs, steps);
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
