// Test fixture: the smallest binding that registers an op, so tests can check that a library built
// against torch headers with stub-linked torch libraries loads and registers under the real torch.
#include <torch/library.h>
#include <ATen/core/Tensor.h>

#include "params.h"

namespace {
at::Tensor params_size(const at::Tensor& x) {
  // Touch FaParams so the shared header is really compiled on the host side too.
  return x.new_full({1}, static_cast<double>(sizeof(FaParams)));
}
}  // namespace

TORCH_LIBRARY(fa_fixture, m) {
  m.def("params_size(Tensor x) -> Tensor");
  m.impl("params_size", c10::DispatchKey::CPU, &params_size);
}
