// The engine's layout copy for XLA's CPU dots (jax_backend/ops/layout_copy.py): a JAX FFI
// custom call that writes the transpose of the last two dims of an array (of any batch) into
// its row-major result. XLA's CPU compiler turns its own transposes into layouts of their
// source, and its library dots refuse a half-precision left operand that is not row-major and
// contracted over its last dim (it widens such a dot to float32, at half the speed); a custom
// call's result is row-major and opaque to it. The same holds for a batched half dot whose
// operand is a transpose of its batch dims (attention's heads): cstorch_row_major_copy gives
// such an operand row-major. Built per jaxlib by tools/build_native.py.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

// The element-by-element transpose of the block [i0, i1) x [j0, j1) of src (rows x cols)
// into dst (cols x rows): the edges the vector kernels leave, and every other CPU.
template <typename T>
void TransposeBlock(const T* src, T* dst, int64_t rows, int64_t cols, int64_t i0, int64_t i1,
                    int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t i = i0; i < i1; ++i) dst[j * rows + i] = src[i * cols + j];
  }
}

#if defined(__SSE2__)
// 8x8 two-byte elements (src rows s[0..7], stride ss) into dst rows (stride ds), in registers.
inline void Transpose8x8(const uint16_t* s, int64_t ss, uint16_t* d, int64_t ds) {
  __m128i r[8], a[8], b[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k * ss));
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1)
    const __m128i* p = a + 4 * h;
    b[4 * h + 0] = _mm_unpacklo_epi32(p[0], p[2]);
    b[4 * h + 1] = _mm_unpackhi_epi32(p[0], p[2]);
    b[4 * h + 2] = _mm_unpacklo_epi32(p[1], p[3]);
    b[4 * h + 3] = _mm_unpackhi_epi32(p[1], p[3]);
  }
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k) * ds),
                     _mm_unpacklo_epi64(b[k], b[k + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * ds),
                     _mm_unpackhi_epi64(b[k], b[k + 4]));
  }
}

// 4x4 four-byte elements, likewise.
inline void Transpose4x4(const uint32_t* s, int64_t ss, uint32_t* d, int64_t ds) {
  __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(s));
  __m128 r1 = _mm_loadu_ps(reinterpret_cast<const float*>(s + ss));
  __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 2 * ss));
  __m128 r3 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 3 * ss));
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(reinterpret_cast<float*>(d), r0);
  _mm_storeu_ps(reinterpret_cast<float*>(d + ds), r1);
  _mm_storeu_ps(reinterpret_cast<float*>(d + 2 * ds), r2);
  _mm_storeu_ps(reinterpret_cast<float*>(d + 3 * ds), r3);
}

template <typename T>
struct Kernel;
template <>
struct Kernel<uint16_t> {
  static constexpr int64_t kSize = 8;
  static void Run(const uint16_t* s, int64_t ss, uint16_t* d, int64_t ds) {
    Transpose8x8(s, ss, d, ds);
  }
};
template <>
struct Kernel<uint32_t> {
  static constexpr int64_t kSize = 4;
  static void Run(const uint32_t* s, int64_t ss, uint32_t* d, int64_t ds) {
    Transpose4x4(s, ss, d, ds);
  }
};
#endif

// One matrix, in tiles of tile_i x tile_j source elements walked so that a tile's reads and
// writes stay in cache. With power-of-two strides the order matters (stores that alias in
// L1): a tall matrix goes down its columns first, a wide one along its rows (measured on
// 2048x256, 256x2048 and 2048x1024 bf16: 3-5x between the two orders).
template <typename T>
void TransposeMatrix(const T* src, T* dst, int64_t rows, int64_t cols) {
  const bool tall = rows >= cols;
  const int64_t tile_i = tall ? 256 : 32, tile_j = tall ? 16 : 32;
  for (int64_t j0 = 0; j0 < cols; j0 += tile_j) {
    const int64_t j1 = cols - j0 < tile_j ? cols : j0 + tile_j;
    for (int64_t i0 = 0; i0 < rows; i0 += tile_i) {
      const int64_t i1 = rows - i0 < tile_i ? rows : i0 + tile_i;
#if defined(__SSE2__)
      constexpr int64_t n = Kernel<T>::kSize;
      const int64_t i_end = i0 + (i1 - i0) / n * n, j_end = j0 + (j1 - j0) / n * n;
      if (tall) {
        for (int64_t j = j0; j < j_end; j += n) {
          for (int64_t i = i0; i < i_end; i += n) {
            Kernel<T>::Run(src + i * cols + j, cols, dst + j * rows + i, rows);
          }
        }
      } else {
        for (int64_t i = i0; i < i_end; i += n) {
          for (int64_t j = j0; j < j_end; j += n) {
            Kernel<T>::Run(src + i * cols + j, cols, dst + j * rows + i, rows);
          }
        }
      }
      TransposeBlock(src, dst, rows, cols, i_end, i1, j0, j1);  // the edges
      TransposeBlock(src, dst, rows, cols, i0, i_end, j_end, j1);
#else
      TransposeBlock(src, dst, rows, cols, i0, i1, j0, j1);
#endif
    }
  }
}

template <typename T>
void TransposeBatch(const void* src, void* dst, int64_t batch, int64_t rows, int64_t cols) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  for (int64_t b = 0; b < batch; ++b) {
    TransposeMatrix(s + b * rows * cols, d + b * rows * cols, rows, cols);
  }
}

ffi::Error SwapLastTwo(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const auto dims = x.dimensions();
  if (dims.size() < 2) {
    return ffi::Error::InvalidArgument("cstorch_swap_last_two: an operand of rank 2 or more");
  }
  const int64_t rows = dims[dims.size() - 2], cols = dims[dims.size() - 1];
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) batch *= dims[i];
  switch (ffi::ByteWidth(x.element_type())) {
    case 2:
      TransposeBatch<uint16_t>(x.untyped_data(), y->untyped_data(), batch, rows, cols);
      return ffi::Error::Success();
    case 4:
      TransposeBatch<uint32_t>(x.untyped_data(), y->untyped_data(), batch, rows, cols);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("cstorch_swap_last_two: 2- or 4-byte elements only");
  }
}

// x itself, as a row-major copy: XLA lays out a custom call's operand row-major (copying it
// there if it was a transpose's layout), and cannot see through the result.
ffi::Error RowMajorCopy(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (y->size_bytes() != x.size_bytes()) {
    return ffi::Error::InvalidArgument("cstorch_row_major_copy: a result of the operand's size");
  }
  std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchSwapLastTwo, SwapLastTwo,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchRowMajorCopy, RowMajorCopy,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());
