// kernels/binding/geometry.h for ctypes: the GPU kit's driver launcher (tests/gpu/kernel_launch.py) asks
// the binding's own launch geometry for every grid it launches, so the kit has no copy of it to drift.
// Statuses are geometry.h's Status, in order (0 ok, 1 empty, 2 no block size, 3 bad pairs, 4 too many).
#include <cstdint>

#include "geometry.h"

extern "C" {

// entry_launch: out = grid x, y, z (threads and shared memory are the entry's own).
int fa_geometry_entry(int threads, int block_m, int block_n, int grid, const FaParams* p, int64_t limit,
                      int64_t* out) {
  fa_geometry::Launch launch{};
  const fa_geometry::Status st = fa_geometry::entry_launch(threads, block_m, block_n, 0, grid, *p, limit, &launch);
  out[0] = launch.grid_x;
  out[1] = launch.grid_y;
  out[2] = launch.grid_z;
  return static_cast<int>(st);
}

// fold_batch_heads: out = y, z.
int fa_geometry_fold(int64_t batch, int64_t heads, int64_t limit, int64_t* out) {
  fa_geometry::PairGrid pairs{0, 0};
  const fa_geometry::Status st = fa_geometry::fold_batch_heads(batch, heads, limit, &pairs);
  out[0] = pairs.y;
  out[1] = pairs.z;
  return static_cast<int>(st);
}

}  // extern "C"
