// -m resolution: directories as given, Hugging Face repo ids in the hub cache layout (refs/main ->
// snapshots/<rev>), the environment variables that pick the cache, and misses that say where they looked.
#include "weights/model_source.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace hlm {
namespace {

namespace fs = std::filesystem;

class ModelSource : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(HLM_SCRATCH_DIR) / "hf_cache_test";
    fs::remove_all(root_);
    for (const char* v : {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"}) unsetenv(v);
  }
  void TearDown() override { fs::remove_all(root_); }
  // A cached repo with refs/main -> rev and the snapshot directory.
  fs::path cache_repo(const fs::path& cache, const std::string& folder, const std::string& rev) {
    const fs::path repo = cache / folder;
    fs::create_directories(repo / "refs");
    fs::create_directories(repo / "snapshots" / rev);
    std::ofstream(repo / "refs" / "main") << rev << "\n";
    return repo / "snapshots" / rev;
  }
  std::string error_of(const std::string& arg) {
    try {
      resolve_model_dir(arg);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path root_;
};

TEST_F(ModelSource, ADirectoryIsTakenAsGiven) {
  fs::create_directories(root_ / "org" / "name");
  EXPECT_EQ(resolve_model_dir((root_ / "org" / "name").string()), (root_ / "org" / "name").string());
}

TEST_F(ModelSource, ARepoIdResolvesToTheMainSnapshotOfTheHubCache) {
  const fs::path snap =
      cache_repo(root_ / "hub", "models--moonshotai--Kimi-Linear-48B-A3B-Instruct", "abc123");
  setenv("HF_HUB_CACHE", (root_ / "hub").c_str(), 1);
  EXPECT_EQ(resolve_model_dir("moonshotai/Kimi-Linear-48B-A3B-Instruct"), snap.string());
}

TEST_F(ModelSource, TheCacheComesFromHfHomeOrXdgWhenHfHubCacheIsUnset) {
  setenv("XDG_CACHE_HOME", (root_ / "xdg").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), (root_ / "xdg" / "huggingface" / "hub").string());
  setenv("HF_HOME", (root_ / "home").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), (root_ / "home").string() + "/hub");
  const fs::path snap = cache_repo(root_ / "home" / "hub", "models--org--tiny", "r1");
  EXPECT_EQ(resolve_model_dir("org/tiny"), snap.string());
  setenv("HF_HUB_CACHE", (root_ / "elsewhere").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), (root_ / "elsewhere").string());
}

TEST_F(ModelSource, MissesSayWhereTheyLookedAndNeverDownload) {
  setenv("HF_HUB_CACHE", (root_ / "hub").c_str(), 1);
  std::string e = error_of("moonshotai/Kimi-Linear-48B-A3B-Instruct");
  EXPECT_NE(e.find((root_ / "hub" / "models--moonshotai--Kimi-Linear-48B-A3B-Instruct").string()),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("never downloads"), std::string::npos) << e;

  // A repo folder without refs/main, and one whose revision has no snapshot.
  fs::create_directories(root_ / "hub" / "models--org--norefs" / "snapshots");
  e = error_of("org/norefs");
  EXPECT_NE(e.find("refs/main"), std::string::npos) << e;
  cache_repo(root_ / "hub", "models--org--gone", "r9");
  fs::remove_all(root_ / "hub" / "models--org--gone" / "snapshots" / "r9");
  e = error_of("org/gone");
  EXPECT_NE(e.find("r9"), std::string::npos) << e;

  // Not a repo id: a plain missing directory.
  e = error_of("/nonexistent/dir");
  EXPECT_NE(e.find("model directory '/nonexistent/dir' not found"), std::string::npos) << e;
  e = error_of("../up/../name");
  EXPECT_NE(e.find("not found"), std::string::npos) << e;
}

}  // namespace
}  // namespace hlm
