// sac_spectral::member_bmm(a, b): torch.bmm(a, b) for a: [M, n, k], b: [M, k, p] as one oneDNN
// batched matmul, through the entry ATen itself uses for its bf16 products (at::native::mkldnn_matmul,
// which reads row-major or transposed operands in place). Built by sac_spectral/core/onednn.py.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace at::native {
TORCH_API void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2, const Tensor& result, float beta, float alpha);
}

namespace {

at::Tensor member_bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "member_bmm: expected a [M, n, k] and b [M, k, p], got ", a.sizes(), " and ", b.sizes());
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  at::native::mkldnn_matmul(a, b, out, 0.0f, 1.0f);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sac_spectral, m) {
  m.def("member_bmm(Tensor a, Tensor b) -> Tensor", {at::Tag::flexible_layout});
}

TORCH_LIBRARY_IMPL(sac_spectral, CPU, m) {
  m.impl("member_bmm", member_bmm);
}
