// Shared bits of the weights tests: a fresh scratch directory per test, and catching the hlm::Error a
// malformed input must raise so its message can be checked for the file and tensor it names.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "base/error.h"

namespace hlm::test {

// HLM_SCRATCH_DIR/<name>, emptied.
inline std::string fresh_dir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(HLM_SCRATCH_DIR) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// The message of the hlm::Error `fn` throws; a test failure (and "") when it throws nothing.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an hlm::Error";
  return "";
}

}  // namespace hlm::test

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"
