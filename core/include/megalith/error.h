#pragma once
// The engine's exception family. Each derives from the std type that nanobind
// (and most C++ callers) already map to the right category, so the bindings
// need no glue: invalid_argument -> ValueError, type_error -> TypeError (one
// translator), out_of_memory -> MemoryError, error/cuda_error -> RuntimeError.
// Messages carry file:line of the check that fired.

#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "megalith/export.h"

namespace megalith {

/// A caller passed a value the engine cannot use (size, pointer, option).
class MEGALITH_API invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A caller passed a buffer of the wrong dtype.
class MEGALITH_API type_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// The engine failed at run time (a background error, an unsupported machine).
class MEGALITH_API error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A CUDA runtime call failed; the message holds the call and the CUDA error string.
class MEGALITH_API cuda_error : public error {
 public:
  using error::error;
};

/// An allocation failed; the message holds the bytes asked for and where.
class MEGALITH_API out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

namespace detail {
// [Note: no iostreams in error messages] Messages are built with plain string
// appends: formatting numbers through std::ostream goes through the global
// locale's facets, and in a process where another library swapped those (seen
// on one machine with torch loaded) building the message of an error crashed
// the interpreter instead of raising.
inline void append(std::string& out, std::string_view v) { out.append(v.data(), v.size()); }
inline void append(std::string& out, const char* v) { out.append(v ? v : "(null)"); }
inline void append(std::string& out, char v) { out.push_back(v); }
inline void append(std::string& out, bool v) { out.append(v ? "true" : "false"); }
template <typename T>
std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>>
append(std::string& out, T v) {
  out.append(std::to_string(v));
}
template <typename T>
std::enable_if_t<std::is_floating_point_v<T>> append(std::string& out, T v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  out.append(buf);
}
template <typename T>
std::enable_if_t<std::is_enum_v<T>> append(std::string& out, T v) {
  append(out, static_cast<std::underlying_type_t<T>>(v));
}
template <typename T>
void append(std::string& out, const T* v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(v));
  out.append(buf);
}

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (append(out, parts), ...);
  return out;
}
}  // namespace detail

}  // namespace megalith

#define MEGALITH_STRINGIFY_DETAIL(x) #x
#define MEGALITH_STRINGIFY(x) MEGALITH_STRINGIFY_DETAIL(x)
#define MEGALITH_WHERE __FILE__ ":" MEGALITH_STRINGIFY(__LINE__)

/// MEGALITH_EXPECTS(cond, exception_type, message parts...): throw with file:line
/// when cond is false. The message should say what was expected and what came.
#define MEGALITH_EXPECTS(cond, exception_type, ...)                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      throw exception_type(::megalith::detail::concat(__VA_ARGS__, " [" MEGALITH_WHERE \
                                                                   "]"));              \
    }                                                                                  \
  } while (0)

#define MEGALITH_FAIL(exception_type, ...) \
  throw exception_type(::megalith::detail::concat(__VA_ARGS__, " [" MEGALITH_WHERE "]"))
