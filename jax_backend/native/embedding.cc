// The engine's CPU embedding, forward and backward (jax_backend/native_embedding.py): each a
// JAX FFI custom call on a float32 table and int32/int64 indices. XLA's CPU compiler lowers
// the gather and the scatter-add with their bounds checks as about ten distinct kernels for a
// transformer's two embeddings (the index normalized, the rows gathered, a NaN fill fused into
// every consumer, the gradient's zeros, the checked indices, the scatter), each compiled on
// the step's first run; here each direction is one loop.
//
// The semantics are ops/indexing.py's lowerings: forward, jnp.take's (an index in [-rows, 0)
// counts from the end, any other outside [0, rows) gives a row of NaN); backward, an index
// outside [0, rows) or equal to padding_idx adds nothing, and each row of the gradient sums
// its contributions in the order of the indices (torch's CPU kernel's order), whichever
// thread computes it. Built per jaxlib by tools/build_native.py.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernel_support.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using cstorch_native::Blocks;
using cstorch_native::Indices;
using cstorch_native::IndicesOf;
using cstorch_native::RunBlocks;

ffi::Error Embedding(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> table, ffi::AnyBuffer indices,
                     ffi::Result<ffi::Buffer<ffi::F32>> out) {
  const auto dims = table.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("cstorch_embedding: a table of rows");
  const int64_t rows = dims[0];
  const int64_t width = rows == 0 ? 0 : static_cast<int64_t>(table.element_count()) / rows;
  const int64_t count = static_cast<int64_t>(indices.element_count());
  Indices index;
  if (!IndicesOf(indices, &index)) {
    return ffi::Error::InvalidArgument("cstorch_embedding: int32 or int64 indices");
  }
  if (static_cast<int64_t>(out->element_count()) != count * width) {
    return ffi::Error::InvalidArgument("cstorch_embedding: a row per index");
  }
  if (count == 0 || width == 0) return ffi::Error::Success();
  const float* t = table.typed_data();
  float* o = out->typed_data();
  const Blocks blocks(count, width);
  RunBlocks(pool, blocks.count, [=](int64_t b) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = blocks.begin(b), end = blocks.end(b, count); i < end; ++i) {
      int64_t k = index[i];
      if (k < 0 && k >= -rows) k += rows;  // counted from the end, as jnp.take
      float* dst = o + i * width;
      if (k < 0 || k >= rows) {
        std::fill(dst, dst + width, nan);
      } else {
        std::memcpy(dst, t + k * width, static_cast<size_t>(width) * sizeof(float));
      }
    }
  });
  return ffi::Error::Success();
}

ffi::Error EmbeddingBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> grad,
                             ffi::AnyBuffer indices, ffi::Result<ffi::Buffer<ffi::F32>> out,
                             int64_t padding_idx) {
  const auto dims = out->dimensions();
  if (dims.size() < 1) {
    return ffi::Error::InvalidArgument("cstorch_embedding_backward: a table of rows");
  }
  const int64_t rows = dims[0];
  const int64_t width = rows == 0 ? 0 : static_cast<int64_t>(out->element_count()) / rows;
  const int64_t count = static_cast<int64_t>(indices.element_count());
  Indices index;
  if (!IndicesOf(indices, &index)) {
    return ffi::Error::InvalidArgument("cstorch_embedding_backward: int32 or int64 indices");
  }
  if (static_cast<int64_t>(grad.element_count()) != count * width) {
    return ffi::Error::InvalidArgument("cstorch_embedding_backward: a gradient row per index");
  }
  if (rows == 0 || width == 0) return ffi::Error::Success();
  const float* g = grad.typed_data();
  float* o = out->typed_data();
  // Blocks of table rows: each scans every index in order and adds those in its rows, so a
  // row's sum is in index order whichever thread computes it.
  const Blocks blocks(rows, width);
  RunBlocks(pool, blocks.count, [=](int64_t b) {
    const int64_t first = blocks.begin(b), last = blocks.end(b, rows);
    std::fill(o + first * width, o + last * width, 0.0f);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t k = index[i];
      if (k < first || k >= last || k == padding_idx) continue;
      float* dst = o + k * width;
      const float* src = g + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] = dst[j] + src[j];
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchEmbedding, Embedding,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchEmbeddingBackward, EmbeddingBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("padding_idx"));
