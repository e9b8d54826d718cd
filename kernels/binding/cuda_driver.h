// The few CUDA driver API entry points the binding needs, opened with dlopen("libcuda.so.1") on the
// first CUDA call.
//
// Why not link libcuda / include cuda.h: the binding must build with no CUDA toolkit (only torch's
// headers) and must load into a CPU-only torch on a machine without a driver; the types below are the
// driver's stable C ABI (cuda.h), declared here for the handful of calls we make.
#ifndef FA_BINDING_CUDA_DRIVER_H_
#define FA_BINDING_CUDA_DRIVER_H_

#include <cstdint>
#include <string>

namespace fa_binding {

using CUresult = int;  // CUDA_SUCCESS == 0
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

constexpr int kFuncAttributeSharedSizeBytes = 1;            // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES (static)
// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned (cuda.h; hopper.cuh's device-side twin).
struct alignas(64) CUtensorMap {
  uint64_t opaque[16];
};

constexpr int kFuncAttributeMaxDynamicSharedSizeBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr int kDeviceAttributeMaxSharedMemoryPerBlockOptin = 97;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
constexpr int kJitErrorLogBuffer = 5;                       // CU_JIT_ERROR_LOG_BUFFER
constexpr int kJitErrorLogBufferSizeBytes = 6;              // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES

struct CudaDriver {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice device);
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuModuleLoadDataEx)(CUmodule* module, const void* image, unsigned int num_options,
                                 int* options, void** option_values);
  CUresult (*cuModuleGetFunction)(CUfunction* func, CUmodule module, const char* name);
  CUresult (*cuFuncSetAttribute)(CUfunction func, int attribute, int value);
  CUresult (*cuFuncGetAttribute)(int* value, int attribute, CUfunction func);
  CUresult (*cuCtxGetDevice)(CUdevice* device);
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                             unsigned int block_x, unsigned int block_y, unsigned int block_z,
                             unsigned int shared_mem_bytes, CUstream stream, void** kernel_params,
                             void** extra);
  CUresult (*cuGetErrorString)(CUresult error, const char** text);
  CUresult (*cuStreamIsCapturing)(CUstream stream, int* status);  // kStreamCaptureStatus*
  // CUDA 12.0+ drivers only; null on older ones (only the sm_90a units need it, and an H100's driver
  // has it). The enum arguments are ints, as in cuda.h (binding/tensor_maps.h has their values).
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap* map, int data_type, uint32_t rank, void* global_address,
                                     const uint64_t* global_dim, const uint64_t* global_strides,
                                     const uint32_t* box_dim, const uint32_t* element_strides, int interleave,
                                     int swizzle, int l2_promotion, int oob_fill);
};

constexpr int kStreamCaptureStatusNone = 0;  // CU_STREAM_CAPTURE_STATUS_NONE

// The driver, loaded and cuInit-ed once (thread-safe). Throws (check.h) with dlerror's text when
// libcuda.so.1 or one of the entry points is missing.
const CudaDriver& driver();

// "CUDA error 700 (an illegal memory access was encountered)" for error messages.
std::string error_text(CUresult result);

}  // namespace fa_binding

#endif  // FA_BINDING_CUDA_DRIVER_H_
