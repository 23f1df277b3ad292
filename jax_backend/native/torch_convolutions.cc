// torch's own CPU convolution kernels as JAX FFI custom calls (jax_backend/ops/torch_kernels.py,
// cpu_convolutions="native"): aten::convolution and aten::convolution_backward read XLA's
// operand buffers without a copy (at::from_blob), and each result is written into XLA's.
// The same kernels as eager torch (oneDNN where torch uses it), hence eager torch's numbers,
// called without the host callback's Python, GIL and array conversions (~2 ms a call on an
// MNIST-sized convolution). Built per jaxlib and torch by tools/build_native.py.
#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using Ints = ffi::Span<const int64_t>;

// float32 and bfloat16 are what the lowering hands over (it widens float16 to float32).
std::optional<at::ScalarType> TorchType(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32:
      return at::kFloat;
    case ffi::DataType::BF16:
      return at::kBFloat16;
    default:
      return std::nullopt;
  }
}

// The buffer as a contiguous torch tensor that does not own it.
at::Tensor Wrap(void* data, ffi::DataType type, Ints dims) {
  std::optional<at::ScalarType> dtype = TorchType(type);
  if (!dtype) throw std::invalid_argument("only float32 and bfloat16 buffers are supported");
  return at::from_blob(data, std::vector<int64_t>(dims.begin(), dims.end()),
                       at::TensorOptions().dtype(*dtype));
}

at::Tensor Wrap(const ffi::AnyBuffer& buffer) {
  return Wrap(buffer.untyped_data(), buffer.element_type(), buffer.dimensions());
}

std::vector<int64_t> Vector(Ints values) { return {values.begin(), values.end()}; }

// torch's message for an error (its own without the C++ backtrace), as an FFI error.
ffi::Error Failed(const char* op, const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  return ffi::Error::Internal(std::string("torch's ") + op + ": " +
                              (torch_error ? torch_error->what_without_backtrace()
                                           : error.what()));
}

ffi::Error Convolution(ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::RemainingArgs bias,
                       ffi::Result<ffi::AnyBuffer> out, Ints stride, Ints padding,
                       Ints dilation, bool transposed, Ints output_padding, int64_t groups) {
  try {
    c10::InferenceMode no_autograd;
    std::optional<at::Tensor> bias_tensor;
    if (bias.size() > 1) return ffi::Error::InvalidArgument("at most one bias operand");
    if (bias.size() == 1) {
      auto buffer = bias.get<ffi::AnyBuffer>(0);
      if (buffer.has_error()) return buffer.error();
      bias_tensor = Wrap(*buffer);
    }
    at::Tensor result = Wrap(*out);
    // A result of another shape would be resized, which a borrowed buffer refuses (an error).
    at::convolution_out(result, Wrap(x), Wrap(weight), bias_tensor, Vector(stride),
                        Vector(padding), Vector(dilation), transposed, Vector(output_padding),
                        groups);
    return ffi::Error::Success();
  } catch (const std::exception& error) {
    return Failed("convolution", error);
  }
}

// grads: the results output_mask asks for, in the order (input, weight, bias).
ffi::Error ConvolutionBackward(ffi::AnyBuffer grad_output, ffi::AnyBuffer x,
                               ffi::AnyBuffer weight, ffi::RemainingRets grads, Ints bias_sizes,
                               Ints stride, Ints padding, Ints dilation, bool transposed,
                               Ints output_padding, int64_t groups, Ints output_mask) {
  try {
    c10::InferenceMode no_autograd;
    if (output_mask.size() != 3) return ffi::Error::InvalidArgument("output_mask needs 3 flags");
    std::array<bool, 3> mask{output_mask[0] != 0, output_mask[1] != 0, output_mask[2] != 0};
    size_t wanted = mask[0] + mask[1] + mask[2];
    if (grads.size() != wanted) return ffi::Error::InvalidArgument("one result per mask flag");
    std::vector<int64_t> sizes = Vector(bias_sizes);
    auto computed = at::convolution_backward(
        Wrap(grad_output), Wrap(x), Wrap(weight),
        mask[2] ? at::OptionalIntArrayRef(sizes) : at::OptionalIntArrayRef(), Vector(stride),
        Vector(padding), Vector(dilation), transposed, Vector(output_padding), groups, mask);
    const at::Tensor* results[3] = {&std::get<0>(computed), &std::get<1>(computed),
                                    &std::get<2>(computed)};
    size_t next = 0;
    for (int i = 0; i < 3; ++i) {
      if (!mask[i]) continue;
      auto buffer = grads.get<ffi::AnyBuffer>(next++);
      if (buffer.has_error()) return buffer.error();
      Wrap(**buffer).copy_(*results[i]);
    }
    return ffi::Error::Success();
  } catch (const std::exception& error) {
    return Failed("convolution_backward", error);
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchTorchConvolution, Convolution,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // input
                                  .Arg<ffi::AnyBuffer>()  // weight
                                  .RemainingArgs()        // the bias, if any
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<Ints>("stride")
                                  .Attr<Ints>("padding")
                                  .Attr<Ints>("dilation")
                                  .Attr<bool>("transposed")
                                  .Attr<Ints>("output_padding")
                                  .Attr<int64_t>("groups"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CstorchTorchConvolutionBackward, ConvolutionBackward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // grad_output
                                  .Arg<ffi::AnyBuffer>()  // input
                                  .Arg<ffi::AnyBuffer>()  // weight
                                  .RemainingRets()
                                  .Attr<Ints>("bias_sizes")
                                  .Attr<Ints>("stride")
                                  .Attr<Ints>("padding")
                                  .Attr<Ints>("dilation")
                                  .Attr<bool>("transposed")
                                  .Attr<Ints>("output_padding")
                                  .Attr<int64_t>("groups")
                                  .Attr<Ints>("output_mask"));
