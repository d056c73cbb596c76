// Shared by the libFuzzer harnesses: qgrad::Error is an expected outcome of
// bad input; any other exception escapes and libFuzzer reports it (as it
// does crashes, sanitizer findings, leaks and timeouts).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "qgrad/core/error.h"

namespace qgrad::fuzz {

template <class F>
void expect_ok_or_error(F&& f) {
  try {
    f();
  } catch (const qgrad::Error&) {
  }
}

// An anonymous in-memory file holding `data`; path() names it for readers
// that take a path (/proc/self/fd/N). Closed on destruction.
class MemFile {
 public:
  MemFile(const std::uint8_t* data, std::size_t size) : fd_(::memfd_create("qgrad-fuzz", 0)) {
    if (fd_ < 0) __builtin_trap();
    std::size_t done = 0;
    while (done < size) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) __builtin_trap();
      done += static_cast<std::size_t>(w);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace qgrad::fuzz
