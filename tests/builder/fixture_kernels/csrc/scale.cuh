// Test fixture: an included header, so the cache key must follow includes.
__device__ inline float fa_scale(float s) { return s * 2.0f; }
