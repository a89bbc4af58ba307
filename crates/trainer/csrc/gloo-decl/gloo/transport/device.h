// Declaration header written for this project (see ../../README.md); not Gloo's own header.
#pragma once

namespace gloo {
namespace transport {

// Only held through std::shared_ptr / std::unique_ptr by the c10d header.
class Device;
class UnboundBuffer;

}  // namespace transport
}  // namespace gloo
