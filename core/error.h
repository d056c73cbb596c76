// qgrad::Error: every public op validates its arguments before it writes
// anything and throws this, naming the op and the argument at fault.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace qgrad {

class Error : public std::runtime_error {
 public:
  Error(std::string op, std::string arg, const std::string& what)
      : std::runtime_error(op + ": " + (arg.empty() ? std::string() : "argument '" + arg + "': ") + what),
        op_(std::move(op)),
        arg_(std::move(arg)) {}
  const std::string& op() const noexcept { return op_; }
  const std::string& arg() const noexcept { return arg_; }

 private:
  std::string op_;
  std::string arg_;
};

// Thrown when a device allocation fails even after the cache was released.
// The program may free tensors and continue.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream s;
  (s << ... << std::forward<Args>(args));
  return s.str();
}
}  // namespace detail

}  // namespace qgrad

// QGRAD_CHECK(cond, "op", "arg", message parts...): throws qgrad::Error.
#define QGRAD_CHECK(cond, op, arg, ...)                                  \
  do {                                                                   \
    if (!(cond)) throw ::qgrad::Error((op), (arg), ::qgrad::detail::concat(__VA_ARGS__)); \
  } while (0)
