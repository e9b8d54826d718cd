// Opening the CUDA driver at run time (see cuda_driver.h for why it is not linked).
#include "cuda_driver.h"

#include "check.h"
#include "dynlib.h"

namespace fa_binding {
namespace {

template <typename Fn>
void resolve(void* lib, const char* name, Fn*& slot) {
  slot = reinterpret_cast<Fn*>(dynlib::symbol(lib, name));
  FA_CHECK(slot != nullptr, "the CUDA driver (", dynlib::kCudaDriver, ") lacks ", name,
           "; update the NVIDIA driver");
}

CudaDriver load() {
  std::string why;
  void* lib = dynlib::open_driver(why);
  if (lib == nullptr) {
    fail("cannot load the CUDA driver ", dynlib::kCudaDriver, " (", why, "); ", dynlib::kDriverHint);
  }
  CudaDriver d{};
  resolve(lib, "cuInit", d.cuInit);
  resolve(lib, "cuDeviceGet", d.cuDeviceGet);
  resolve(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
  resolve(lib, "cuCtxGetCurrent", d.cuCtxGetCurrent);
  resolve(lib, "cuCtxSetCurrent", d.cuCtxSetCurrent);
  resolve(lib, "cuModuleLoadDataEx", d.cuModuleLoadDataEx);
  resolve(lib, "cuModuleGetFunction", d.cuModuleGetFunction);
  resolve(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute);
  resolve(lib, "cuFuncGetAttribute", d.cuFuncGetAttribute);
  resolve(lib, "cuCtxGetDevice", d.cuCtxGetDevice);
  resolve(lib, "cuDeviceGetAttribute", d.cuDeviceGetAttribute);
  resolve(lib, "cuLaunchKernel", d.cuLaunchKernel);
  resolve(lib, "cuGetErrorString", d.cuGetErrorString);
  resolve(lib, "cuStreamIsCapturing", d.cuStreamIsCapturing);
  d.cuTensorMapEncodeTiled =
      reinterpret_cast<decltype(d.cuTensorMapEncodeTiled)>(dynlib::symbol(lib, "cuTensorMapEncodeTiled"));
  const CUresult init = d.cuInit(0);
  FA_CHECK(init == 0, "cuInit failed: CUDA error ", init);
  return d;  // the library stays open for the life of the process, like torch's own handle
}

}  // namespace

const CudaDriver& driver() {
  // A function-local static initialises once even with concurrent first calls, and retries on the
  // next call if load() threw.
  static const CudaDriver d = load();
  return d;
}

std::string error_text(CUresult result) {
  const char* text = nullptr;
  if (driver().cuGetErrorString(result, &text) != 0 || text == nullptr) {
    text = "unknown error";
  }
  return "CUDA error " + std::to_string(result) + " (" + text + ")";
}

}  // namespace fa_binding
