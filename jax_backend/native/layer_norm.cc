// The engine's CPU layer norm, forward and backward (jax_backend/native_layer_norm.py): each a
// JAX FFI custom call that normalizes a float32 array over its trailing elements, row by row,
// every row read once per pass while it sits in the cache. XLA's CPU compiler splits the same
// maths into a reduction per statistic and an elementwise kernel per result (about a dozen
// distinct kernels for a transformer's layer norms, each compiled on the step's first run,
// each a pass over the activations); here a row's statistics and results are one loop nest.
//
// The maths is ops/normalization.py's lowering, operation by operation in float32, each
// rounded on its own (built with -ffp-contract=off): only the order of a row's sums and of the
// weight and bias gradients' sums over rows differs (a fixed order, the same on every run
// whatever the threads). Built per jaxlib by tools/build_native.py.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernel_support.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using cstorch_native::Blocks;
using cstorch_native::Fold;
using cstorch_native::kLanes;
using cstorch_native::RunBlocks;

// Rows [begin, end) of the forward: y = (x - mean) * rstd * w + b, with mean and rstd.
CSTORCH_VECTOR_CLONES
void Forward(const float* x, const float* w, const float* b, float eps, int64_t d, int64_t begin,
             int64_t end, float* y, float* mean_out, float* rstd_out) {
  const int64_t whole = d - d % kLanes;
  for (int64_t r = begin; r < end; ++r) {
    const float* row = x + r * d;
    float lanes[kLanes] = {};
    for (int64_t j = 0; j < whole; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) lanes[k] = lanes[k] + row[j + k];
    }
    for (int64_t j = whole; j < d; ++j) lanes[j - whole] = lanes[j - whole] + row[j];
    const float mean = Fold(lanes) / static_cast<float>(d);
    float squares[kLanes] = {};
    for (int64_t j = 0; j < whole; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        const float c = row[j + k] - mean;
        squares[k] = squares[k] + c * c;
      }
    }
    for (int64_t j = whole; j < d; ++j) {
      const float c = row[j] - mean;
      squares[j - whole] = squares[j - whole] + c * c;
    }
    const float var = Fold(squares) / static_cast<float>(d);
    const float rstd = 1.0f / std::sqrt(var + eps);
    float* out = y + r * d;
    for (int64_t j = 0; j < d; ++j) out[j] = (row[j] - mean) * rstd * w[j] + b[j];
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// Rows [begin, end) of the backward: dx, and this block's sums of g * xhat and of g into
// dw_part and db_part (d each, overwritten).
CSTORCH_VECTOR_CLONES
void Backward(const float* g, const float* x, const float* mean, const float* rstd,
              const float* w, int64_t d, int64_t begin, int64_t end, float* dx, float* dw_part,
              float* db_part) {
  std::fill(dw_part, dw_part + d, 0.0f);
  std::fill(db_part, db_part + d, 0.0f);
  const int64_t whole = d - d % kLanes;
  const float n = static_cast<float>(d);
  for (int64_t r = begin; r < end; ++r) {
    const float *grow = g + r * d, *xrow = x + r * d;
    const float m = mean[r], s = rstd[r];
    float sum_gw[kLanes] = {}, sum_gwx[kLanes] = {};
    for (int64_t j = 0; j < whole; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) {
        const float xhat = (xrow[j + k] - m) * s;
        const float gw = grow[j + k] * w[j + k];
        sum_gw[k] = sum_gw[k] + gw;
        sum_gwx[k] = sum_gwx[k] + gw * xhat;
      }
    }
    for (int64_t j = whole; j < d; ++j) {
      const float xhat = (xrow[j] - m) * s;
      const float gw = grow[j] * w[j];
      sum_gw[j - whole] = sum_gw[j - whole] + gw;
      sum_gwx[j - whole] = sum_gwx[j - whole] + gw * xhat;
    }
    const float s1 = Fold(sum_gw), s2 = Fold(sum_gwx), scale = s / n;
    float* out = dx + r * d;
    for (int64_t j = 0; j < d; ++j) {
      const float xhat = (xrow[j] - m) * s;
      const float gw = grow[j] * w[j];
      out[j] = scale * (n * gw - s1 - xhat * s2);
      dw_part[j] = dw_part[j] + grow[j] * xhat;
      db_part[j] = db_part[j] + grow[j];
    }
  }
}

