// What the engine's row-wise FFI kernels share (layer_norm.cc, embedding.cc, loss.cc): work
// split into blocks run on XLA's intra-op thread pool, sums in a fixed order, integer index
// operands, and loops built for the CPU's widest vectors.
//
// How many blocks there are depends on the size of the work alone, never on the threads: a
// kernel that sums per block and then adds the blocks in order gets the same bits on every run.
#ifndef CSTORCH_NATIVE_KERNEL_SUPPORT_H_
#define CSTORCH_NATIVE_KERNEL_SUPPORT_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace cstorch_native {

constexpr int64_t kMaxBlocks = 64;
constexpr int64_t kMinBlockElements = 1 << 14;  // a block smaller than this is not worth a thread

// `items` of `width` elements each, split into `count` blocks of `per_block` items (the last
// may be shorter; no block is empty).
struct Blocks {
  int64_t count, per_block;
  Blocks(int64_t items, int64_t width) {
    const int64_t by_size =
        std::max<int64_t>(1, items * std::max<int64_t>(width, 1) / kMinBlockElements);
    const int64_t wanted = std::max<int64_t>(1, std::min({items, kMaxBlocks, by_size}));
    per_block = std::max<int64_t>(1, (items + wanted - 1) / wanted);
    count = (items + per_block - 1) / per_block;
  }
  int64_t begin(int64_t block) const { return block * per_block; }
  int64_t end(int64_t block, int64_t items) const {
    return std::min(items, (block + 1) * per_block);
  }
};

// Runs work(block) for every block in [0, blocks): on this thread and up to the pool's other
// threads. A helper that starts after the last block was taken touches nothing; the caller
// returns only once every taken block is done, so no helper outlives the buffers.
template <typename Work>
void RunBlocks(xla::ffi::ThreadPool& pool, int64_t blocks, Work work) {
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto loop = [shared, blocks, work] {
    for (int64_t i; (i = shared->next.fetch_add(1)) < blocks;) {
      work(i);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t threads = pool.num_threads();
  const int64_t helpers = blocks < 2 ? 0 : std::min<int64_t>(blocks - 1, threads - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([loop] { loop(); });
  loop();
  while (shared->done.load(std::memory_order_acquire) < blocks) std::this_thread::yield();
}

// Sums are kept in kLanes partial sums (vectorizable without reassociating anything the
// compiler sees), then added in a fixed tree.
constexpr int kLanes = 16;

inline float Fold(float* lanes) {
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) lanes[k] = lanes[k] + lanes[k + width];
  }
  return lanes[0];
}

// The index at position i of an int32 or int64 buffer.
struct Indices {
  const void* data;
  bool wide;
  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i]
                : static_cast<int64_t>(static_cast<const int32_t*>(data)[i]);
  }
};

// `buffer` as Indices (false: neither int32 nor int64).
inline bool IndicesOf(const xla::ffi::AnyBuffer& buffer, Indices* out) {
  if (buffer.element_type() == xla::ffi::DataType::S64) {
    *out = {buffer.untyped_data(), true};
  } else if (buffer.element_type() == xla::ffi::DataType::S32) {
    *out = {buffer.untyped_data(), false};
  } else {
    return false;
  }
  return true;
}

}  // namespace cstorch_native

// A row loop compiled for the CPU's widest vectors, picked when the library loads.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CSTORCH_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CSTORCH_VECTOR_CLONES
#endif

#endif  // CSTORCH_NATIVE_KERNEL_SUPPORT_H_
