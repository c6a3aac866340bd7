// The CPU kernel of sac_spectral::member_bmm(a, b) (defined in sac_spectral/core/onednn.py):
// torch.bmm(a, b) for a: [M, n, k], b: [M, k, p] as one oneDNN batched matmul, through the entry
// ATen itself uses for its bf16 products (at::native::mkldnn_matmul, which reads row-major or
// transposed operands in place). Built by sac_spectral/core/native.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>

namespace at::native {
TORCH_API void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2, const Tensor& result, float beta, float alpha);
}

namespace {

// A size-1 dimension's stride is free (an operand of one member, a one-column head): give a dense
// row-major or transposed operand the strides mkldnn_matmul expects of that layout, which it then
// reads in place instead of copying.
at::Tensor dense_strides(const at::Tensor& t) {
  const int64_t rows = t.size(1), cols = t.size(2);
  for (const std::array<int64_t, 3>& dense : {std::array<int64_t, 3>{rows * cols, cols, 1},
                                              std::array<int64_t, 3>{rows * cols, 1, rows}}) {
    bool same = true, exact = true;
    for (int64_t d = 0; d < 3; ++d) {
      if (t.stride(d) != dense[d]) {
        exact = false;
        same = same && t.size(d) == 1;
      }
    }
    if (same) return exact ? t : t.as_strided(t.sizes(), dense);
  }
  return t;
}

bool shared(const at::Tensor& t) { return t.size(0) > 1 && t.stride(0) == 0; }

// An operand that all members share (a batch dimension expanded with stride 0, the critics' common
// input) is passed as its one member: oneDNN broadcasts it over the other operand's members,
// where mkldnn_matmul would copy the expanded tensor first.
at::Tensor one_if_shared(const at::Tensor& t, const at::Tensor& other) {
  return shared(t) && !shared(other) ? t.narrow(0, 0, 1) : t;
}

at::Tensor member_bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "member_bmm: expected a [M, n, k] and b [M, k, p], got ", a.sizes(), " and ", b.sizes());
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
  at::native::mkldnn_matmul(dense_strides(one_if_shared(a, b)), dense_strides(one_if_shared(b, a)), out, 0.0f, 1.0f);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sac_spectral, CPU, m) {
  m.impl("member_bmm", member_bmm);
}
