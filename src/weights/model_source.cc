#include "weights/model_source.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "base/error.h"

namespace hlm {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The hub's repo id shape: "org/name" with letters, digits, '-', '_', '.'; no leading '.' or '-'.
bool is_repo_id(const std::string& s) {
  static const std::regex kRepoId(R"(^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$)");
  return std::regex_match(s, kRepoId) && s.find("..") == std::string::npos;
}

std::string trimmed_file(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string hf_hub_cache_dir() {
  if (!env("HF_HUB_CACHE").empty()) return env("HF_HUB_CACHE");
  if (!env("HF_HOME").empty()) return env("HF_HOME") + "/hub";
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/huggingface/hub";
  return env("HOME") + "/.cache/huggingface/hub";
}

std::string resolve_model_dir(const std::string& arg) {
  if (fs::is_directory(arg)) return arg;
  HLM_CHECK(is_repo_id(arg),
            "model directory '{}' not found (pass -m DIR, or a Hugging Face repo id such as "
            "moonshotai/Kimi-Linear-48B-A3B-Instruct that is in the local cache)",
            arg);
  const std::string cache = hf_hub_cache_dir();
  const std::string org = arg.substr(0, arg.find('/'));
  const std::string name = arg.substr(arg.find('/') + 1);
  const fs::path repo = fs::path(cache) / ("models--" + org + "--" + name);
  const std::string hint = fmt::format(
      "helixlm never downloads; fetch it first (e.g. `huggingface-cli download {}`), or set HF_HUB_CACHE / "
      "HF_HOME to the cache that holds it",
      arg);
  HLM_CHECK(fs::is_directory(repo),
            "model '{}' is neither a directory nor in the Hugging Face cache: {} not found. {}", arg,
            repo.string(), hint);
  const fs::path ref = repo / "refs" / "main";
  HLM_CHECK(fs::exists(ref), "model '{}': {} not found (the cache has no main revision of it). {}", arg,
            ref.string(), hint);
  const std::string revision = trimmed_file(ref);
  const fs::path snapshot = repo / "snapshots" / revision;
  HLM_CHECK(!revision.empty() && fs::is_directory(snapshot),
            "model '{}': refs/main names revision '{}' but {} is not a directory. {}", arg, revision,
            snapshot.string(), hint);
  return snapshot.string();
}

}  // namespace hlm
