// How much host memory this process can still take without swapping or the OOM killer: the kernel's
// MemAvailable estimate (free memory plus reclaimable page cache), which is what an allocation of that
// size can actually get. Used to refuse cache sizes that cannot fit before allocating them.
#pragma once

#include <cstdint>

namespace hlm {

// Bytes available for new allocations. Reads MemAvailable from /proc/meminfo; where that is missing,
// free physical pages from sysconf. HLM_HOST_MEMORY_BYTES overrides it (tests, or to leave headroom).
int64_t available_host_memory();

// Where that figure comes from, for messages: "HLM_HOST_MEMORY_BYTES" when it is set, else "MemAvailable".
const char* host_memory_source();

}  // namespace hlm
