// Declaration header written for this project (see ../README.md); not Gloo's own header.
#pragma once

#include <chrono>

namespace gloo {

// Complete only because ProcessGroupGloo::setTimeout (an inline member of the c10d header) calls
// setTimeout on it. Declared, never defined or called here: the shim only holds contexts inside
// libtorch's objects.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
