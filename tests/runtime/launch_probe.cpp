// A test driver for the binding's shared launch logic (kernels/binding/launch.cpp), built with g++ and
// run without torch or a GPU: tests/runtime/test_launch_checks.py sends it one command per line and
// reads one answer per line ("ok ...", or "error <the binding's message>").
//   lse <lse_cuda 0|1> <lse_device> <q_device>   check_lse on a (1, 2, 4) LSE of a (1, 4, 2, 8) call
//   fold <batch> <heads> <limit>                 fold_batch_heads: "ok <y> <z>"
//   launch <capturing 0|1> <batch> <module>      launch_all of one entry on a (batch, 2 heads, 10 rows)
//                                                problem through the fake driver (fake_libcuda.c, found
//                                                as libcuda.so.1 on LD_LIBRARY_PATH), then its counts:
//                                                "ok|error ... | loads <n> functions <n> launches <n>"
//   smem <static> <optin> <dynamic> <module>     launch_all of an entry asking <dynamic> bytes, the fake
//                                                driver reporting <static> and the GPU's <optin>
#include <dlfcn.h>

#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cuda_driver.h"
#include "launch.h"

namespace fb = fa_binding;

// torch's C shim entry point the binding resolves at run time (launch.cpp current_stream).
extern "C" int32_t aoti_torch_get_current_cuda_stream(int32_t, void** stream) {
  *stream = nullptr;
  return 0;
}

namespace {

void* fake_driver() {
  fb::driver();  // dlopen()s libcuda.so.1 (RTLD_LOCAL): find the same handle again
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) throw std::runtime_error("the fake libcuda.so.1 is not loaded");
  return lib;
}

std::string counts() {
  int n[3] = {0, 0, 0};
  reinterpret_cast<void (*)(int*)>(dlsym(fake_driver(), "fake_counts"))(n);
  return " | loads " + std::to_string(n[0]) + " functions " + std::to_string(n[1]) + " launches " +
         std::to_string(n[2]);
}

std::string launch_one(int batch, const std::string& module, int smem_bytes);

std::string launch(std::istringstream& in) {
  int capturing = 0, batch = 0;
  std::string module;
  in >> capturing >> batch >> module;
  reinterpret_cast<int (*)(int)>(dlsym(fake_driver(), "fake_set_capturing"))(capturing);
  return launch_one(batch, module, 0);
}

std::string smem(std::istringstream& in) {
  int static_bytes = 0, optin = 0, dynamic = 0;
  std::string module;
  in >> static_bytes >> optin >> dynamic >> module;
  reinterpret_cast<void (*)(int, int)>(dlsym(fake_driver(), "fake_set_smem"))(static_bytes, optin);
  return launch_one(1, module, dynamic);
}

std::string launch_one(int batch, const std::string& module, int smem_bytes) {
  FaParams p;
  std::memset(&p, 0, sizeof(p));
  p.batch = batch;
  p.heads = p.heads_k = 2;
  p.seqlen_q = p.seqlen_k = 10;
  const fb::Launch l{module, 64, {fb::Entry{"fa_fwd", 128, 64, 64, smem_bytes, 0}}};
  try {
    fb::launch_all(p, l, 0);
  } catch (const std::exception& e) {
    return std::string("error ") + e.what() + counts();
  }
  return "ok" + counts();
}

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
  if (cmd == "launch") return launch(in);
  if (cmd == "smem") return smem(in);
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
