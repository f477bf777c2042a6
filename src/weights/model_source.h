// Where a `-m` argument points: a checkpoint directory as given, or a Hugging Face repo id
// ("moonshotai/Kimi-Linear-48B-A3B-Instruct") found in the local Hugging Face cache, in the hub's layout
// `<cache>/models--org--name/snapshots/<revision>`, the revision read from `refs/main`. The cache is
// $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
// Nothing is ever downloaded: a miss is an error that says where it looked.
#pragma once

#include <string>

namespace hlm {

// The Hugging Face hub cache directory the environment selects.
std::string hf_hub_cache_dir();

// `arg` if it is a directory; else the cached snapshot of the repo id `arg`. Throws hlm::Error.
std::string resolve_model_dir(const std::string& arg);

}  // namespace hlm
