// Shared libraries opened at run time, per operating system: the CUDA driver, which the binding never
// links (cuda_driver.h says why), and torch's CUDA library, which `import torch` has already loaded.
// Linux: libcuda.so.1 and libtorch_cuda.so through dlopen. Windows: nvcuda.dll, from System32 only (a
// copy planted in the working directory or on PATH is never loaded), and torch_cuda.dll through
// LoadLibraryEx / GetModuleHandle. The Windows branch has not been built here with MSVC.
#ifndef FA_BINDING_DYNLIB_H_
#define FA_BINDING_DYNLIB_H_

#include <string>

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#endif

namespace fa_binding {
namespace dynlib {

#ifdef _WIN32
inline constexpr const char* kCudaDriver = "nvcuda.dll";
inline constexpr const char* kTorchCuda = "torch_cuda.dll";
inline constexpr const char* kDriverHint = "install the NVIDIA driver (it puts nvcuda.dll in System32)";

// The CUDA driver, or nullptr with the system's reason in `why`.
inline void* open_driver(std::string& why) {
  HMODULE lib = LoadLibraryExA(kCudaDriver, nullptr, LOAD_LIBRARY_SEARCH_SYSTEM32);
  if (lib == nullptr) {
    why = "Windows error " + std::to_string(GetLastError());
  }
  return reinterpret_cast<void*>(lib);
}

// A library this process has already loaded, or nullptr (never loads one).
inline void* loaded(const char* name) { return reinterpret_cast<void*>(GetModuleHandleA(name)); }

inline void* symbol(void* lib, const char* name) {
  return reinterpret_cast<void*>(GetProcAddress(reinterpret_cast<HMODULE>(lib), name));
}

// Windows has no process-wide symbol namespace: a symbol is looked up in a named module only.
inline void* any_loaded_symbol(const char*) { return nullptr; }
#else
inline constexpr const char* kCudaDriver = "libcuda.so.1";
inline constexpr const char* kTorchCuda = "libtorch_cuda.so";
inline constexpr const char* kDriverHint = "install the NVIDIA driver or check LD_LIBRARY_PATH";

inline void* open_driver(std::string& why) {
  void* lib = dlopen(kCudaDriver, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* text = dlerror();
    why = text ? text : "unknown error";
  }
  return lib;
}

inline void* loaded(const char* name) { return dlopen(name, RTLD_LAZY | RTLD_NOLOAD); }

inline void* symbol(void* lib, const char* name) { return dlsym(lib, name); }

inline void* any_loaded_symbol(const char* name) { return dlsym(RTLD_DEFAULT, name); }
#endif

}  // namespace dynlib
}  // namespace fa_binding

#endif  // FA_BINDING_DYNLIB_H_
