// A test driver for the binding's shared launch logic (kernels/binding/launch.cpp), built with g++ and
// run without torch or a GPU: tests/runtime/test_launch_checks.py sends it one command per line and
// reads one answer per line ("ok ...", or "error <the binding's message>").
//   lse <lse_cuda 0|1> <lse_device> <q_device>   check_lse on a (1, 2, 4) LSE of a (1, 4, 2, 8) call
//   fold <batch> <heads> <limit>                 fold_batch_heads: "ok <y> <z>"
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "launch.h"

namespace fb = fa_binding;

namespace {

fb::View tensor(bool cuda, int device, fb::DType dtype, std::vector<int64_t> sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (int i = static_cast<int>(sizes.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * sizes[i + 1];
  static char storage[1 << 12];
  return fb::View{storage, dtype, cuda, cuda ? device : -1, sizes, strides, true};
}

std::string answer(const std::string& line) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  if (cmd == "lse") {
    int lse_cuda = 0, lse_device = 0, q_device = 0;
    in >> lse_cuda >> lse_device >> q_device;
    const fb::View q = tensor(true, q_device, fb::DType::kHalf, {1, 4, 2, 8});
    const fb::Options o{4, 4, 0.3, false, -1, -1, 0.0};
    const fb::Shape s = fb::check_shapes(q, q, q, nullptr, nullptr, fb::KvLayout{}, o);
    fb::check_lse(tensor(lse_cuda != 0, lse_device, fb::DType::kFloat, {1, 2, 4}), q, s);
    return "ok";
  }
  if (cmd == "fold") {
    int64_t batch = 0, heads = 0, limit = 0;
    in >> batch >> heads >> limit;
    const fb::PairGrid g = fb::fold_batch_heads(batch, heads, limit);
    return "ok " + std::to_string(g.y) + " " + std::to_string(g.z);
  }
  return "error unknown command " + cmd;
}

}  // namespace

int main() {
  for (std::string line; std::getline(std::cin, line);) {
    try {
      std::cout << answer(line) << std::endl;
    } catch (const std::exception& e) {
      std::cout << "error " << e.what() << std::endl;
    }
  }
  return 0;
}