// The rows are split into blocks by their count alone (kernel_support.h): the weight and
// bias gradients are summed block by block in that order, whichever thread ran which block.
ffi::Error LayerNorm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                     ffi::Buffer<ffi::F32> b, ffi::Result<ffi::Buffer<ffi::F32>> y,
                     ffi::Result<ffi::Buffer<ffi::F32>> mean,
                     ffi::Result<ffi::Buffer<ffi::F32>> rstd, float eps) {
  const int64_t d = static_cast<int64_t>(w.element_count());
  const int64_t size = static_cast<int64_t>(x.element_count());
  if (d == 0 || size % d != 0 || static_cast<int64_t>(b.element_count()) != d ||
      static_cast<int64_t>(y->element_count()) != size) {
    return ffi::Error::InvalidArgument("cstorch_layer_norm: x, weight and bias do not match");
  }
  const int64_t rows = size / d;
  if (static_cast<int64_t>(mean->element_count()) != rows ||
      static_cast<int64_t>(rstd->element_count()) != rows) {
    return ffi::Error::InvalidArgument("cstorch_layer_norm: one mean and rstd per row");
  }
  const float *xp = x.typed_data(), *wp = w.typed_data(), *bp = b.typed_data();
  float *yp = y->typed_data(), *mp = mean->typed_data(), *rp = rstd->typed_data();
  const Blocks blocks(rows, d);
  RunBlocks(pool, blocks.count, [=](int64_t i) {
    Forward(xp, wp, bp, eps, d, blocks.begin(i), blocks.end(i, rows), yp, mp, rp);
  });
  return ffi::Error::Success();
}

ffi::Error LayerNormBackward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> g,
                             ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> mean,
                             ffi::Buffer<ffi::F32> rstd, ffi::Buffer<ffi::F32> w,
                             ffi::Result<ffi::Buffer<ffi::F32>> dx,
                             ffi::Result<ffi::Buffer<ffi::F32>> dw,
                             ffi::Result<ffi::Buffer<ffi::F32>> db) {
  const int64_t d = static_cast<int64_t>(w.element_count());
  const int64_t size = static_cast<int64_t>(x.element_count());
  if (d == 0 || size % d != 0 || static_cast<int64_t>(g.element_count()) != size ||
      static_cast<int64_t>(dx->element_count()) != size ||
      static_cast<int64_t>(dw->element_count()) != d ||
      static_cast<int64_t>(db->element_count()) != d) {
    return ffi::Error::InvalidArgument("cstorch_layer_norm_backward: shapes do not match");
  }
  const int64_t rows = size / d;
  if (static_cast<int64_t>(mean.element_count()) != rows ||
      static_cast<int64_t>(rstd.element_count()) != rows) {
    return ffi::Error::InvalidArgument("cstorch_layer_norm_backward: one mean and rstd per row");
  }
  const Blocks blocks(rows, d);
  std::vector<float> parts(static_cast<size_t>(2 * blocks.count * d));
  const float *gp = g.typed_data(), *xp = x.typed_data(), *mp = mean.typed_data(),
              *rp = rstd.typed_data(), *wp = w.typed_data();
  float *dxp = dx->typed_data(), *pp = parts.data();
  RunBlocks(pool, blocks.count, [=](int64_t i) {
    Backward(gp, xp, mp, rp, wp, d, blocks.begin(i), blocks.end(i, rows), dxp, pp + 2 * i * d,
             pp + (2 * i + 1) * d);
  });
  float *dwp = dw->typed_data(), *dbp = db->typed_data();
  std::fill(dwp, dwp + d, 0.0f);
  std::fill(dbp, dbp + d, 0.0f);
  for (int64_t i = 0; i < blocks.count; ++i) {  // in block order: the same sums every run
    const float *pw = pp + 2 * i * d, *pb = pp + (2 * i + 1) * d;
    for (int64_t j = 0; j < d; ++j) {
      dwp[j] = dwp[j] + pw[j];
      dbp[j] = dbp[j] + pb[j];
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchLayerNorm, LayerNorm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchLayerNormBackward, LayerNormBackward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
