// Errors of the shared launch logic: a plain std::runtime_error. Torch turns any std::exception out of
// a kernel into a Python RuntimeError, so both forms let it through, and the shared code needs neither
// c10::Error nor TORCH_CHECK (C++ symbols of one torch build, which the stable form must not use).
#ifndef FA_BINDING_CHECK_H_
#define FA_BINDING_CHECK_H_

#include <sstream>
#include <stdexcept>
#include <string>

namespace fa_binding {

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  message << "fa_attn: ";
  (message << ... << parts);
  throw std::runtime_error(message.str());
}

}  // namespace fa_binding

// A macro so that the message parts are only evaluated when the check fails.
#define FA_CHECK(cond, ...)              \
  do {                                   \
    if (!(cond)) {                       \
      ::fa_binding::fail(__VA_ARGS__);   \
    }                                    \
  } while (0)

#endif  // FA_BINDING_CHECK_H_
