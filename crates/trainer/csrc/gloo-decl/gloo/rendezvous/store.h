// Declaration header written for this project (see ../../README.md); not Gloo's own header.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

// ProcessGroupGloo::GlooStore overrides the "v2" functions when this is defined.
#define GLOO_STORE_HAS_STORE_V2 1

namespace gloo {
namespace rendezvous {

// The base class of c10d's GlooStore adapter: the virtual functions it overrides, in declaration
// order. Declared, never defined here: the shim never creates a GlooStore (libtorch does, inside
// the ProcessGroupGloo constructor), so this TU emits no vtable for it.
class Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout);
  virtual bool has_v2_support();
  virtual std::vector<std::vector<char>> multi_get(const std::vector<std::string>& keys);
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<std::vector<char>>& values);
  virtual void append(const std::string& key, const std::vector<char>& data);
  virtual int64_t add(const std::string& key, int64_t value);
};

}  // namespace rendezvous
}  // namespace gloo
