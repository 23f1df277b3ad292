// The engine's fused CPU optimizer updates (jax_backend/native_optimizer.py): cstorch's Adam
// family (AdamBase: Adam, AdamW) and SGD over every parameter of a param group in one JAX FFI
// custom call each, each parameter's state and value read once and written in place. XLA's
// CPU compiler emits a kernel per result per distinct parameter shape for these updates (it
// fuses no kernel with several outputs; Adam's bias-correction powers add two per parameter)
// and compiles each distinct kernel separately: ~30 of a small transformer's ~80 distinct
// kernels.
//
// The maths is optimizers.adam_base's and optimizers.sgd's, operation by operation in
// float32, each operation rounded on its own (built with -ffp-contract=off, so no multiply-add
// is fused); the hyperparameters come in as float32 operands computed by the caller exactly
// as the JAX rule computes them. Built per jaxlib by tools/build_native.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The float32 hyperparameters operand, in this order (native_optimizer.HYPERPARAMETERS).
enum Hyper { kBeta1, kOneMinusBeta1, kBeta2, kOneMinusBeta2, kEps, kWeightDecay, kL2, kLr, kCount };

// One parameter's buffers: operands (read) and results (written; the same memory when XLA
// honours the call's aliases, so each element is read before it is written).
struct Param {
  const float *p, *g, *m, *v, *vmax;
  float *p_out, *m_out, *v_out, *vmax_out;
  float bias;  // sqrt(1 - beta2^t) / (1 - beta1^t), or 1 without bias correction
};

struct Options {
  bool amsgrad, correct_bias, l2;
};

// optimizers.adam_base's rule on elements [begin, end) of one parameter. (Without bias
// correction ``bias`` is 1, and u * 1 is u exactly.) Templated on the options so that each
// loop is branch-free and vectorized.
template <bool kAddL2, bool kAmsgrad>
void Update(const Param& t, const float* h, int64_t begin, int64_t end) {
  const float b1 = h[kBeta1], c1 = h[kOneMinusBeta1], b2 = h[kBeta2], c2 = h[kOneMinusBeta2];
  const float eps = h[kEps], wd = h[kWeightDecay], l2 = h[kL2], lr = h[kLr], bias = t.bias;
  const float *pp = t.p, *gp = t.g, *mp = t.m, *vp = t.v, *xp = t.vmax;
  float *po = t.p_out, *mo = t.m_out, *vo = t.v_out, *xo = t.vmax_out;
  // Each element is read, then written, at its own index only (in place when aliased).
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    const float p = pp[i];
    float g = gp[i];
    if (kAddL2) g = g + p * l2;
    const float m = mp[i] * b1 + g * c1;
    const float v = vp[i] * b2 + (g * g) * c2;
    float vhat = v;
    if (kAmsgrad) {
      const float a = xp[i];
      vhat = (a != a || a > v) ? a : v;  // jnp.maximum: NaN if either is
      xo[i] = vhat;
    }
    const float u = (m / (std::sqrt(vhat) + eps)) * bias + p * wd;
    mo[i] = m;
    vo[i] = v;
    po[i] = p + -(u * lr);
  }
}

void Update(const Param& t, const float* h, const Options& o, int64_t begin, int64_t end) {
  if (o.l2) {
    o.amsgrad ? Update<true, true>(t, h, begin, end) : Update<true, false>(t, h, begin, end);
  } else {
    o.amsgrad ? Update<false, true>(t, h, begin, end) : Update<false, false>(t, h, begin, end);
  }
}

constexpr int64_t kChunk = 1 << 15;  // elements: ~128 KiB of each of the four streams

// The chunks of all parameters, shared by the calling thread and the helpers it schedules
// on XLA's pool. A helper that starts after the last chunk was taken touches nothing; the
// caller returns only once every taken chunk is done, so no helper outlives the buffers.
template <typename P, typename O>
struct Job {
  std::vector<P> params;
  std::vector<int64_t> param_of, begin, end;
  const float* hyper;
  O options;
  std::atomic<size_t> next{0}, done{0};

  void Add(P param, int64_t n) {
    params.push_back(param);
    for (int64_t b = 0; b < n; b += kChunk) {
      param_of.push_back(static_cast<int64_t>(params.size()) - 1);
      begin.push_back(b);
      end.push_back(b + kChunk < n ? b + kChunk : n);
    }
  }

  void Work() {
    for (size_t c; (c = next.fetch_add(1)) < param_of.size();) {
      Update(params[param_of[c]], hyper, options, begin[c], end[c]);
      done.fetch_add(1, std::memory_order_release);
    }
  }

