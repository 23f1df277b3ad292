// The engine's CPU classification loss (jax_backend/native_loss.py): log-softmax over the last
// dim and the negative log-likelihood, forward and backward, each a JAX FFI custom call on
// float32 rows. XLA's CPU compiler splits log-softmax into a max, a sum of exponentials, a log
// and a subtraction, its backward into another reduction, and the NLL pick, its two sums and
// its gradient's one-hot into half a dozen small kernels: about ten distinct kernels for a
// classifier's loss, each compiled on the step's first run. Here each op is one loop nest, a
// row at a time.
//
// The maths is ops/reduction.py's and ops/nn.py's lowerings, operation by operation in float32
// (built with -ffp-contract=off): log_softmax(x) = (x - max) - log(sum(exp(x - max))); its
// backward g - exp(out) * sum(g); the NLL's rows as _nll_rows picks them (an ignored row adds
// nothing, a class outside [0, C) makes its row's loss and gradient NaN). Sums are in the order
// of torch's CPU kernels (a row's as ATen's 16-lane vector sum, the NLL's over rows as its
// cascade), each row on one thread: the same bits on every run whatever the threads, and the
// numbers eager torch shows where the terms agree. exp is a polynomial (as XLA's own): within
// 2 units in the last place of the exact value. Built per jaxlib by tools/build_native.py.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "kernel_support.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using cstorch_native::Blocks;
using cstorch_native::Fold;
using cstorch_native::Indices;
using cstorch_native::IndicesOf;
using cstorch_native::kLanes;
using cstorch_native::RunBlocks;

// exp(x) in float32 without a branch or a library call, so that loops of it vectorize: 2^n
// times a degree-6 polynomial of the remainder (Cephes' expf); 0 below the smallest normal,
// inf above the largest float, NaN for NaN.
inline float Exp(float x) {
  const float low = -87.33654f, high = 88.72283f;
  const float clamped = x == x ? std::min(std::max(x, low), high) : 0.0f;
  const float shift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (clamped * 1.44269504088896341f + shift) - shift;
  const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float inf = std::numeric_limits<float>::infinity();
  const float result = x < low ? 0.0f : (x > high ? inf : e * scale);
  return x == x ? result : x;
}

// The sum of a row in the order of torch's vectorized CPU kernels (ATen's map_reduce_all with
// 16 float lanes): a row shorter than the lanes in order; a longer one in 16 lane sums, the
// last partial vector added to the first lanes, then the lanes in a fixed tree (Fold).
inline float RowSum(const float* a, int64_t n) {
  if (n < kLanes) {
    float sum = n > 0 ? a[0] : 0.0f;
    for (int64_t j = 1; j < n; ++j) sum = sum + a[j];
    return sum;
  }
  const int64_t whole = n - n % kLanes;
  float lanes[kLanes];
  for (int k = 0; k < kLanes; ++k) lanes[k] = a[k];
  for (int64_t j = kLanes; j < whole; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) lanes[k] = lanes[k] + a[j + k];
  }
  for (int64_t j = whole; j < n; ++j) lanes[j - whole] = lanes[j - whole] + a[j];
  return Fold(lanes);
}

// Rows [begin, end) of log_softmax over rows of c elements. Each pass is a plain loop over the
// row (in the cache): the maximum, the exponentials into the result, their sum, the result.
// A NaN anywhere in a row makes its sum, so the whole row, NaN (as XLA's max does).
CSTORCH_VECTOR_CLONES
void LogSoftmaxRows(const float* x, int64_t c, int64_t begin, int64_t end, float* out) {
  const int64_t whole = c - c % kLanes;
  for (int64_t r = begin; r < end; ++r) {
    const float* row = x + r * c;
    float* o = out + r * c;
    float tops[kLanes];
    std::fill(tops, tops + kLanes, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < whole; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) tops[k] = std::max(tops[k], row[j + k]);
    }
    for (int64_t j = whole; j < c; ++j) tops[j - whole] = std::max(tops[j - whole], row[j]);
    float top = tops[0];
    for (int k = 1; k < kLanes; ++k) top = std::max(top, tops[k]);
    for (int64_t j = 0; j < c; ++j) o[j] = Exp(row[j] - top);
    const float log_sum = std::log(RowSum(o, c));
    for (int64_t j = 0; j < c; ++j) o[j] = (row[j] - top) - log_sum;
  }
}

