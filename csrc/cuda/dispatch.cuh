// Turns the runtime dtype and head_dim of a call into the compile-time element type and head-dim bucket the
// kernels are instantiated for.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../attention_params.h"

namespace jax_flash::cuda_kernels {

template <typename Element>
struct ElementTag {
  using type = Element;
};

template <int kMaxHeadDim>
using HeadDimBucket = std::integral_constant<int, kMaxHeadDim>;

// Calls launch(ElementTag<Element>{}, HeadDimBucket<kMaxHeadDim>{}) for the element type of `dtype` and the smallest
// bucket holding `head_dim`, and returns its result; cudaErrorInvalidValue when either has no instantiation.
template <typename Launch>
cudaError_t dispatch_element_and_head_dim(DType dtype, int64_t head_dim, Launch&& launch) {
  const auto with_bucket = [&](auto element) -> cudaError_t {
    if (head_dim <= 32) return launch(element, HeadDimBucket<32>{});
    if (head_dim <= 64) return launch(element, HeadDimBucket<64>{});
    if (head_dim <= 128) return launch(element, HeadDimBucket<128>{});
    if (head_dim <= 256) return launch(element, HeadDimBucket<256>{});
    return cudaErrorInvalidValue;
  };
  switch (dtype) {
    case DType::kFloat32:
      return with_bucket(ElementTag<float>{});
    case DType::kFloat16:
      return with_bucket(ElementTag<__half>{});
    case DType::kBFloat16:
      return with_bucket(ElementTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace jax_flash::cuda_kernels
