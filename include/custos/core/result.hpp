// Result<T>: a value or a custos::Error. No exceptions cross a module boundary.
#pragma once

#include <boost/system/result.hpp>

#include "custos/core/error.hpp"

namespace custos {

// Required by boost::system::result::value() when it holds an Error; custos code never calls
// value() on an error (it checks first), so reaching this is a logic error and terminates.
[[noreturn]] void throw_exception_from_error(Error const& e, boost::source_location const& loc);

template <class T = void>
using Result = boost::system::result<T, Error>;

// Success for Result<void>.
inline Result<> ok() {
  return {};
}

}  // namespace custos

// CUSTOS_TRY(expr): evaluates to the value of a Result<T>, or returns its error from the
// enclosing function. CUSTOS_TRYV(expr): the same for Result<void>.
// Never use either in a forked child between clone3 and execve.
#define CUSTOS_TRY(expr)                                         \
  ({                                                             \
    auto&& custos_try_r_ = (expr);                               \
    if (!custos_try_r_) return std::move(custos_try_r_).error(); \
    std::move(*custos_try_r_);                                   \
  })

#define CUSTOS_TRYV(expr)                                          \
  do {                                                             \
    auto&& custos_tryv_r_ = (expr);                                \
    if (!custos_tryv_r_) return std::move(custos_tryv_r_).error(); \
  } while (0)