  // Runs every chunk: on this thread and up to the pool's other threads.
  static void Run(std::shared_ptr<Job> job, ffi::ThreadPool& pool) {
    const size_t chunks = job->param_of.size();
    const int64_t threads = pool.num_threads();
    const size_t helpers =
        chunks < 2 ? 0 : std::min<size_t>(chunks - 1, threads > 1 ? threads - 1 : 0);
    for (size_t h = 0; h < helpers; ++h) pool.Schedule([job] { job->Work(); });
    job->Work();
    while (job->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
  }
};

// The float32 buffer of an operand (nullopt: missing or another dtype).
std::optional<ffi::AnyBuffer> Float32(ffi::RemainingArgs& args, int64_t index) {
  auto a = args.get<ffi::AnyBuffer>(index);
  if (!a.has_value() || a->element_type() != ffi::F32) return std::nullopt;
  return *a;
}

// The data of a float32 result of `size` elements (nullopt: missing, another dtype or size).
std::optional<float*> Float32Result(ffi::RemainingRets& rets, int64_t index, int64_t size) {
  auto r = rets.get<ffi::AnyBuffer>(index);
  if (!r.has_value() || (*r)->element_type() != ffi::F32 ||
      static_cast<int64_t>((*r)->element_count()) != size) {
    return std::nullopt;
  }
  return static_cast<float*>((*r)->untyped_data());
}

ffi::Error AdamUpdate(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                      int64_t count, bool amsgrad, bool correct_bias, bool l2) {
  // Operands: p, g, m, v[, vmax][, beta1^t, beta2^t] per parameter, field by field, then the
  // hyperparameters. Results: p, m, v[, vmax][, beta1^t, beta2^t].
  const int64_t fields = 4 + (amsgrad ? 1 : 0) + (correct_bias ? 2 : 0);
  if (count < 0 || static_cast<int64_t>(args.size()) != fields * count + 1 ||
      static_cast<int64_t>(rets.size()) != (fields - 1) * count) {
    return ffi::Error::InvalidArgument("cstorch_adam_update: operands and results miscounted");
  }
  auto hyper = Float32(args, fields * count);
  if (!hyper.has_value() || hyper->element_count() != kCount) {
    return ffi::Error::InvalidArgument("cstorch_adam_update: float32 hyperparameters");
  }
  auto job = std::make_shared<Job<Param, Options>>();
  job->hyper = static_cast<const float*>(hyper->untyped_data());
  job->options = {amsgrad, correct_bias, l2};
  const int64_t power = 4 + (amsgrad ? 1 : 0);  // the field of beta1^t
  std::vector<std::tuple<const float*, const float*, float*, float*>> powers;
  for (int64_t i = 0; i < count; ++i) {
    const float* in[7] = {};
    float* out[6] = {};
    int64_t n = -1;
    for (int64_t f = 0; f < fields; ++f) {
      auto a = Float32(args, f * count + i);
      if (!a.has_value()) {
        return ffi::Error::InvalidArgument("cstorch_adam_update: float32 operands only");
      }
      const int64_t size = static_cast<int64_t>(a->element_count());
      if (f < power && n >= 0 && size != n) {
        return ffi::Error::InvalidArgument("cstorch_adam_update: a parameter's buffers differ");
      }
      if (f < power) n = size;
      if (f >= power && size != 1) {
        return ffi::Error::InvalidArgument("cstorch_adam_update: scalar powers only");
      }
      in[f] = static_cast<const float*>(a->untyped_data());
    }
    for (int64_t f = 0; f + 1 < fields; ++f) {
      auto r = Float32Result(rets, f * count + i, f < power - 1 ? n : 1);
      if (!r.has_value()) {
        return ffi::Error::InvalidArgument("cstorch_adam_update: results unlike the operands");
      }
      out[f] = *r;
    }
    Param t{};
    t.p = in[0], t.g = in[1], t.m = in[2], t.v = in[3];
    t.p_out = out[0], t.m_out = out[1], t.v_out = out[2];
    if (amsgrad) t.vmax = in[4], t.vmax_out = out[3];
    t.bias = 1.0f;
    if (correct_bias) {
      powers.push_back({in[power], in[power + 1], out[power - 1], out[power]});
      t.bias = std::sqrt(1.0f - in[power + 1][0]) / (1.0f - in[power][0]);
    }
    job->Add(t, n);
  }
  // Everything checked: only now is anything written (the results alias the operands).
  for (const auto& [b1p, b2p, b1p_out, b2p_out] : powers) {
    const float b1 = b1p[0], b2 = b2p[0];  // read before written
    b1p_out[0] = b1 * job->hyper[kBeta1];
    b2p_out[0] = b2 * job->hyper[kBeta2];
  }
  Job<Param, Options>::Run(job, pool);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------- SGD
// The float32 hyperparameters operand of SGD (native_optimizer.SGD_HYPERPARAMETERS).
enum SgdHyper { kMomentum, kOneMinusDampening, kSgdWeightDecay, kSgdLr, kSgdCount };

struct SgdParam {
  const float *p, *g, *buf;
  float *p_out, *buf_out;
};

struct SgdOptions {
  bool momentum, nesterov, maximize;
};

// optimizers.sgd's rule on elements [begin, end) of one parameter.
template <bool kMomentumOn, bool kNesterov, bool kMaximize>
void SgdUpdate(const SgdParam& t, const float* h, int64_t begin, int64_t end) {
  const float mu = h[kMomentum], keep = h[kOneMinusDampening], wd = h[kSgdWeightDecay];
  const float lr = h[kSgdLr];
  const float *pp = t.p, *gp = t.g, *bp = t.buf;
  float *po = t.p_out, *bo = t.buf_out;
  // Each element is read, then written, at its own index only (in place when aliased).
#pragma GCC ivdep
  for (int64_t i = begin; i < end; ++i) {
    const float p = pp[i];
    float g = (kMaximize ? -gp[i] : gp[i]) + p * wd;  // the coupled L2 term, always added
    if (kMomentumOn) {
      const float buf = bp[i] * mu + g * keep;
      bo[i] = buf;
      g = kNesterov ? g + buf * mu : buf;
    }
    po[i] = p + (-lr) * g;
  }
}

void Update(const SgdParam& t, const float* h, const SgdOptions& o, int64_t begin, int64_t end) {
  if (!o.momentum) {
    o.maximize ? SgdUpdate<false, false, true>(t, h, begin, end)
               : SgdUpdate<false, false, false>(t, h, begin, end);
  } else if (o.nesterov) {
    o.maximize ? SgdUpdate<true, true, true>(t, h, begin, end)
               : SgdUpdate<true, true, false>(t, h, begin, end);
  } else {
    o.maximize ? SgdUpdate<true, false, true>(t, h, begin, end)
               : SgdUpdate<true, false, false>(t, h, begin, end);
  }
}

ffi::Error SgdUpdateCall(ffi::ThreadPool pool, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         int64_t count, bool momentum, bool nesterov, bool maximize) {
  // Operands: p, g[, buf] per parameter, field by field, then the hyperparameters. Results:
  // p[, buf].
  const int64_t fields = momentum ? 3 : 2;
  if (count < 0 || static_cast<int64_t>(args.size()) != fields * count + 1 ||
      static_cast<int64_t>(rets.size()) != (fields - 1) * count) {
    return ffi::Error::InvalidArgument("cstorch_sgd_update: operands and results miscounted");
  }
  auto hyper = Float32(args, fields * count);
  if (!hyper.has_value() || hyper->element_count() != kSgdCount) {
    return ffi::Error::InvalidArgument("cstorch_sgd_update: float32 hyperparameters");
  }
  auto job = std::make_shared<Job<SgdParam, SgdOptions>>();
  job->hyper = static_cast<const float*>(hyper->untyped_data());
  job->options = {momentum, nesterov, maximize};
  for (int64_t i = 0; i < count; ++i) {
    const float* in[3] = {nullptr, nullptr, nullptr};
    float* out[2] = {nullptr, nullptr};
    int64_t n = -1;
    for (int64_t f = 0; f < fields; ++f) {
      auto a = Float32(args, f * count + i);
      if (!a.has_value() || (n >= 0 && static_cast<int64_t>(a->element_count()) != n)) {
        return ffi::Error::InvalidArgument("cstorch_sgd_update: float32 buffers of one size");
      }
      n = static_cast<int64_t>(a->element_count());
      in[f] = static_cast<const float*>(a->untyped_data());
    }
    for (int64_t f = 0; f + 1 < fields; ++f) {
      auto r = Float32Result(rets, f * count + i, n);
      if (!r.has_value()) {
        return ffi::Error::InvalidArgument("cstorch_sgd_update: results unlike the operands");
      }
      out[f] = *r;
    }
    job->Add(SgdParam{in[0], in[1], in[2], out[0], out[1]}, n);
  }
  Job<SgdParam, SgdOptions>::Run(job, pool);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchAdamUpdate, AdamUpdate,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("count")
                                  .Attr<bool>("amsgrad")
                                  .Attr<bool>("correct_bias")
                                  .Attr<bool>("l2"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchSgdUpdate, SgdUpdateCall,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("count")
                                  .Attr<bool>("momentum")
                                  .Attr<bool>("nesterov")
                                  .Attr<bool>("maximize"));