// Rows [begin, end) of log_softmax's backward: g - exp(out) * sum(g).
CSTORCH_VECTOR_CLONES
void LogSoftmaxBackwardRows(const float* g, const float* out, int64_t c, int64_t begin,
                            int64_t end, float* dx) {
  for (int64_t r = begin; r < end; ++r) {
    const float *grow = g + r * c, *orow = out + r * c;
    const float sum = RowSum(grow, c);
    float* d = dx + r * c;
    for (int64_t j = 0; j < c; ++j) d[j] = grow[j] - Exp(orow[j]) * sum;
  }
}

int64_t RowLength(const ffi::Buffer<ffi::F32>& x) {
  const auto dims = x.dimensions();
  return dims.size() == 0 ? 1 : dims[dims.size() - 1];
}

ffi::Error LogSoftmax(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::Result<ffi::Buffer<ffi::F32>> out) {
  const int64_t c = RowLength(x), size = static_cast<int64_t>(x.element_count());
  if (static_cast<int64_t>(out->element_count()) != size) {
    return ffi::Error::InvalidArgument("cstorch_log_softmax: a result like the operand");
  }
  if (size == 0 || c == 0) return ffi::Error::Success();
  const int64_t rows = size / c;
  const float* xp = x.typed_data();
  float* op = out->typed_data();
  const Blocks blocks(rows, c);
  RunBlocks(pool, blocks.count, [=](int64_t i) {
    LogSoftmaxRows(xp, c, blocks.begin(i), blocks.end(i, rows), op);
  });
  return ffi::Error::Success();
}

ffi::Error LogSoftmaxBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> g,
                              ffi::Buffer<ffi::F32> out, ffi::Result<ffi::Buffer<ffi::F32>> dx) {
  const int64_t c = RowLength(out), size = static_cast<int64_t>(out.element_count());
  if (static_cast<int64_t>(g.element_count()) != size ||
      static_cast<int64_t>(dx->element_count()) != size) {
    return ffi::Error::InvalidArgument("cstorch_log_softmax_backward: operands unlike");
  }
  if (size == 0 || c == 0) return ffi::Error::Success();
  const int64_t rows = size / c;
  const float *gp = g.typed_data(), *op = out.typed_data();
  float* dp = dx->typed_data();
  const Blocks blocks(rows, c);
  RunBlocks(pool, blocks.count, [=](int64_t i) {
    LogSoftmaxBackwardRows(gp, op, c, blocks.begin(i), blocks.end(i, rows), dp);
  });
  return ffi::Error::Success();
}

// One row of the NLL as _nll_rows sees it: its picked class (0 where none), whether it counts,
// whether its class is out of range, and its class's weight (1 without weights).
struct Row {
  int64_t picked;
  bool counted, bad;
  float weight;
};

inline Row RowOf(const Indices& classes, int64_t i, int64_t c, int64_t ignore_index,
                 const float* weights) {
  const int64_t k = classes[i];
  Row row;
  row.counted = k != ignore_index;
  row.bad = row.counted && (k < 0 || k >= c);
  row.picked = row.counted && !row.bad ? k : 0;
  row.weight = weights == nullptr ? 1.0f : weights[row.picked];
  return row;
}

// The operands shared by the forward and the backward: [N, C] rows, N classes, the weights
// (an empty buffer: none).
struct NllOperands {
  int64_t rows, c;
  Indices classes;
  const float* weights;
};

ffi::Error NllOperandsOf(const char* name, const ffi::Buffer<ffi::F32>& x,
                         const ffi::AnyBuffer& target, const ffi::Buffer<ffi::F32>& weight,
                         NllOperands* out) {
  const auto dims = x.dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument(std::string(name) + ": [N, C] rows");
  out->rows = dims[0];
  out->c = dims[1];
  if (!IndicesOf(target, &out->classes) ||
      static_cast<int64_t>(target.element_count()) != out->rows) {
    return ffi::Error::InvalidArgument(std::string(name) + ": N int32 or int64 classes");
  }
  const int64_t weights = static_cast<int64_t>(weight.element_count());
  if (weights != 0 && weights != out->c) {
    return ffi::Error::InvalidArgument(std::string(name) + ": C class weights, or none");
  }
  out->weights = weights == 0 ? nullptr : weight.typed_data();
  return ffi::Error::Success();
}

