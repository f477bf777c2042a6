// Counter-based pseudo-random numbers shared by every backend: a value is a pure function of its key
// (seed, stream, counter or element index), so the CPU and CUDA backends draw the same numbers for the
// same sampling step or the same random weight without sharing any generator state. The mixer is
// SplitMix64's finalizer; a uniform float keeps 24 bits, so it is exact in fp32 and lies in [0, 1).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HLM_HOST_DEVICE __host__ __device__
#else
#define HLM_HOST_DEVICE
#endif

namespace hlm {

HLM_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

HLM_HOST_DEVICE inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  return mix64(mix64(mix64(a) ^ b) ^ c);
}

// Uniform in [0, 1) with 24 random bits.
HLM_HOST_DEVICE inline float uniform01(uint64_t a, uint64_t b, uint64_t c) {
  return static_cast<float>(hash3(a, b, c) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace hlm
