// The error convention of the workspace's C++ shims (crates/trainer/csrc, crates/gpt-model/csrc):
// every `extern "C"` function that can fail returns NULL on success or a `malloc`ed message, which
// its crate's free function releases; no C++ exception crosses into Rust. For `c10::Error` the
// message is `what_without_backtrace()`, so the Rust error stays one line.
//
// torch-build's `cpp_settings()` puts this directory on the include path of every shim.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace lssa_ffi {

// A `malloc`ed copy of `msg` (NULL only if malloc fails).
inline char* dup_message(const std::string& msg) {
  char* out = static_cast<char*>(std::malloc(msg.size() + 1));
  if (out != nullptr) std::memcpy(out, msg.c_str(), msg.size() + 1);
  return out;
}

// Runs `body`: NULL when it returns, the message of whatever it throws otherwise (`unknown` for a
// throw that is not a std::exception).
template <typename F>
char* guarded(F&& body, const char* unknown = "unknown C++ exception") {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_message(e.what());
  } catch (...) {
    return dup_message(unknown);
  }
}

}  // namespace lssa_ffi
