// The FFI handler symbols the nanobind module exports, one per op and platform.
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* jax_flash_attention_forward_cpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_attention_backward_cpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_decode_cpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_kv_cache_update_cpu(XLA_FFI_CallFrame* call_frame);
#ifdef JAX_FLASH_WITH_CUDA
XLA_FFI_Error* jax_flash_attention_forward_cuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_attention_backward_cuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_attention_fp8_forward_cuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_decode_cuda(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jax_flash_kv_cache_update_cuda(XLA_FFI_CallFrame* call_frame);
#endif
}
