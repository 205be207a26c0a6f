// The part of ATen these ops use, in place of <ATen/ATen.h>: tensors and their methods, the
// factory functions called (at::empty, at::empty_like, at::zeros_like), the AT_DISPATCH macros
// and at::parallel_for.
// Parsing <ATen/ATen.h> (every operator's declaration) took 16.0 s of g++ a translation unit
// here, these headers with <torch/library.h> 11.6 s (<torch/library.h> alone 9.0 s).
// A call of an at:: function this list lacks does not compile: add its <ATen/ops/NAME.h> here.
// TORCH_ASSERT_ONLY_METHOD_OPERATORS makes an include of <ATen/ATen.h> after this one a compile
// error instead of a silent slowdown (tests/kernels/test_cpp_build.py checks the sources for it).
#pragma once

#ifndef TORCH_ASSERT_ONLY_METHOD_OPERATORS
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
