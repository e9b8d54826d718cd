/* A stand-in for libcuda.so.1 for tests/runtime/launch_probe.cpp: every entry point the binding resolves
 * (kernels/binding/cuda_driver.cpp), answering like the driver and counting module loads, function
 * lookups and launches. fake_set_capturing(1) makes every stream report an active graph capture. */
#include <stdint.h>

static int capturing, loads, functions, launches;
/* What cuFuncGetAttribute(SHARED_SIZE_BYTES) and cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
 * answer: ptxas's 1 KiB of static shared memory and an A100's 163 KiB until fake_set_smem changes them. */
static int static_smem = 1024, optin_smem = 163 * 1024;

int fake_set_capturing(int on) { return capturing = on; }
void fake_set_smem(int static_bytes, int optin_bytes) {
  static_smem = static_bytes;
  optin_smem = optin_bytes;
}
void fake_counts(int* out) {
  out[0] = loads;
  out[1] = functions;
  out[2] = launches;
}

int cuInit(unsigned flags) { return (int)flags * 0; }
int cuDeviceGet(int* device, int ordinal) { *device = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int device) { *ctx = (void*)(uintptr_t)(0xC0 + device); return 0; }
static void* current;
int cuCtxGetCurrent(void** ctx) { *ctx = current; return 0; }
int cuCtxSetCurrent(void* ctx) { current = ctx; return 0; }
int cuModuleLoadDataEx(void** module, const void* image, unsigned n, int* options, void** values) {
  (void)image, (void)n, (void)options, (void)values;
  *module = (void*)0x30;
  ++loads;
  return 0;
}
int cuModuleGetFunction(void** fn, void* module, const char* name) {
  (void)module, (void)name;
  *fn = (void*)0x100;
  ++functions;
  return 0;
}
int cuFuncSetAttribute(void* fn, int attribute, int value) { (void)fn, (void)attribute, (void)value; return 0; }
int cuFuncGetAttribute(int* value, int attribute, void* fn) {
  (void)fn;
  *value = attribute == 1 ? static_smem : 0; /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES */
  return 0;
}
int cuCtxGetDevice(int* device) { *device = 0; return 0; }
int cuDeviceGetAttribute(int* value, int attribute, int device) {
  (void)device;
  *value = attribute == 97 ? optin_smem : 0; /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
  return 0;
}
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void* stream, void** params, void** extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream, (void)params,
      (void)extra;
  ++launches;
  return 0;
}
int cuGetErrorString(int error, const char** text) { (void)error; *text = "fake"; return 0; }
int cuStreamIsCapturing(void* stream, int* status) { (void)stream; *status = capturing; return 0; }