// reduction: 1 mean, 2 sum (ops/nn.py's codes; "none" stays XLA's).
ffi::Error NllLoss(ffi::Buffer<ffi::F32> x, ffi::AnyBuffer target, ffi::Buffer<ffi::F32> weight,
                   ffi::Result<ffi::Buffer<ffi::F32>> loss,
                   ffi::Result<ffi::Buffer<ffi::F32>> total_weight, int64_t reduction,
                   int64_t ignore_index) {
  NllOperands in;
  if (auto error = NllOperandsOf("cstorch_nll_loss", x, target, weight, &in); error.failure()) {
    return error;
  }
  if (loss->element_count() != 1 || total_weight->element_count() != 1 ||
      (reduction != 1 && reduction != 2)) {
    return ffi::Error::InvalidArgument("cstorch_nll_loss: a mean or a sum");
  }
  // Summed as torch's CPU kernel sums them (a cascade of 8 partial sums, each level flushed
  // into the next every 2^level rows), so a loss reads as eager torch's does.
  constexpr int kLevels = 8;
  int64_t ceil_log2 = 0;
  while ((int64_t{1} << ceil_log2) < in.rows) ++ceil_log2;
  const int64_t level = std::max<int64_t>(4, ceil_log2 / kLevels);
  const int64_t mask = (int64_t{1} << level) - 1;
  float losses[kLevels] = {}, weights[kLevels] = {};
  const float* xp = x.typed_data();
  for (int64_t i = 0; i < in.rows; ++i) {
    const Row row = RowOf(in.classes, i, in.c, ignore_index, in.weights);
    if (!row.counted) continue;
    const float value = xp[i * in.c + row.picked] * row.weight;
    losses[0] = losses[0] + (row.bad ? std::numeric_limits<float>::quiet_NaN() : -value);
    weights[0] = weights[0] + row.weight;
    for (int j = 0; j + 1 < kLevels && (i & (mask << (j * level))) == 0; ++j) {
      losses[j + 1] = losses[j + 1] + losses[j];
      weights[j + 1] = weights[j + 1] + weights[j];
      losses[j] = weights[j] = 0.0f;
    }
  }
  float sum = 0.0f, total = 0.0f;
  for (int j = 0; j < kLevels; ++j) {
    sum = sum + losses[j];
    total = total + weights[j];
  }
  loss->typed_data()[0] = reduction == 1 ? sum / total : sum;
  total_weight->typed_data()[0] = total;
  return ffi::Error::Success();
}

ffi::Error NllLossBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> grad_output,
                           ffi::Buffer<ffi::F32> x, ffi::AnyBuffer target,
                           ffi::Buffer<ffi::F32> weight, ffi::Buffer<ffi::F32> total_weight,
                           ffi::Result<ffi::Buffer<ffi::F32>> dx, int64_t reduction,
                           int64_t ignore_index) {
  NllOperands in;
  if (auto error = NllOperandsOf("cstorch_nll_loss_backward", x, target, weight, &in);
      error.failure()) {
    return error;
  }
  if (grad_output.element_count() != 1 || total_weight.element_count() != 1 ||
      dx->element_count() != x.element_count() || (reduction != 1 && reduction != 2)) {
    return ffi::Error::InvalidArgument("cstorch_nll_loss_backward: a mean or a sum's gradient");
  }
  const float g0 = grad_output.typed_data()[0];
  const float g = reduction == 1 ? g0 / total_weight.typed_data()[0] : g0;
  float* dp = dx->typed_data();
  const NllOperands shared = in;
  const int64_t c = in.c;
  const Blocks blocks(in.rows, c);
  RunBlocks(pool, blocks.count, [=](int64_t b) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = blocks.begin(b), end = blocks.end(b, shared.rows); i < end; ++i) {
      const Row row = RowOf(shared.classes, i, c, ignore_index, shared.weights);
      float* d = dp + i * c;
      if (row.bad) {
        std::fill(d, d + c, nan);
        continue;
      }
      std::fill(d, d + c, 0.0f);
      if (row.counted) d[row.picked] = -(g * row.weight);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchLogSoftmax, LogSoftmax,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchLogSoftmaxBackward, LogSoftmaxBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchNllLoss, NllLoss,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("reduction")
                                  .Attr<int64_t>("ignore_index"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchNllLossBackward, NllLossBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("reduction")
                                  .Attr<int64_t>("ignore_index"));
